package httpapi_test

// The client side of the tests: requests to the server, read whole or
// answered on a channel, and waits on what the fakes report.

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// reply is an HTTP answer, read whole.
type reply struct {
	code int
	hdr  http.Header
	body []byte
}

// json decodes the body as an object.
func (r reply) json(t *testing.T) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(r.body, &m); err != nil {
		t.Fatalf("body %q: %v", r.body, err)
	}
	return m
}

// errorOf is the async API's error type and field.
func (r reply) errorOf(t *testing.T) (typ, field string) {
	t.Helper()
	e, _ := r.json(t)["error"].(map[string]any)
	typ, _ = e["type"].(string)
	field, _ = e["field"].(string)
	return typ, field
}

// do sends a request; hdr are header name/value pairs.
func (s *server) do(t *testing.T, method, path, token, body string, hdr ...string) reply {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, s.url+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	return send(t, req)
}

func send(t *testing.T, req *http.Request) reply {
	t.Helper()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return reply{resp.StatusCode, resp.Header, b}
}

// submitBody is a valid POST /v1/requests body asking question.
func submitBody(question string) string {
	return fmt.Sprintf(`{"provider":"claude","model_tier":"sonnet","messages":[{"role":"user","content":%q}]}`, question)
}

// submit posts question for token's tenant and returns the accepted id.
func (s *server) submit(t *testing.T, token, question string) string {
	t.Helper()
	r := s.do(t, "POST", "/v1/requests", token, submitBody(question), "Accept-Language", "en")
	id, _ := r.json(t)["id"].(string)
	if r.code != http.StatusAccepted || id == "" {
		t.Fatalf("submit: %d %s", r.code, r.body)
	}
	return id
}

// enqueuedID waits for the next enqueued request.
func (s *server) enqueuedID(t *testing.T) string {
	t.Helper()
	select {
	case id := <-s.queue.enqueued:
		return id
	case <-time.After(10 * time.Second):
		t.Fatal("nothing was enqueued")
		return ""
	}
}

// awaitGet waits until the server reads id's record.
func (s *server) awaitGet(t *testing.T, id string) {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case got := <-s.jobs.gets:
			if got == id {
				return
			}
		case <-timeout:
			t.Fatalf("%s was never read", id)
		}
	}
}

// start sends a request from another goroutine; its reply arrives on the
// channel (code -1 and the error as body if it could not be sent).
func (s *server) start(method, path, token, body string, hdr ...string) <-chan reply {
	out := make(chan reply, 1)
	go func() {
		req, err := http.NewRequest(method, s.url+path, strings.NewReader(body))
		if err != nil {
			out <- reply{code: -1, body: []byte(err.Error())}
			return
		}
		req.Header.Set("Authorization", "Bearer "+token)
		for i := 0; i+1 < len(hdr); i += 2 {
			req.Header.Set(hdr[i], hdr[i+1])
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			out <- reply{code: -1, body: []byte(err.Error())}
			return
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			b = []byte(err.Error())
		}
		out <- reply{resp.StatusCode, resp.Header, b}
	}()
	return out
}

// wait returns the reply on c.
func wait(t *testing.T, c <-chan reply) reply {
	t.Helper()
	select {
	case r := <-c:
		if r.code == -1 {
			t.Fatalf("request failed: %s", r.body)
		}
		return r
	case <-time.After(10 * time.Second):
		t.Fatal("no answer within 10s")
		return reply{}
	}
}
