package service_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"bulwark/pkg/job"
)

// fuzzAPI is one Bulwark (an API and a worker on the mock provider, over
// the test Redis and PostgreSQL) that a fuzz target sends its inputs to.
// It is set up once per fuzz target (once per fuzzing process), not per
// input. Its tenant token and provider keys are random, so that an answer
// that shows one has leaked it.
type fuzzAPI struct {
	s       *system
	api     *apiProc
	token   string
	secrets []string
	client  *http.Client
}

func newFuzzAPI(f *testing.F) *fuzzAPI {
	f.Helper()
	fa := &fuzzAPI{token: "fz-" + randomHex(16), client: &http.Client{Timeout: 30 * time.Second}}
	fa.secrets = []string{fa.token, adminToken, devToken, "other-token"}
	keys := "keys:\n"
	for _, k := range [][3]string{{"claude-sonnet-1", "claude", "sonnet"}, {"claude-haiku-1", "claude", "haiku"},
		{"openai-gpt4o-1", "openai", "gpt4o"}, {"openai-gpt4o-mini-1", "openai", "gpt4o-mini"}} {
		key := "sk-fz-" + randomHex(16)
		fa.secrets = append(fa.secrets, key)
		keys += fmt.Sprintf("  - {id: %s, provider: %s, model_tier: %s, api_key: %q, rpm_limit: 100000, tpm_limit: 100000000}\n",
			k[0], k[1], k[2], key)
	}
	fa.s = newSystem(f, opts{keysYML: keys, extraYML: "queue: {queue_max_depth: 100000}",
		tenantYML: fmt.Sprintf(`{name: fuzz, token: %q, max_priority: critical, rate_limit_rpm: -1, max_queued: -1, max_streams: -1, max_sync_waits: -1}`, fa.token)})
	fa.api = fa.s.startAPI()
	fa.s.startWorker()
	return fa
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// do sends one request and reads the whole answer.
func (fa *fuzzAPI) do(t testing.TB, method, path, token string, hdr http.Header, body []byte) (int, http.Header, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, fa.api.ts.URL+path, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range hdr {
		req.Header[k] = v
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := fa.client.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: read the answer: %v", method, path, err)
	}
	return resp.StatusCode, resp.Header, out
}

// resetLogs forgets the log lines of earlier inputs.
func (fa *fuzzAPI) resetLogs() {
	fa.s.logs.Reset()
}

// badLogs returns the log lines since resetLogs that no input may cause: a
// panic, an error, a write that PostgreSQL refused for its data (SQLSTATE
// class 22: a history row or cache entry lost; a slow write is not the
// input's fault), a replay that Redis refused.
func (fa *fuzzAPI) badLogs() []string {
	var bad []string
	for line := range strings.Lines(fa.s.logs.String()) {
		for _, mark := range []string{`"level":"ERROR"`, "panicked", "(SQLSTATE 22", "events: replay"} {
			if strings.Contains(line, mark) {
				bad = append(bad, strings.TrimSpace(line))
				break
			}
		}
	}
	return bad
}

// checkSecrets fails if an answer shows a secret that the request did not
// carry itself.
func (fa *fuzzAPI) checkSecrets(t *testing.T, sent []byte, hdr http.Header, body []byte) {
	t.Helper()
	var all bytes.Buffer
	all.Write(body)
	for k, vs := range hdr {
		fmt.Fprintf(&all, "\n%s: %s", k, strings.Join(vs, ", "))
	}
	for _, s := range fa.secrets {
		if bytes.Contains(all.Bytes(), []byte(s)) && !bytes.Contains(sent, []byte(s)) {
			t.Fatalf("the answer shows the secret %q:\n%s", s, all.Bytes())
		}
	}
}

// fuzzEndpoint is an endpoint that decodes a JSON body.
type fuzzEndpoint struct {
	name, path string
	admin      bool
	idPrefix   string // of a successful answer's id
}

var fuzzEndpoints = []fuzzEndpoint{
	{name: "async", path: "/v1/requests", idPrefix: "req_"},
	{name: "openai", path: "/v1/chat/completions", idPrefix: "chatcmpl-"},
	{name: "anthropic", path: "/v1/messages", idPrefix: "msg_"},
	{name: "responses", path: "/v1/responses", idPrefix: "resp_"},
	{name: "admin", path: "/admin/cache/invalidate", admin: true},
}

// FuzzAPIBody posts one fuzzed body, with fuzzed X-Bulwark-Priority,
// X-Bulwark-Cache and Idempotency-Key headers, to every endpoint that
// decodes a client's JSON: the async API, the OpenAI- (Chat Completions
// and Responses) and Anthropic-compatible endpoints and the admin cache
// invalidation, on a
// real API over Redis and PostgreSQL with a worker behind it. Every answer
// is below 500, in the endpoint's own format (an error names its cause in
// error.message), and shows no token or provider key; a request the async
// API accepts ends (its event stream sends the terminal event), and the
// history row of every request that ended says so; and no
// input makes the system log a panic, an error, a history or cache write
// that PostgreSQL refused for its data, or a replay that Redis refused
// (a NUL in a tool's name did: testdata/fuzz/FuzzAPIBody).
func FuzzAPIBody(f *testing.F) {
	fa := newFuzzAPI(f)
	for _, s := range []struct{ body, prio, cache, idem string }{
		{`{"provider":"claude","model_tier":"sonnet","messages":[{"role":"user","content":"why did OTA batch 42 fail?"}]}`, "", "", ""},
		{`{"provider":"openai","model_tier":"gpt4o-mini","priority":"high","case_id":"c-1","cache_layer":"router","system":"s","max_tokens":50,"temperature":0.2,"stop_sequences":["x"],"metadata":{"k":"v"},"cache_read":false,"messages":[{"role":"user","content":[{"type":"text","text":"a"}]},{"role":"assistant","content":[{"type":"tool_use","tool_use_id":"t1","tool_name":"f","input":{"q":1}}]},{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","text":"r"}]}],"tools":[{"name":"f","input_schema":{"type":"object"}}],"tool_choice":{"mode":"auto"}}`, "low", "no-store", "fz-k1"},
		{`{"model":"gpt-4o","messages":[{"role":"system","content":"s"},{"role":"user","content":"hello"}],"tools":[{"type":"function","function":{"name":"fetch_logs"}}]}`, "critical", "bypass", ""},
		{`{"model":"claude-sonnet","max_tokens":50,"stream":true,"messages":[{"role":"user","content":[{"type":"text","text":"hey"}]}]}`, "2", "", ""},
		{`{"model":"gpt-4o","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"s"}]}`, "", "no-read", ""},
		{`{"model":"gpt-4o","instructions":"s","input":[{"role":"user","content":"run fetch_logs"},{"type":"function_call","call_id":"c1","name":"fetch_logs","arguments":"{}"},{"type":"function_call_output","call_id":"c1","output":"ok"}],"tools":[{"type":"function","name":"fetch_logs"}],"stream":true}`, "", "bypass", ""},
		{`{"model":"gpt-4o","input":"hi","previous_response_id":"resp_1","store":true}`, "", "", ""},
		{`{"provider":"claude","model_tier":"sonnet","messages":[{"role":"user","content":"a\u0000b"}]}`, "", "", ""},
		{`{"provider":"claude","model_tier":"sonnet","priority":"urgent","messages":[{"role":"user","content":[{"type":"image"}]}]}`, "P9", "weird", ""},
		{`{"model":"claude-sonnet","max_tokens":1000000,"temperature":3,"messages":[{"role":"user","content":"x"}]}`, "", "", strings.Repeat("k", 300)},
		{`{"all":true}`, "", "", ""},
		{`{"case_id":"c-1"} {}`, "", "", ""},
		{"\xff\xfe", "", "", ""},
		{``, "", "", ""},
	} {
		f.Add([]byte(s.body), s.prio, s.cache, s.idem)
	}
	f.Fuzz(func(t *testing.T, body []byte, prio, cache, idem string) {
		fa.resetLogs()
		hdr := http.Header{}
		for k, v := range map[string]string{"X-Bulwark-Priority": prio, "X-Bulwark-Cache": cache, "Idempotency-Key": idem} {
			if v != "" && validHeaderValue(v) {
				hdr.Set(k, v)
			}
		}
		sent := append(append([]byte(nil), body...), []byte(prio+cache+idem)...)
		for _, ep := range fuzzEndpoints {
			token := fa.token
			if ep.admin {
				token = adminToken
			}
			status, rh, out := fa.do(t, http.MethodPost, ep.path, token, hdr, body)
			if status >= 500 {
				t.Fatalf("%s: %d %s\nlogs: %s", ep.name, status, out, strings.Join(fa.badLogs(), "\n"))
			}
			fa.checkSecrets(t, sent, rh, out)
			checkAnswer(t, ep, status, rh, out)
			switch id := rh.Get("X-Bulwark-Request-Id"); {
			case ep.name == "async" && status/100 == 2:
				fa.historyEnds(t, fa.followToEnd(t, out))
			case id != "" && status != http.StatusTooManyRequests: // a compat request that ended
				fa.historyEnds(t, id)
			}
		}
		if bad := fa.badLogs(); len(bad) > 0 {
			t.Fatalf("the system logged:\n%s", strings.Join(bad, "\n"))
		}
	})
}

// checkAnswer checks an answer's shape in the endpoint's format.
func checkAnswer(t *testing.T, ep fuzzEndpoint, status int, hdr http.Header, body []byte) {
	t.Helper()
	if status/100 == 2 && strings.HasPrefix(hdr.Get("Content-Type"), "text/event-stream") {
		if ep.name == "async" || ep.name == "admin" || !bytes.Contains(body, []byte("data: ")) {
			t.Fatalf("%s: a stream without events: %s", ep.name, body)
		}
		return
	}
	var out struct {
		Type  string `json:"type"`
		ID    string `json:"id"`
		Error *struct {
			Message string `json:"message"`
		} `json:"error"`
	}
	if err := json.Unmarshal(body, &out); err != nil {
		t.Fatalf("%s: %d, not JSON (%v): %s", ep.name, status, err, body)
	}
	switch {
	case status >= 400:
		if out.Error == nil || out.Error.Message == "" || ep.name == "anthropic" && out.Type != "error" {
			t.Fatalf("%s: %d without an error message in the endpoint's format: %s", ep.name, status, body)
		}
	case status/100 == 2 && ep.idPrefix != "":
		if !strings.HasPrefix(out.ID, ep.idPrefix) {
			t.Fatalf("%s: %d with id %q: %s", ep.name, status, out.ID, body)
		}
	}
}

// followToEnd reads an accepted request's event stream to its terminal
// event, and returns the request's id.
func (fa *fuzzAPI) followToEnd(t *testing.T, accepted []byte) string {
	t.Helper()
	var a struct{ ID string }
	if err := json.Unmarshal(accepted, &a); err != nil || a.ID == "" {
		t.Fatalf("accepted without an id: %s", accepted)
	}
	evs := fa.events(t, a.ID, "", "")
	if len(evs) == 0 || !terminalEvent(evs[len(evs)-1].Type) {
		t.Fatalf("request %s: the stream ended without a terminal event: %+v", a.ID, evs)
	}
	return a.ID
}

// historyEnds waits (10s at most) for the history row of an ended request
// to say how it ended. The row is written after the terminal event; one
// that PostgreSQL refuses stays as it was.
func (fa *fuzzAPI) historyEnds(t *testing.T, id string) {
	t.Helper()
	h := fa.s.workers[0].History
	deadline := time.Now().Add(10 * time.Second)
	for {
		row, err := h.Get(context.Background(), id)
		if err == nil && row.Status.Terminal() {
			return
		}
		if time.Now().After(deadline) {
			status := "none"
			if err == nil {
				status = string(row.Status)
			}
			t.Fatalf("request %s ended, but its history row says %s (%v) after 10s; the system logged:\n%s",
				id, status, err, strings.Join(fa.badLogs(), "\n"))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// events reads a request's whole event stream, which must end by itself
// (the request has ended, or ends within the timeout). last goes in the
// Last-Event-ID header, query in last_event_id.
func (fa *fuzzAPI) events(t testing.TB, id, last, query string) []sseEvent {
	t.Helper()
	code, _, evs, raw := fa.eventsStatus(t, id, last, query)
	if code != http.StatusOK {
		t.Fatalf("events of %s: %d %s", id, code, raw)
	}
	return evs
}

func (fa *fuzzAPI) eventsStatus(t testing.TB, id, last, query string) (int, http.Header, []sseEvent, []byte) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	u := fa.api.ts.URL + "/v1/requests/" + id + "/events"
	if query != "" {
		u += "?last_event_id=" + url.QueryEscape(query)
	}
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	req.Header.Set("Authorization", "Bearer "+fa.token)
	if last != "" {
		req.Header.Set("Last-Event-ID", last)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("events of %s: %v", id, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("events of %s: the stream did not end within 30s: %v\n%s", id, err, raw)
	}
	return resp.StatusCode, resp.Header, parseSSE(raw), raw
}

// parseSSE parses a whole event stream.
func parseSSE(raw []byte) []sseEvent {
	var out []sseEvent
	var ev sseEvent
	sc := bufio.NewScanner(bytes.NewReader(raw))
	sc.Buffer(nil, len(raw)+1)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
			if ev.Type != "" {
				out = append(out, ev)
			}
			ev = sseEvent{}
		case strings.HasPrefix(line, "id: "):
			ev.ID = line[4:]
		case strings.HasPrefix(line, "event: "):
			ev.Type = line[7:]
		case strings.HasPrefix(line, "data: "):
			_ = json.Unmarshal([]byte(line[6:]), &ev.Data)
		}
	}
	return out
}

func terminalEvent(typ string) bool {
	return typ == string(job.EventCompleted) || typ == string(job.EventFailed) || typ == string(job.EventCancelled)
}

// validHeaderValue reports whether net/http sends v as a header value
// (no control characters but tab).
func validHeaderValue(v string) bool {
	for i := 0; i < len(v); i++ {
		if c := v[i]; c < ' ' && c != '\t' || c == 0x7f {
			return false
		}
	}
	return true
}

// FuzzLastEventID reconnects to the event stream of a completed request
// with a fuzzed Last-Event-ID header (or last_event_id query parameter). An
// id that job.ValidEventID refuses is answered 400 invalid_last_event_id;
// any other id gets a stream that replays only the events after it, ends by
// itself with exactly one terminal event (the request's completion), and
// logs no replay that Redis refused.
func FuzzLastEventID(f *testing.F) {
	fa := newFuzzAPI(f)
	status, _, out := fa.do(f, http.MethodPost, "/v1/requests", fa.token, nil,
		[]byte(`{"provider":"claude","model_tier":"sonnet","cache_read":false,"messages":[{"role":"user","content":"reconnect"}]}`))
	var a struct{ ID string }
	if err := json.Unmarshal(out, &a); err != nil || status/100 != 2 {
		f.Fatalf("submit: %d %s", status, out)
	}
	var all []sseEvent
	for _, ev := range fa.events(f, a.ID, "", "") {
		if ev.ID != "" {
			all = append(all, ev)
		}
	}
	if len(all) < 2 || all[len(all)-1].Type != string(job.EventCompleted) {
		f.Fatalf("the request's events: %+v", all)
	}
	now := time.Now().UnixMilli()
	for _, s := range []string{
		"", "0-0", all[0].ID, all[len(all)-2].ID, all[len(all)-1].ID, strconv.FormatInt(now+30_000, 10) + "-0",
		strconv.FormatInt(now+3_600_000, 10) + "-0", "garbage", "12-x", "-", "1-", "18446744073709551615-0",
		"1-18446744073709551615", " 1-0 ", "1-0\n", "00001-0",
	} {
		f.Add(s, false)
		f.Add(s, true)
	}
	f.Fuzz(func(t *testing.T, id string, viaQuery bool) {
		fa.resetLogs()
		last, query := "", ""
		effective := id
		if viaQuery || !validHeaderValue(id) {
			query = id
		} else {
			// The server trims a header value.
			last, effective = id, strings.Trim(id, " \t")
		}
		before := effective == "" || job.ValidEventID(effective, time.Now())
		code, _, evs, raw := fa.eventsStatus(t, a.ID, last, query)
		after := effective == "" || job.ValidEventID(effective, time.Now())
		if before != after {
			return // the id came of age during the request
		}
		if !before {
			if code != http.StatusBadRequest || !bytes.Contains(raw, []byte("invalid_last_event_id")) {
				t.Fatalf("Last-Event-ID %q: %d %s, want 400 invalid_last_event_id", effective, code, raw)
			}
			return
		}
		if code != http.StatusOK {
			t.Fatalf("Last-Event-ID %q: %d %s, want 200", effective, code, raw)
		}
		terminals := 0
		prev := effective
		for _, ev := range evs {
			if terminalEvent(ev.Type) {
				terminals++
				if ev.Type != string(job.EventCompleted) {
					t.Fatalf("Last-Event-ID %q: terminal event %q, want completed", effective, ev.Type)
				}
			}
			if ev.ID == "" {
				continue
			}
			if prev != "" && job.CompareIDs(ev.ID, prev) <= 0 {
				t.Fatalf("Last-Event-ID %q: event %s replayed after %s", effective, ev.ID, prev)
			}
			prev = ev.ID
		}
		if terminals != 1 {
			t.Fatalf("Last-Event-ID %q: %d terminal events, want 1: %s", effective, terminals, raw)
		}
		if bad := fa.badLogs(); len(bad) > 0 {
			t.Fatalf("Last-Event-ID %q: the system logged:\n%s", effective, strings.Join(bad, "\n"))
		}
	})
}
