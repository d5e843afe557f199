package service_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"mime"
	"net/http"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"bulwark/pkg/httpapi"
	"bulwark/pkg/priority"
	"bulwark/pkg/queue"
	"bulwark/pkg/testkit/mockprovider"
)

// Every operation openapi.json describes is called on a real Bulwark (real
// Redis and PostgreSQL, mock providers), and every answer is checked
// against its description: the status is documented for the operation,
// the Content-Type is one it documents, every header it marks required is
// sent, and the body matches its schema: every required field present, no
// field where the schema says additionalProperties: false, types, enums and
// consts as described. Event streams are checked event by event against
// the schema x-sse-events gives their type. Successful requests are also
// checked against the documented request body.
func TestOpenAPIAgainstRealAnswers(t *testing.T) {
	t.Parallel()
	d := loadAPIDoc(t)
	s := newSystem(t, opts{})
	api := s.startAPI()
	s.startWorker()
	u := api.ts.URL
	tenant := []string{"Authorization", "Bearer " + devToken}
	admin := []string{"Authorization", "Bearer " + adminToken}
	withTenant := func(h ...string) []string { return append(slices.Clone(tenant), h...) }
	withAdmin := func(h ...string) []string { return append(slices.Clone(admin), h...) }

	// Health, readiness, metrics and the description itself.
	d.do(t, "GET /healthz", u+"/healthz", nil).want(t, 200)
	d.do(t, "GET /readyz", u+"/readyz", nil).want(t, 200)
	d.do(t, "GET /readyz", u+"/readyz", nil, admin...).want(t, 200)
	d.do(t, "GET /readyz", u+"/readyz", nil, tenant...).want(t, 401)
	d.do(t, "GET /metrics", u+"/metrics", nil, admin...).want(t, 200)
	d.do(t, "GET /metrics", u+"/metrics", nil).want(t, 401)
	if x := d.do(t, "GET /openapi.json", u+"/openapi.json", nil).want(t, 200); !bytes.Equal(x.raw, httpapi.OpenAPI()) {
		t.Error("GET /openapi.json does not serve httpapi.OpenAPI()")
	}

	// A request from submission to its result, its events, and an
	// idempotent resubmission answered at once.
	submit := ask("openapi: the whole way")
	idem := withTenant("Idempotency-Key", "openapi-1", "Accept-Language", "en")
	id := d.do(t, "POST /v1/requests", u+"/v1/requests", submit, idem...).want(t, 202).str(t, "id")
	evs := d.stream(t, "GET /v1/requests/{id}/events", u+"/v1/requests/"+id+"/events", tenant...)
	if ev := d.next(t, evs, "completed", "failed"); ev.typ != "completed" || ev.field("request_id") != id {
		t.Fatalf("ended %s: %s", ev.typ, ev.data)
	}
	d.drain(t, evs)
	d.do(t, "GET /v1/requests/{id}", u+"/v1/requests/"+id, nil, tenant...).want(t, 200)
	if again := d.do(t, "POST /v1/requests", u+"/v1/requests", submit, idem...).want(t, 200); again.str(t, "id") != id {
		t.Errorf("idempotent resubmission answered %s, want %s", again.str(t, "id"), id)
	}

	// A tool call: the result carries its blocks.
	tools := map[string]any{"provider": "claude", "model_tier": "sonnet", "priority": "HIGH", "cache_read": false,
		"tools":    []map[string]any{{"name": "fetch_logs", "input_schema": map[string]any{"type": "object"}}},
		"messages": []map[string]any{{"role": "user", "content": "run fetch_logs"}}}
	id = d.do(t, "POST /v1/requests", u+"/v1/requests", tools, tenant...).want(t, 202).str(t, "id")
	evs = d.stream(t, "GET /v1/requests/{id}/events", u+"/v1/requests/"+id+"/events", tenant...)
	d.next(t, evs, "completed")
	d.drain(t, evs)
	if x := d.do(t, "GET /v1/requests/{id}", u+"/v1/requests/"+id, nil, tenant...).want(t, 200); !strings.Contains(string(x.raw), `"tool_use"`) {
		t.Errorf("tool call answer without a tool_use block: %s", x.raw)
	}

	// A queued request: its view and position, its stream, cancelled.
	insp := s.inspector()
	if err := insp.PauseQueue(queue.Name(priority.Low)); err != nil {
		t.Fatal(err)
	}
	low := ask("openapi: wait in line")
	low["priority"], low["cache_read"] = "low", false
	id = d.do(t, "POST /v1/requests", u+"/v1/requests", low, tenant...).want(t, 202).str(t, "id")
	if x := d.do(t, "GET /v1/requests/{id}", u+"/v1/requests/"+id, nil, tenant...).want(t, 200); x.field("queue_position") == nil {
		t.Errorf("a queued request without queue_position: %s", x.raw)
	}
	evs = d.stream(t, "GET /v1/requests/{id}/events", u+"/v1/requests/"+id+"/events", withTenant("Accept-Language", "en")...)
	if ev := d.next(t, evs, "queued"); ev.id == "" {
		t.Errorf("the first queued event is the stored one, with an id: %+v", ev)
	}
	if ev := d.next(t, evs, "queued"); ev.id != "" || ev.field("queue_position") == nil {
		t.Errorf("the second queued event is a position update, without an id: %+v", ev)
	}
	d.do(t, "DELETE /v1/requests/{id}", u+"/v1/requests/"+id, nil, tenant...).want(t, 200)
	d.next(t, evs, "cancelled")
	d.drain(t, evs)
	d.do(t, "DELETE /v1/requests/{id}", u+"/v1/requests/"+id, nil, tenant...).want(t, 409)
	d.do(t, "GET /v1/requests/{id}", u+"/v1/requests/"+id, nil, tenant...).want(t, 200)
	evs = d.stream(t, "GET /v1/requests/{id}/events", u+"/v1/requests/"+id+"/events", tenant...)
	d.next(t, evs, "cancelled")
	d.drain(t, evs)
	if err := insp.UnpauseQueue(queue.Name(priority.Low)); err != nil {
		t.Fatal(err)
	}

	// The async API's errors.
	d.do(t, "POST /v1/requests", u+"/v1/requests", ask("x")).want(t, 401)
	d.do(t, "POST /v1/requests", u+"/v1/requests", `{"provider": "claude",`, tenant...).want(t, 400)
	d.do(t, "POST /v1/requests", u+"/v1/requests", map[string]any{"provider": "claude", "model_tier": "opus",
		"messages": []map[string]any{{"role": "user", "content": "x"}}}, tenant...).want(t, 404)
	bad := ask("x")
	bad["priority"] = "urgent"
	d.do(t, "POST /v1/requests", u+"/v1/requests", bad, tenant...).want(t, 422)
	d.do(t, "GET /v1/requests/{id}", u+"/v1/requests/req_nope", nil, tenant...).want(t, 404)
	d.do(t, "GET /v1/requests/{id}", u+"/v1/requests/req_nope", nil).want(t, 401)
	d.do(t, "DELETE /v1/requests/{id}", u+"/v1/requests/req_nope", nil, tenant...).want(t, 404)
	d.do(t, "GET /v1/requests/{id}/events", u+"/v1/requests/"+id+"/events", nil, withTenant("Last-Event-ID", "garbage")...).want(t, 400)
	d.do(t, "GET /v1/requests/{id}/events", u+"/v1/requests/req_nope/events", nil, tenant...).want(t, 404)

	// OpenAI-compatible: plain, tool call, streamed (with usage), errors.
	chat := func(prompt string, extra map[string]any) map[string]any {
		b := map[string]any{"model": "gpt-4o", "messages": []map[string]any{{"role": "user", "content": prompt}}}
		for k, v := range extra {
			b[k] = v
		}
		return b
	}
	oaTools := []map[string]any{{"type": "function", "function": map[string]any{"name": "fetch_logs"}}}
	d.do(t, "POST /v1/chat/completions", u+"/v1/chat/completions", chat("openapi: chat", nil), tenant...).want(t, 200)
	d.do(t, "POST /v1/chat/completions", u+"/v1/chat/completions", chat("run fetch_logs", map[string]any{"tools": oaTools}), tenant...).want(t, 200)
	d.do(t, "POST /v1/chat/completions", u+"/v1/chat/completions",
		chat("openapi: chat stream", map[string]any{"stream": true, "stream_options": map[string]any{"include_usage": true}}), tenant...).
		want(t, 200).events(t, "message")
	d.do(t, "POST /v1/chat/completions", u+"/v1/chat/completions",
		chat("run fetch_logs", map[string]any{"stream": true, "tools": oaTools, "max_tokens": 64}), withTenant("X-Bulwark-Cache", "bypass")...).
		want(t, 200).events(t, "message")
	d.do(t, "POST /v1/chat/completions", u+"/v1/chat/completions", chat("x", map[string]any{"model": "gpt-9"}), tenant...).want(t, 404)
	d.do(t, "POST /v1/chat/completions", u+"/v1/chat/completions", `{"model":`, tenant...).want(t, 400)
	d.do(t, "POST /v1/chat/completions", u+"/v1/chat/completions", chat("x", nil), withTenant("X-Bulwark-Cache", "sometimes")...).want(t, 400)
	d.do(t, "POST /v1/chat/completions", u+"/v1/chat/completions", chat("x", nil)).want(t, 401)

	// OpenAI Responses: plain, tool call, streamed (text, tool call), errors.
	respIn := func(input any, extra map[string]any) map[string]any {
		b := map[string]any{"model": "gpt-4o", "input": input}
		for k, v := range extra {
			b[k] = v
		}
		return b
	}
	rsTools := []map[string]any{{"type": "function", "name": "fetch_logs", "parameters": map[string]any{"type": "object"}}}
	d.do(t, "POST /v1/responses", u+"/v1/responses", respIn("openapi: response", map[string]any{"instructions": "be brief"}), tenant...).want(t, 200)
	d.do(t, "POST /v1/responses", u+"/v1/responses", respIn("run fetch_logs", map[string]any{"tools": rsTools}), tenant...).want(t, 200)
	d.do(t, "POST /v1/responses", u+"/v1/responses", respIn([]map[string]any{
		{"role": "user", "content": "run fetch_logs"},
		{"type": "function_call", "call_id": "call_1", "name": "fetch_logs", "arguments": "{}"},
		{"type": "function_call_output", "call_id": "call_1", "output": "ok"}}, map[string]any{"tools": rsTools}), tenant...).want(t, 200)
	d.do(t, "POST /v1/responses", u+"/v1/responses", respIn("openapi: response stream", map[string]any{"stream": true}), tenant...).
		want(t, 200).events(t, "response.created", "response.in_progress", "response.output_item.added", "response.content_part.added",
		"response.output_text.delta", "response.output_text.done", "response.content_part.done", "response.output_item.done", "response.completed")
	d.do(t, "POST /v1/responses", u+"/v1/responses", respIn("run fetch_logs", map[string]any{"stream": true, "tools": rsTools, "max_output_tokens": 64}),
		withTenant("X-Bulwark-Cache", "bypass")...).
		want(t, 200).events(t, "response.function_call_arguments.delta", "response.function_call_arguments.done", "response.completed")
	d.do(t, "POST /v1/responses", u+"/v1/responses", respIn("x", map[string]any{"model": "gpt-9"}), tenant...).want(t, 404)
	d.do(t, "POST /v1/responses", u+"/v1/responses", respIn("x", map[string]any{"previous_response_id": "resp_1"}), tenant...).want(t, 400)
	d.do(t, "POST /v1/responses", u+"/v1/responses", respIn("x", nil)).want(t, 401)

	// Anthropic-compatible, with the token in x-api-key as its SDK sends it.
	key := []string{"x-api-key", devToken}
	msg := func(prompt string, extra map[string]any) map[string]any {
		b := map[string]any{"model": "claude-sonnet", "max_tokens": 64, "messages": []map[string]any{{"role": "user", "content": prompt}}}
		for k, v := range extra {
			b[k] = v
		}
		return b
	}
	anTools := []map[string]any{{"name": "fetch_logs", "input_schema": map[string]any{"type": "object"}}}
	d.do(t, "POST /v1/messages", u+"/v1/messages", msg("openapi: message", map[string]any{"system": "be brief"}), key...).want(t, 200)
	d.do(t, "POST /v1/messages", u+"/v1/messages", msg("run fetch_logs", map[string]any{"tools": anTools}), key...).want(t, 200)
	d.do(t, "POST /v1/messages", u+"/v1/messages", msg("openapi: message stream", map[string]any{"stream": true}), key...).
		want(t, 200).events(t, "message_start", "ping", "content_block_start", "content_block_delta", "content_block_stop", "message_delta", "message_stop")
	d.do(t, "POST /v1/messages", u+"/v1/messages", msg("run fetch_logs", map[string]any{"stream": true, "tools": anTools}),
		append(slices.Clone(key), "X-Bulwark-Priority", "P2")...).want(t, 200).events(t, "content_block_delta")
	d.do(t, "POST /v1/messages", u+"/v1/messages", msg("x", map[string]any{"model": "claude-opus-9"}), key...).want(t, 404)
	d.do(t, "POST /v1/messages", u+"/v1/messages", map[string]any{"model": "claude-sonnet", "messages": []map[string]any{{"role": "user", "content": "x"}}}, key...).want(t, 400)
	d.do(t, "POST /v1/messages", u+"/v1/messages", msg("x", nil)).want(t, 401)

	// Model names, in each dialect (Anthropic's when anthropic-version is
	// sent), and Anthropic's token count.
	anV := append(slices.Clone(key), "anthropic-version", "2023-06-01")
	d.do(t, "GET /v1/models", u+"/v1/models", nil, tenant...).want(t, 200)
	d.do(t, "GET /v1/models", u+"/v1/models?limit=2", nil, anV...).want(t, 200)
	d.do(t, "GET /v1/models", u+"/v1/models?limit=0", nil, anV...).want(t, 400)
	d.do(t, "GET /v1/models", u+"/v1/models", nil).want(t, 401)
	d.do(t, "GET /v1/models", u+"/v1/models", nil, "anthropic-version", "2023-06-01").want(t, 401)
	d.do(t, "GET /v1/models/{id}", u+"/v1/models/claude%2Fsonnet", nil, tenant...).want(t, 200)
	d.do(t, "GET /v1/models/{id}", u+"/v1/models/gpt-4o", nil, anV...).want(t, 200)
	d.do(t, "GET /v1/models/{id}", u+"/v1/models/gpt-9", nil, tenant...).want(t, 404)
	d.do(t, "GET /v1/models/{id}", u+"/v1/models/gpt-9", nil, anV...).want(t, 404)
	d.do(t, "GET /v1/models/{id}", u+"/v1/models/gpt-4o", nil).want(t, 401)
	count := func(model, lastRole string) map[string]any {
		return map[string]any{"model": model, "system": "be brief", "messages": []map[string]any{{"role": lastRole, "content": "how many?"}}}
	}
	d.do(t, "POST /v1/messages/count_tokens", u+"/v1/messages/count_tokens", count("claude-sonnet", "user"), anV...).want(t, 200)
	d.do(t, "POST /v1/messages/count_tokens", u+"/v1/messages/count_tokens", count("claude-sonnet", "assistant"), anV...).want(t, 400)
	d.do(t, "POST /v1/messages/count_tokens", u+"/v1/messages/count_tokens", count("claude-opus-9", "user"), anV...).want(t, 404)
	d.do(t, "POST /v1/messages/count_tokens", u+"/v1/messages/count_tokens", strings.Repeat("x", 2<<20), anV...).want(t, 413)
	d.do(t, "POST /v1/messages/count_tokens", u+"/v1/messages/count_tokens", count("claude-sonnet", "user")).want(t, 401)
	// Above the model's maximum: each provider's own 400.
	d.do(t, "POST /v1/messages", u+"/v1/messages", msg("x", map[string]any{"max_tokens": 64_001}), key...).want(t, 400)
	d.do(t, "POST /v1/chat/completions", u+"/v1/chat/completions", chat("x", map[string]any{"max_tokens": 16_385}), tenant...).want(t, 400)
	d.do(t, "POST /v1/responses", u+"/v1/responses", respIn("x", map[string]any{"max_output_tokens": 16_385}), tenant...).want(t, 400)

	// Admin: reads, writes and their refusals.
	d.do(t, "GET /admin/keys", u+"/admin/keys", nil, admin...).want(t, 200)
	d.do(t, "GET /admin/keys", u+"/admin/keys", nil, tenant...).want(t, 401)
	d.do(t, "POST /admin/keys/{id}/disable", u+"/admin/keys/claude-haiku-1/disable?reason=openapi", nil, admin...).want(t, 200)
	if x := d.do(t, "GET /admin/keys", u+"/admin/keys", nil, admin...).want(t, 200); !strings.Contains(string(x.raw), `"disabled_reason":"openapi"`) {
		t.Errorf("disabled key without its reason: %s", x.raw)
	}
	d.do(t, "POST /admin/keys/{id}/enable", u+"/admin/keys/claude-haiku-1/enable", nil, admin...).want(t, 200)
	d.do(t, "POST /admin/keys/{id}/enable", u+"/admin/keys/no-such-key/enable", nil, admin...).want(t, 404)
	d.do(t, "POST /admin/keys/{id}/disable", u+"/admin/keys/claude-haiku-1/disable", nil, withAdmin("Content-Type", "text/plain")...).want(t, 415)
	d.do(t, "GET /admin/breakers", u+"/admin/breakers", nil, admin...).want(t, 200)
	d.do(t, "POST /admin/breakers/{name}/reset", u+"/admin/breakers/all/reset", nil, admin...).want(t, 200)
	d.do(t, "POST /admin/breakers/{name}/reset", u+"/admin/breakers/claude%2Fsonnet/reset", nil, admin...).want(t, 200)
	d.do(t, "POST /admin/breakers/{name}/reset", u+"/admin/breakers/all/reset", nil, withAdmin("Origin", "https://elsewhere.example")...).want(t, 403)
	d.do(t, "POST /admin/cache/invalidate", u+"/admin/cache/invalidate", map[string]any{"tenant": "demo", "case_id": "ota-42"}, admin...).want(t, 200)
	d.do(t, "POST /admin/cache/invalidate", u+"/admin/cache/invalidate", map[string]any{"all": true}, admin...).want(t, 200)
	d.do(t, "POST /admin/cache/invalidate", u+"/admin/cache/invalidate", map[string]any{}, admin...).want(t, 422)
	d.do(t, "POST /admin/cache/invalidate", u+"/admin/cache/invalidate", `{"everything": true}`, admin...).want(t, 400)
	d.do(t, "GET /admin/report", u+"/admin/report", nil, admin...).want(t, 200)
	d.do(t, "GET /admin/report", u+"/admin/report?from=yesterday", nil, admin...).want(t, 400)
	d.do(t, "GET /admin/queues", u+"/admin/queues", nil, "Authorization", "Basic "+basic("operator", adminToken)).want(t, 200)
	d.do(t, "GET /admin/queues", u+"/admin/queues", nil).want(t, 401)

	// Claude out of capacity: the request retries on its other key and falls
	// back to OpenAI, which streams retrying and fallback events.
	if err := s.mock.SetFault(mockprovider.Fault{Provider: "claude", Mode: mockprovider.FaultRateLimit, RetryAfter: 30 * time.Second}); err != nil {
		t.Fatal(err)
	}
	fb := ask("openapi: fall back")
	fb["cache_read"] = false
	fb["max_tokens"] = 64_000 // above gpt-4o's: the result says it was clamped
	id = d.do(t, "POST /v1/requests", u+"/v1/requests", fb, tenant...).want(t, 202).str(t, "id")
	evs = d.stream(t, "GET /v1/requests/{id}/events", u+"/v1/requests/"+id+"/events", tenant...)
	d.next(t, evs, "fallback")
	d.next(t, evs, "completed")
	d.drain(t, evs)
	if x := d.do(t, "GET /v1/requests/{id}", u+"/v1/requests/"+id, nil, tenant...).want(t, 200); !strings.Contains(string(x.raw), `"max_tokens_clamped":{"from":64000,"to":16384}`) {
		t.Errorf("a clamped fallback's result: %s", x.raw)
	}
	s.mock.ClearFaults()

	d.everyOperationCalled(t)
}

func basic(user, pass string) string {
	req, _ := http.NewRequest("GET", "/", nil)
	req.SetBasicAuth(user, pass)
	return strings.TrimPrefix(req.Header.Get("Authorization"), "Basic ")
}

// apiDoc is openapi.json, and what of it a test exercised.
type apiDoc struct {
	doc map[string]any
	mu  sync.Mutex
	// seen holds the statuses each operation ("METHOD /path") answered.
	seen map[string][]int
}

func loadAPIDoc(t *testing.T) *apiDoc {
	t.Helper()
	d := &apiDoc{seen: map[string][]int{}}
	if err := decodeNumbers(httpapi.OpenAPI(), &d.doc); err != nil {
		t.Fatalf("openapi.json: %v", err)
	}
	return d
}

func decodeNumbers(raw []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if dec.More() {
		return fmt.Errorf("data after the JSON value")
	}
	return nil
}

// pointer resolves a local JSON pointer.
func (d *apiDoc) pointer(ref string) (map[string]any, bool) {
	rest, ok := strings.CutPrefix(ref, "#/")
	if !ok {
		return nil, false
	}
	var cur any = d.doc
	for _, tok := range strings.Split(rest, "/") {
		tok = strings.ReplaceAll(strings.ReplaceAll(tok, "~1", "/"), "~0", "~")
		m, _ := cur.(map[string]any)
		if cur, ok = m[tok]; !ok {
			return nil, false
		}
	}
	m, ok := cur.(map[string]any)
	return m, ok
}

// resolve follows the $ref of a response, header or parameter object.
func (d *apiDoc) resolve(t *testing.T, v any) map[string]any {
	t.Helper()
	m, _ := v.(map[string]any)
	for m != nil {
		ref, ok := m["$ref"].(string)
		if !ok {
			break
		}
		if m, ok = d.pointer(ref); !ok {
			t.Fatalf("unresolved $ref %s", ref)
		}
	}
	return m
}

// operation is the description of op, "METHOD /path".
func (d *apiDoc) operation(t *testing.T, op string) map[string]any {
	t.Helper()
	method, path, _ := strings.Cut(op, " ")
	paths, _ := d.doc["paths"].(map[string]any)
	item, _ := paths[path].(map[string]any)
	o, ok := item[strings.ToLower(method)].(map[string]any)
	if !ok {
		t.Fatalf("openapi.json does not describe %s", op)
	}
	return o
}

// answer is a real answer, checked.
type answer struct {
	op     string
	status int
	hdr    http.Header
	raw    []byte
	body   any // the JSON body, nil otherwise
	sse    []sseMsg
}

// do sends a request for op to url and checks the answer. body is nil, a
// string sent as is, or a value sent as JSON; hdr are header name/value
// pairs (Content-Type is application/json unless one says otherwise).
func (d *apiDoc) do(t *testing.T, op, url string, body any, hdr ...string) *answer {
	t.Helper()
	method, _, _ := strings.Cut(op, " ")
	sent := encodeBody(t, body)
	resp, raw := send(t, method, url, sent, hdr...)
	a := &answer{op: op, status: resp.StatusCode, hdr: resp.Header, raw: raw}
	media := d.checkAnswer(t, op, resp)
	switch mediaType(resp) {
	case "application/json":
		if err := decodeNumbers(raw, &a.body); err != nil {
			t.Errorf("%s %d: body is not JSON: %v: %.300s", op, a.status, err, raw)
			break
		}
		d.check(t, fmt.Sprintf("%s %d", op, a.status), media["schema"], a.body)
	case "text/event-stream":
		for m := range readSSE(bytes.NewReader(raw)) {
			d.checkEvent(t, op, media, m)
			a.sse = append(a.sse, m)
		}
	}
	// What the test sent successfully fits the documented request body.
	if a.status < 300 && len(sent) > 0 {
		if rb := d.resolve(t, d.operation(t, op)["requestBody"]); rb != nil {
			var v any
			if err := decodeNumbers(sent, &v); err == nil {
				schema, _ := rb["content"].(map[string]any)["application/json"].(map[string]any)
				d.check(t, op+" request body", schema["schema"], v)
			}
		}
	}
	return a
}

// checkAnswer checks an answer's status, headers and Content-Type against
// op and returns the media type object that describes its body.
func (d *apiDoc) checkAnswer(t *testing.T, op string, resp *http.Response) map[string]any {
	t.Helper()
	d.mu.Lock()
	d.seen[op] = append(d.seen[op], resp.StatusCode)
	d.mu.Unlock()
	resps, _ := d.operation(t, op)["responses"].(map[string]any)
	r := d.resolve(t, resps[strconv.Itoa(resp.StatusCode)])
	if r == nil {
		t.Errorf("%s answered %d, which openapi.json does not document", op, resp.StatusCode)
		return nil
	}
	hdrs, _ := r["headers"].(map[string]any)
	for name, h := range hdrs {
		hd := d.resolve(t, h)
		v := resp.Header.Get(name)
		if v == "" {
			// A streamed answer that waited sends these as trailers (its
			// headers went out before the answer); send read the body.
			v = resp.Trailer.Get(name)
		}
		if v == "" {
			if hd["required"] == true {
				t.Errorf("%s %d: no %s header", op, resp.StatusCode, name)
			}
			continue
		}
		var hv any = v
		if _, err := strconv.Atoi(v); err == nil {
			hv = json.Number(v)
		}
		d.check(t, fmt.Sprintf("%s %d header %s", op, resp.StatusCode, name), hd["schema"], hv)
	}
	content, _ := r["content"].(map[string]any)
	mt := mediaType(resp)
	media, ok := content[mt].(map[string]any)
	if !ok && (len(content) > 0 || resp.ContentLength != 0) {
		t.Errorf("%s %d: Content-Type %q, openapi.json says one of %v", op, resp.StatusCode, resp.Header.Get("Content-Type"), keys(content))
	}
	return media
}

func mediaType(resp *http.Response) string {
	mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	return mt
}

func keys(m map[string]any) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// want fails the test unless the answer has status code.
func (a *answer) want(t *testing.T, code int) *answer {
	t.Helper()
	if a.status != code {
		t.Fatalf("%s: %d, want %d: %.500s", a.op, a.status, code, a.raw)
	}
	return a
}

// field is a top-level field of a JSON object body.
func (a *answer) field(name string) any {
	m, _ := a.body.(map[string]any)
	return m[name]
}

func (a *answer) str(t *testing.T, name string) string {
	t.Helper()
	s, ok := a.field(name).(string)
	if !ok {
		t.Fatalf("%s: no string %s in %.300s", a.op, name, a.raw)
	}
	return s
}

// events fails the test unless the stream held events of each type.
func (a *answer) events(t *testing.T, types ...string) *answer {
	t.Helper()
	for _, ty := range types {
		if !slices.ContainsFunc(a.sse, func(m sseMsg) bool { return m.typ == ty }) {
			t.Errorf("%s: no %s event in %s", a.op, ty, a.raw)
		}
	}
	return a
}

// sseMsg is one Server-Sent Event as sent.
type sseMsg struct {
	id, typ, data string
	value         any // data as JSON, nil if it is not
}

func (m sseMsg) field(name string) any {
	v, _ := m.value.(map[string]any)
	return v[name]
}

// readSSE parses an event stream; the channel closes at its end.
func readSSE(r io.Reader) <-chan sseMsg {
	ch := make(chan sseMsg, 64)
	go func() {
		defer close(ch)
		sc := bufio.NewScanner(r)
		sc.Buffer(make([]byte, 0, 64<<10), 4<<20)
		var m sseMsg
		var data []string
		for sc.Scan() {
			line := sc.Text()
			switch {
			case line == "":
				if data != nil {
					m.data = strings.Join(data, "\n")
					if m.typ == "" {
						m.typ = "message"
					}
					_ = decodeNumbers([]byte(m.data), &m.value)
					ch <- m
				}
				m, data = sseMsg{}, nil
			case strings.HasPrefix(line, ":"): // a comment (keep-alive)
			default:
				name, value, _ := strings.Cut(line, ":")
				value = strings.TrimPrefix(value, " ")
				switch name {
				case "id":
					m.id = value
				case "event":
					m.typ = value
				case "data":
					data = append(data, value)
				}
			}
		}
	}()
	return ch
}

// checkEvent checks one event of op's stream against the schema
// x-sse-events gives its type.
func (d *apiDoc) checkEvent(t *testing.T, op string, media map[string]any, m sseMsg) {
	t.Helper()
	events, _ := media["x-sse-events"].(map[string]any)
	schema, ok := events[m.typ]
	if !ok {
		t.Errorf("%s: event type %q is not in x-sse-events: %s", op, m.typ, m.data)
		return
	}
	if m.data == "[DONE]" && op == "POST /v1/chat/completions" {
		return // the Chat Completions stream's end, described in its response
	}
	if m.value == nil {
		t.Errorf("%s: %s event data is not JSON: %s", op, m.typ, m.data)
		return
	}
	d.check(t, fmt.Sprintf("%s event %s", op, m.typ), schema, m.value)
}

// liveStream is an event stream being read.
type liveStream struct {
	op    string
	media map[string]any
	ch    <-chan sseMsg
}

// stream opens op's event stream at url and checks the answer's head; read
// its events with next.
func (d *apiDoc) stream(t *testing.T, op, url string, hdr ...string) *liveStream {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	req, err := http.NewRequestWithContext(ctx, "GET", url, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	media := d.checkAnswer(t, op, resp)
	if resp.StatusCode != http.StatusOK || mediaType(resp) != "text/event-stream" {
		raw, _ := io.ReadAll(resp.Body)
		t.Fatalf("%s: %d %s: %s", op, resp.StatusCode, resp.Header.Get("Content-Type"), raw)
	}
	return &liveStream{op: op, media: media, ch: readSSE(resp.Body)}
}

// next checks the stream's events until one of the given types arrives.
func (d *apiDoc) next(t *testing.T, s *liveStream, types ...string) sseMsg {
	t.Helper()
	for {
		m, ok := <-s.ch
		if !ok {
			t.Fatalf("%s: the stream ended before a %v event", s.op, types)
		}
		d.checkEvent(t, s.op, s.media, m)
		if slices.Contains(types, m.typ) {
			return m
		}
	}
}

// drain checks the stream's remaining events; it must end (after a
// terminal event).
func (d *apiDoc) drain(t *testing.T, s *liveStream) {
	t.Helper()
	for m := range s.ch {
		d.checkEvent(t, s.op, s.media, m)
	}
}

// everyOperationCalled fails the test for each described operation the
// test did not call.
func (d *apiDoc) everyOperationCalled(t *testing.T) {
	t.Helper()
	paths, _ := d.doc["paths"].(map[string]any)
	for path, item := range paths {
		for method := range item.(map[string]any) {
			switch method {
			case "get", "put", "post", "delete", "patch", "head", "options", "trace":
			default:
				continue
			}
			op := strings.ToUpper(method) + " " + path
			d.mu.Lock()
			codes := d.seen[op]
			d.mu.Unlock()
			if len(codes) == 0 {
				t.Errorf("%s is described but the test never called it", op)
			}
		}
	}
}

// check fails the test with every way v does not match schema.
func (d *apiDoc) check(t *testing.T, what string, schema, v any) {
	t.Helper()
	for _, e := range d.validate("$", schema, v) {
		t.Errorf("%s: %s", what, e)
	}
}

// validate checks v against a JSON Schema (the 2020-12 keywords
// openapi.json uses): $ref, allOf, oneOf/anyOf (at least one matches),
// const, enum, type, required, properties, additionalProperties, items,
// minItems/maxItems, minimum/maximum, format date-time.
func (d *apiDoc) validate(at string, schema, v any) []string {
	s, ok := schema.(map[string]any)
	if !ok {
		return nil // absent, true or {}: anything
	}
	var errs []string
	if ref, ok := s["$ref"].(string); ok {
		target, ok := d.pointer(ref)
		if !ok {
			return []string{at + ": unresolved $ref " + ref}
		}
		errs = append(errs, d.validate(at, target, v)...)
	}
	for _, sub := range asList(s["allOf"]) {
		errs = append(errs, d.validate(at, sub, v)...)
	}
	for _, kw := range []string{"oneOf", "anyOf"} {
		alts := asList(s[kw])
		if alts == nil {
			continue
		}
		var why []string
		for i, alt := range alts {
			e := d.validate(at, alt, v)
			if len(e) == 0 {
				why = nil
				break
			}
			why = append(why, fmt.Sprintf("[%d] %s", i, strings.Join(e, ", ")))
		}
		if why != nil {
			errs = append(errs, fmt.Sprintf("%s: matches none of %s: %s", at, kw, strings.Join(why, "; ")))
		}
	}
	if c, ok := s["const"]; ok && !sameJSON(c, v) {
		errs = append(errs, fmt.Sprintf("%s: %s, want %s", at, jsonText(v), jsonText(c)))
	}
	if e, ok := s["enum"].([]any); ok && !slices.ContainsFunc(e, func(x any) bool { return sameJSON(x, v) }) {
		errs = append(errs, fmt.Sprintf("%s: %s is not one of %s", at, jsonText(v), jsonText(e)))
	}
	if ty, ok := s["type"]; ok && !typeIs(ty, v) {
		return append(errs, fmt.Sprintf("%s: %s is not of type %s", at, jsonText(v), jsonText(ty)))
	}
	switch x := v.(type) {
	case map[string]any:
		props, _ := s["properties"].(map[string]any)
		for _, r := range asList(s["required"]) {
			if _, ok := x[r.(string)]; !ok {
				errs = append(errs, fmt.Sprintf("%s: required field %q missing", at, r))
			}
		}
		for _, k := range keys(x) {
			if ps, ok := props[k]; ok {
				errs = append(errs, d.validate(at+"."+k, ps, x[k])...)
				continue
			}
			switch ap := s["additionalProperties"].(type) {
			case bool:
				if !ap {
					errs = append(errs, fmt.Sprintf("%s: field %q is not described", at, k))
				}
			case map[string]any:
				errs = append(errs, d.validate(at+"."+k, ap, x[k])...)
			}
		}
	case []any:
		if n, ok := number(s["minItems"]); ok && float64(len(x)) < n {
			errs = append(errs, fmt.Sprintf("%s: %d items, want at least %v", at, len(x), n))
		}
		if n, ok := number(s["maxItems"]); ok && float64(len(x)) > n {
			errs = append(errs, fmt.Sprintf("%s: %d items, want at most %v", at, len(x), n))
		}
		for i, e := range x {
			errs = append(errs, d.validate(fmt.Sprintf("%s[%d]", at, i), s["items"], e)...)
		}
	case string:
		if s["format"] == "date-time" {
			if _, err := time.Parse(time.RFC3339Nano, x); err != nil {
				errs = append(errs, fmt.Sprintf("%s: %q is not a date-time", at, x))
			}
		}
	case json.Number:
		f, _ := x.Float64()
		if n, ok := number(s["minimum"]); ok && f < n {
			errs = append(errs, fmt.Sprintf("%s: %s is below %v", at, x, n))
		}
		if n, ok := number(s["maximum"]); ok && f > n {
			errs = append(errs, fmt.Sprintf("%s: %s is above %v", at, x, n))
		}
	}
	return errs
}

func asList(v any) []any {
	l, _ := v.([]any)
	return l
}

func number(v any) (float64, bool) {
	n, ok := v.(json.Number)
	if !ok {
		return 0, false
	}
	f, err := n.Float64()
	return f, err == nil
}

// typeIs reports whether v is of the JSON type ty (a name or a list).
func typeIs(ty, v any) bool {
	if l, ok := ty.([]any); ok {
		return slices.ContainsFunc(l, func(t any) bool { return typeIs(t, v) })
	}
	switch x := v.(type) {
	case nil:
		return ty == "null"
	case bool:
		return ty == "boolean"
	case string:
		return ty == "string"
	case map[string]any:
		return ty == "object"
	case []any:
		return ty == "array"
	case json.Number:
		if ty == "number" {
			return true
		}
		_, err := x.Int64()
		return ty == "integer" && err == nil
	}
	return false
}

// sameJSON compares two decoded JSON values, numbers by value.
func sameJSON(a, b any) bool {
	return reflect.DeepEqual(normalJSON(a), normalJSON(b))
}

func normalJSON(v any) any {
	switch x := v.(type) {
	case json.Number:
		f, _ := x.Float64()
		return f
	case map[string]any:
		out := make(map[string]any, len(x))
		for k, e := range x {
			out[k] = normalJSON(e)
		}
		return out
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = normalJSON(e)
		}
		return out
	}
	return v
}

func jsonText(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}
