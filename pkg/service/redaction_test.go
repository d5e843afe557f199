package service_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"bulwark/pkg/testkit/mockprovider"
)

// providerSaid is a provider error message carrying what must not reach a
// tenant: an organisation id, a key fragment that does not look like
// sk-…, and an internal address.
const providerSaid = "model access denied for organization org-SECRET123 (key ab12cd34ef56ab12cd34ef56); redis at 10.0.0.7:6379"

// providerSecrets are the pieces of providerSaid no tenant may see, and
// that the operators' log carries only redacted.
var providerSecrets = []string{"org-SECRET123", "SECRET123", "ab12cd34ef56ab12cd34ef56", "10.0.0.7"}

// A provider's error text reaches no tenant, by any path: GET (live and,
// once the record expired, from history), the event stream (live and
// after reconnecting), the compat endpoints' error bodies, and the history
// row. The tenant reads a fixed text per code with the request id; the
// worker logs the provider's text once, redacted, with that id, and the
// record keeps it, redacted, for operators.
func TestProviderErrorTextReachesNoTenant(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name        string
		mode        mockprovider.FaultMode
		code        string // the request's job code
		compatCode  int    // the compat endpoints' status
		compatError string // and error code
	}{
		{"refused", mockprovider.FaultInvalidRequest, "provider_error", http.StatusBadRequest, "provider_rejected"},
		{"unavailable", mockprovider.FaultServerError, "provider_unavailable", http.StatusBadGateway, "upstream_failed"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := newSystem(t, opts{extraYML: "cache: {enabled: false}"})
			// One asynq retry after the first attempt's transient failures,
			// then provider_unavailable: seconds, not minutes.
			s.cfg.Worker.MaxAttempts = 1
			// Every call to either provider fails with the message.
			if err := s.mock.SetFault(mockprovider.Fault{Mode: tc.mode, Message: providerSaid}); err != nil {
				t.Fatal(err)
			}
			api := s.startAPI()
			s.startWorker()
			tenant := map[string]string{} // what the tenant saw, by path

			// The compat endpoints, in both dialects, at the same time as
			// the async request (each takes seconds to fail).
			compat := []struct {
				path, body string
				done       chan compatReply
			}{
				{"/v1/chat/completions", `{"model":"gpt-4o","messages":[{"role":"user","content":"leak test compat openai ` + tc.name + `"}]}`, nil},
				{"/v1/messages", `{"model":"claude-sonnet","max_tokens":64,"messages":[{"role":"user","content":"leak test compat anthropic ` + tc.name + `"}]}`, nil},
			}
			for i := range compat {
				c := &compat[i]
				c.done = make(chan compatReply, 1)
				go func() { c.done <- postCompat(api.ts.URL+c.path, c.body) }()
			}

			// The async API and its event stream.
			id, evs := api.run(t, ask("leak test "+tc.name))
			last := evs[len(evs)-1]
			if last.Type != "failed" || last.Data["code"] != tc.code || !containsStr(last.Data["error"], id) {
				t.Fatalf("terminal event %s %v, want failed with code %s naming %s", last.Type, last.Data, tc.code, id)
			}
			tenant["event stream"] = marshal(t, evs)
			// Reconnecting after the end replays from the stored events;
			// with the last id the stream says the ending again from the
			// record.
			replay, _ := stream(t, api.ts.URL+"/v1/requests/"+id+"/events", devToken, "")
			tenant["replayed stream"] = marshal(t, collect(t, replay, 5*time.Second))
			again, _ := stream(t, api.ts.URL+"/v1/requests/"+id+"/events", devToken, last.ID)
			tenant["reconnected stream"] = marshal(t, next(t, again, 5*time.Second, "failed"))

			code, out, _ := call(t, "GET", api.ts.URL+"/v1/requests/"+id, devToken, nil)
			if code != http.StatusOK || out["status"] != "failed" || !containsStr(out["error"], id) {
				t.Fatalf("GET: %d %v, want failed with an error naming %s", code, out, id)
			}
			tenant["GET"] = marshal(t, out)

			for _, c := range compat {
				var r compatReply
				select {
				case r = <-c.done:
				case <-time.After(30 * time.Second):
					t.Fatalf("POST %s: no answer", c.path)
				}
				if r.err != nil {
					t.Fatalf("POST %s: %v", c.path, r.err)
				}
				e, _ := r.body["error"].(map[string]any)
				kind := e["code"] // OpenAI's error.code
				if details, ok := e["details"].(map[string]any); ok {
					kind = details["error_code"] // Anthropic's error.details.error_code
				}
				if r.status != tc.compatCode || kind != tc.compatError || r.id == "" || !containsStr(e["message"], r.id) {
					t.Fatalf("POST %s: %d %s (request %q), want %d %s naming the request", c.path, r.status, r.raw, r.id, tc.compatCode, tc.compatError)
				}
				tenant["POST "+c.path] = r.raw
			}

			// The history row, then GET once the live record is gone.
			var status, rowJSON string
			waitFor(t, 10*time.Second, "the history row", func() bool {
				err := api.base.PG.QueryRow(t.Context(),
					"SELECT status, row_to_json(r)::text FROM requests r WHERE id = $1", id).Scan(&status, &rowJSON)
				return err == nil && status == "failed"
			})
			tenant["history row"] = rowJSON
			if err := api.base.Redis.Del(t.Context(), api.base.Jobs.RecordKey(id)).Err(); err != nil {
				t.Fatal(err)
			}
			code, out, _ = call(t, "GET", api.ts.URL+"/v1/requests/"+id, devToken, nil)
			if code != http.StatusOK || out["status"] != "failed" || !containsStr(out["error"], id) {
				t.Fatalf("GET from history: %d %v, want failed with an error naming %s", code, out, id)
			}
			tenant["GET from history"] = marshal(t, out)

			for path, text := range tenant {
				for _, leak := range append(providerSecrets, "model access denied", "[redacted]") {
					if strings.Contains(text, leak) {
						t.Errorf("%s shows the tenant %q: %s", path, leak, text)
					}
				}
			}

			// Operators: one failure line per request, with its id and the
			// provider's text redacted; nothing of the secrets anywhere in
			// the logs.
			var failures []map[string]any
			for _, l := range logLines(t, s) {
				if l["msg"] == "finish: request failed" && l["request_id"] == id {
					failures = append(failures, l)
				}
			}
			if len(failures) != 1 {
				t.Fatalf("%d failure log lines for %s, want 1", len(failures), id)
			}
			detail, _ := failures[0]["detail"].(string)
			if failures[0]["code"] != tc.code || !strings.Contains(detail, "model access denied for organization [redacted]") ||
				!strings.Contains(detail, "(key [redacted])") || !strings.Contains(detail, "redis at [redacted]") {
				t.Errorf("failure log line %v, want the code and the provider's text redacted", failures[0])
			}
			logs := s.logs.String()
			for _, leak := range providerSecrets {
				if strings.Contains(logs, leak) {
					t.Errorf("the logs carry %q", leak)
				}
			}
		})
	}
}

// The record of a failed request keeps the provider's text, redacted, in
// its Detail, which no tenant-facing view reads.
func TestFailedRecordKeepsRedactedDetail(t *testing.T) {
	t.Parallel()
	s := newSystem(t, opts{extraYML: "cache: {enabled: false}"})
	if err := s.mock.SetFault(mockprovider.Fault{Mode: mockprovider.FaultInvalidRequest, Message: providerSaid}); err != nil {
		t.Fatal(err)
	}
	api := s.startAPI()
	s.startWorker()
	id, _ := api.run(t, ask("detail test"))
	rec, err := api.base.Jobs.Get(t.Context(), id)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(rec.Detail, "model access denied for organization [redacted]") {
		t.Fatalf("record detail %q, want the provider's text redacted", rec.Detail)
	}
	for _, leak := range providerSecrets {
		if strings.Contains(rec.Detail, leak) || strings.Contains(rec.Reason, leak) {
			t.Errorf("record carries %q: reason %q, detail %q", leak, rec.Reason, rec.Detail)
		}
	}
	if !strings.Contains(rec.Reason, id) || strings.Contains(rec.Reason, "model access denied") {
		t.Errorf("record reason %q, want the fixed text naming %s", rec.Reason, id)
	}
}

// compatReply is a compat endpoint's answer.
type compatReply struct {
	status int
	id     string // X-Bulwark-Request-Id
	raw    string
	body   map[string]any
	err    error
}

// postCompat posts body to a compat endpoint with the dev token; unlike
// call it may run outside the test's goroutine.
func postCompat(url, body string) compatReply {
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		return compatReply{err: err}
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+devToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return compatReply{err: err}
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return compatReply{err: err}
	}
	r := compatReply{status: resp.StatusCode, id: resp.Header.Get("X-Bulwark-Request-Id"), raw: string(raw)}
	if err := json.Unmarshal(raw, &r.body); err != nil {
		r.err = fmt.Errorf("decode %s: %w", raw, err)
	}
	return r
}

func marshal(t testing.TB, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatalf("marshal: %v", err)
	}
	return string(b)
}
