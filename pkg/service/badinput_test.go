package service_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

// badInput is one bad request and the answer it gets.
type badInput struct {
	name   string
	method string
	// path may hold {queued} (a queued request of the demo tenant) or
	// {cancelled} (one it cancelled).
	path string
	// auth is "bearer:<token>", "x-api-key:<token>" or "" (none).
	auth string
	hdr  []string // more headers: name, value, ...
	body string
	// chunked sends the body without a Content-Length.
	chunked bool
	status  int
	// msg is a substring of error.message (for 2xx: of the whole answer).
	msg string
	// field is error.field, in the answers of the async and admin API that
	// name one.
	field string
}

// TestBadInput is the one list of the bad inputs of every endpoint, each
// with the status and the message it is answered with (error.message in the
// endpoint's own format: the async API's, OpenAI's or Anthropic's). Some are
// also covered, with more around them, by TestRefusedAtTheDoor,
// TestEventStreamEdges and TestAdminRefusesCrossSite (edges_test.go),
// TestAdminWritesRequireJSON (admin_test.go), TestOpenAISDK and
// TestAnthropicSDK (compat_test.go, through the SDKs); TestBadInputClasses
// (e2e_test.go) checks a subset of the async API's rows.
func TestBadInput(t *testing.T) {
	t.Parallel()
	s := newSystem(t, opts{tenantYML: `{name: capped, token: "capped-token", max_priority: normal}`})
	api := s.startAPI() // no worker: what is accepted stays queued
	queued := api.submit(t, ask("stays queued"))
	cancelled := api.submit(t, ask("cancelled at once"))
	if code, out, _ := call(t, "DELETE", api.ts.URL+"/v1/requests/"+cancelled, devToken, nil); code != http.StatusOK {
		t.Fatalf("cancel: %d %v", code, out)
	}

	dev, capped := "bearer:"+devToken, "bearer:capped-token"
	admin, anth := "bearer:"+adminToken, "x-api-key:"+devToken
	req := func(extra string) string {
		return `{"provider":"claude","model_tier":"sonnet",` + extra + `"messages":[{"role":"user","content":"why?"}]}`
	}
	msgs := func(m string) string { return `{"provider":"claude","model_tier":"sonnet","messages":` + m + `}` }
	oai := func(extra string) string {
		return `{"model":"gpt-4o",` + extra + `"messages":[{"role":"user","content":"why?"}]}`
	}
	ant := func(extra string) string {
		return `{"model":"claude-sonnet","max_tokens":100,` + extra + `"messages":[{"role":"user","content":"why?"}]}`
	}
	big := strings.Repeat("a", 1<<20) // the default server.max_body_bytes is 1 MiB
	future := strconv.FormatInt(time.Now().Add(time.Hour).UnixMilli(), 10) + "-0"
	metadata := map[string]string{}
	for i := range 17 {
		metadata[fmt.Sprint("k", i)] = "v"
	}
	tooMuchMetadata, _ := json.Marshal(metadata)

	const (
		async  = "/v1/requests"
		openai = "/v1/chat/completions"
		resps  = "/v1/responses"
		anthro = "/v1/messages"
		events = "/v1/requests/{queued}/events"
	)
	cases := []badInput{
		// The async API: the body.
		{name: "malformed JSON", path: async, auth: dev, body: `{"provider":"claude",`, status: 400, msg: "malformed JSON: unexpected EOF"},
		{name: "empty body", path: async, auth: dev, body: "", status: 400, msg: "request body is empty"},
		{name: "data after the object", path: async, auth: dev, body: req("") + "{}", status: 400, msg: "unexpected data after the JSON object"},
		{name: "not an object", path: async, auth: dev, body: `[1]`, status: 400, msg: "not array"},
		{name: "unknown field", path: async, auth: dev, body: req(`"modle":"x",`), status: 400, msg: `unknown field "modle"`},
		{name: "wrong type", path: async, auth: dev, body: req(`"max_tokens":"many",`), status: 400, msg: "max_tokens must be a number, not string", field: "max_tokens"},
		{name: "an array for a body", path: async, auth: dev, body: `[1]`, status: 400, msg: "the body must be an object, not array"},
		{name: "body over the limit", path: async, auth: dev, body: req(`"system":"` + big + `",`), status: 413, msg: "request body exceeds the limit of 1048576 bytes"},
		{name: "body over the limit, chunked", path: async, auth: dev, body: req(`"system":"` + big + `",`), chunked: true, status: 413, msg: "request body exceeds the limit"},
		{name: "prompt over max_prompt_chars", path: async, auth: dev, body: req(`"system":"` + big[:200_000] + `",`), status: 413, msg: "prompt is 200004 characters (system, messages, tools and stop sequences), the limit is 200000", field: "messages"},
		// Issue 28: tools are as large as a prompt, and count as one.
		{name: "tools over max_prompt_chars", path: async, auth: dev, body: req(`"tools":[{"name":"f","description":"` + big[:200_000] + `","input_schema":{}}],`), status: 413, msg: "prompt is 200007 characters", field: "messages"},
		// Issue 28: a stray byte would be stored as U+FFFD, three bytes.
		{name: "body not UTF-8", path: async, auth: dev, body: req(`"system":"caf` + "\xe9" + `",`), status: 400, msg: "request body is not valid UTF-8 (at byte 56)"},
		{name: "OpenAI body not UTF-8", path: openai, auth: dev, body: oai(`"user":"` + "\xff" + `",`), status: 400, msg: "request body is not valid UTF-8"},
		{name: "Anthropic body not UTF-8", path: anthro, auth: anth, body: ant(`"system":"` + "\xff" + `",`), status: 400, msg: "request body is not valid UTF-8"},
		{name: "NUL in content", path: async, auth: dev, body: msgs(`[{"role":"user","content":"a\u0000b"}]`), status: 422, msg: "must not contain a NUL character", field: "messages[0].content[0]"},
		{name: "NUL in system", path: async, auth: dev, body: req(`"system":"s\u0000",`), status: 422, msg: "must not contain a NUL character", field: "system"},
		{name: "NUL in tool input", path: async, auth: dev, body: msgs(`[{"role":"assistant","content":[{"type":"tool_use","tool_use_id":"t","tool_name":"f","input":{"q":"\u0000"}}]},{"role":"user","content":"go on"}]`), status: 422, msg: "must not contain a NUL character", field: "messages[0].content[0]"},
		{name: "NUL in a tool name", path: async, auth: dev, body: req(`"tools":[{"name":"f\u0000","input_schema":{}}],`), status: 422, msg: "must not contain a NUL character", field: "tools[0]"},
		{name: "NUL in a stop sequence", path: async, auth: dev, body: req(`"stop_sequences":["\u0000"],`), status: 422, msg: "must not contain a NUL character", field: "request"},
		{name: "tool_use from the user", path: async, auth: dev, body: msgs(`[{"role":"user","content":[{"type":"tool_use","tool_use_id":"t","tool_name":"f","input":{}}]}]`), status: 422, msg: "belongs to an assistant message", field: "messages[0].content[0]"},
		{name: "tool_use input not an object", path: async, auth: dev, body: msgs(`[{"role":"assistant","content":[{"type":"tool_use","tool_use_id":"t","tool_name":"f","input":[1]}]},{"role":"user","content":"go on"}]`), status: 422, msg: "must be a JSON object", field: "messages[0].content[0].input"},
		{name: "tool_result without its id", path: async, auth: dev, body: msgs(`[{"role":"user","content":[{"type":"tool_result","text":"42"}]}]`), status: 422, msg: "needs the tool_use_id", field: "messages[0].content[0]"},
		{name: "unknown tool_choice mode", path: async, auth: dev, body: req(`"tool_choice":{"mode":"bogus"},`), status: 422, msg: `must be auto, any, tool or none, not "bogus"`, field: "tool_choice.mode"},
		{name: "unknown content block type", path: async, auth: dev, body: msgs(`[{"role":"user","content":[{"type":"image","text":"x"}]}]`), status: 422, msg: `must be text, tool_use or tool_result, not "image"`, field: "messages[0].content[0].type"},
		{name: "missing messages", path: async, auth: dev, body: `{"provider":"claude","model_tier":"sonnet"}`, status: 422, msg: "at least one message is required", field: "messages"},
		{name: "no messages", path: async, auth: dev, body: msgs(`[]`), status: 422, msg: "at least one message is required", field: "messages"},
		{name: "missing provider and tier", path: async, auth: dev, body: `{"messages":[{"role":"user","content":"x"}]}`, status: 422, msg: "provider and model_tier are required", field: "model_tier"},
		{name: "unknown route", path: async, auth: dev, body: `{"provider":"claude","model_tier":"opus","messages":[{"role":"user","content":"x"}]}`, status: 404, msg: `no such provider/tier "claude/opus"`, field: "model_tier"},
		{name: "system role in messages", path: async, auth: dev, body: msgs(`[{"role":"system","content":"x"}]`), status: 422, msg: `must be user or assistant, not "system"`, field: "messages[0].role"},
		{name: "last message from the assistant", path: async, auth: dev, body: msgs(`[{"role":"user","content":"x"},{"role":"assistant","content":"y"}]`), status: 422, msg: "the last message must come from the user", field: "messages"},
		// Empty content: 400 as a string, 422 as an empty list of blocks.
		{name: "empty string content", path: async, auth: dev, body: msgs(`[{"role":"user","content":""}]`), status: 400, msg: "messages[0].content: must not be empty", field: "messages[0].content"},
		{name: "empty block list", path: async, auth: dev, body: msgs(`[{"role":"user","content":[]}]`), status: 422, msg: "must not be empty", field: "messages[0].content"},
		{name: "null content", path: async, auth: dev, body: msgs(`[{"role":"user","content":null}]`), status: 400, msg: "messages[0].content: is required", field: "messages[0].content"},
		{name: "content neither string nor blocks", path: async, auth: dev, body: msgs(`[{"role":"user","content":42}]`), status: 400, msg: "must be a string or an array of blocks", field: "messages[0].content"},
		{name: "invalid priority", path: async, auth: dev, body: req(`"priority":"urgent",`), status: 422, msg: `invalid priority "urgent"`, field: "priority"},
		{name: "priority out of range", path: async, auth: dev, body: req(`"priority":5,`), status: 422, msg: "invalid priority 5: want 1-4", field: "priority"},
		// Asking above the tenant's max_priority runs at it (README): not an error.
		{name: "priority above the tenant's max", path: async, auth: capped, body: req(`"priority":"critical",`), status: 202, msg: `"status":"queued"`},
		{name: "max_tokens above the limit", path: async, auth: dev, body: req(`"max_tokens":64001,`), status: 422, msg: "must be between 1 and 64000 (the most claude/sonnet gives), got 64001", field: "max_tokens"},
		{name: "negative max_tokens", path: async, auth: dev, body: req(`"max_tokens":-1,`), status: 422, msg: "must be between 1 and 64000, got -1", field: "max_tokens"},
		{name: "temperature out of range", path: async, auth: dev, body: req(`"temperature":2.5,`), status: 422, msg: "must be between 0 and 2", field: "temperature"},
		{name: "unknown cache layer", path: async, auth: dev, body: req(`"cache_layer":"l2",`), status: 422, msg: `unknown cache layer "l2"`, field: "cache_layer"},
		{name: "case_id too long", path: async, auth: dev, body: req(`"case_id":"` + strings.Repeat("c", 129) + `",`), status: 422, msg: "at most 128 bytes, got 129", field: "case_id"},
		{name: "NUL in case_id", path: async, auth: dev, body: req(`"case_id":"c\u0000",`), status: 422, msg: "must be printable UTF-8 without control characters", field: "case_id"},
		{name: "too much metadata", path: async, auth: dev, body: req(`"metadata":` + string(tooMuchMetadata) + `,`), status: 422, msg: "at most 16 entries, got 17", field: "metadata"},
		{name: "Idempotency-Key too long", path: async, auth: dev, hdr: []string{"Idempotency-Key", strings.Repeat("k", 256)}, body: req(""), status: 422, msg: "at most 255 bytes, got 256", field: "Idempotency-Key"},
		{name: "Idempotency-Key not UTF-8", path: async, auth: dev, hdr: []string{"Idempotency-Key", "k\xff"}, body: req(""), status: 422, msg: "must be printable UTF-8 without control characters", field: "Idempotency-Key"},
		{name: "Idempotency-Key with a tab", path: async, auth: dev, hdr: []string{"Idempotency-Key", "k\tk"}, body: req(""), status: 422, msg: "must be printable UTF-8 without control characters", field: "Idempotency-Key"},

		// The async API: authentication and the request's own endpoints.
		{name: "no token", path: async, body: req(""), status: 401, msg: "missing client token"},
		{name: "unknown token", path: async, auth: "bearer:nobody", body: req(""), status: 401, msg: "invalid client token"},
		{name: "unknown request", method: "GET", path: "/v1/requests/req_nope", auth: dev, status: 404, msg: "no request req_nope", field: "id"},
		{name: "another tenant's request", method: "GET", path: "/v1/requests/{queued}", auth: "bearer:other-token", status: 404, msg: "no request req_", field: "id"},
		{name: "cancel an ended request", method: "DELETE", path: "/v1/requests/{cancelled}", auth: dev, status: 409, msg: "the request has already ended", field: "id"},
		{name: "malformed Last-Event-ID", method: "GET", path: events, auth: dev, hdr: []string{"Last-Event-ID", "garbage"}, status: 400, msg: "Last-Event-ID must be an event id this stream sent", field: "Last-Event-ID"},
		{name: "Last-Event-ID with a bad sequence", method: "GET", path: events, auth: dev, hdr: []string{"Last-Event-ID", "12-x"}, status: 400, msg: "Last-Event-ID must be an event id", field: "Last-Event-ID"},
		{name: "future Last-Event-ID", method: "GET", path: events, auth: dev, hdr: []string{"Last-Event-ID", future}, status: 400, msg: "not in the future", field: "Last-Event-ID"},
		{name: "malformed last_event_id parameter", method: "GET", path: events + "?last_event_id=x-1", auth: dev, status: 400, msg: "Last-Event-ID must be an event id", field: "Last-Event-ID"},
		{name: "events of an unknown request", method: "GET", path: "/v1/requests/req_nope/events", auth: dev, status: 404, msg: "no request req_nope", field: "id"},
		{name: "unknown endpoint", path: "/v1/nope", auth: dev, status: 404, msg: "no such endpoint"},
		{name: "wrong method", method: "PUT", path: async, auth: dev, body: req(""), status: 405, msg: "method not allowed"},

		// The OpenAI-compatible endpoint.
		{name: "openai: malformed JSON", path: openai, auth: dev, body: `{"model":`, status: 400, msg: "invalid JSON at byte"},
		{name: "responses: malformed JSON", path: resps, auth: dev, body: `{"model":`, status: 400, msg: "invalid JSON at byte"},
		{name: "responses: input of the wrong shape", path: resps, auth: dev, body: `{"model":"gpt-4o","input":{"role":"user"}}`, status: 400, msg: "input: must be a string or an array of items"},
		{name: "responses: previous_response_id", path: resps, auth: dev, body: `{"model":"gpt-4o","input":"x","previous_response_id":"resp_1"}`, status: 400, msg: "previous_response_id: not supported: Bulwark answers statelessly"},
		{name: "responses: background", path: resps, auth: dev, body: `{"model":"gpt-4o","input":"x","background":true}`, status: 400, msg: "background: true is not supported"},
		{name: "responses: built-in tool", path: resps, auth: dev, body: `{"model":"gpt-4o","input":"x","tools":[{"type":"web_search"}]}`, status: 400, msg: `tools[0].type: "web_search" is not supported`},
		{name: "responses: item_reference to no answer", path: resps, auth: dev, body: `{"model":"gpt-4o","input":[{"type":"item_reference","id":"msg_1"}]}`, status: 400, msg: `input[0].id: "msg_1" is not an output item of one of this tenant's answers`},
		{name: "responses: no token", path: resps, body: `{"model":"gpt-4o","input":"x"}`, status: 401, msg: "missing client token"},
		{name: "openai: missing model", path: openai, auth: dev, body: `{"messages":[{"role":"user","content":"x"}]}`, status: 400, msg: "model: required"},
		{name: "openai: unknown model", path: openai, auth: dev, body: `{"model":"gpt-9","messages":[{"role":"user","content":"x"}]}`, status: 404, msg: `unknown model "gpt-9"`},
		{name: "openai: missing messages", path: openai, auth: dev, body: `{"model":"gpt-4o"}`, status: 400, msg: "messages: at least one message is required"},
		{name: "openai: n above 1", path: openai, auth: dev, body: oai(`"n":2,`), status: 400, msg: "n: only 1 is supported, got 2"},
		{name: "openai: image part", path: openai, auth: dev, body: `{"model":"gpt-4o","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}]}`, status: 400, msg: `messages[0].content[0].type: "image_url" is not supported`},
		{name: "openai: NUL in content", path: openai, auth: dev, body: `{"model":"gpt-4o","messages":[{"role":"user","content":"a\u0000"}]}`, status: 400, msg: "must not contain a NUL character"},
		{name: "openai: max_tokens above the limit", path: openai, auth: dev, body: oai(`"max_tokens":40000,`), status: 400, msg: "max_tokens is too large: 40000. This model supports at most 16384 completion tokens, whereas you provided 40000."},
		{name: "openai: invalid X-Bulwark-Priority", path: openai, auth: dev, hdr: []string{"X-Bulwark-Priority", "urgent"}, body: oai(""), status: 400, msg: `X-Bulwark-Priority: invalid priority "urgent"`},
		{name: "openai: invalid X-Bulwark-Cache", path: openai, auth: dev, hdr: []string{"X-Bulwark-Cache", "sometimes"}, body: oai(""), status: 400, msg: "X-Bulwark-Cache: want bypass, no-store or no-read"},
		{name: "openai: X-Bulwark-Case-Id too long", path: openai, auth: dev, hdr: []string{"X-Bulwark-Case-Id", strings.Repeat("c", 129)}, body: oai(""), status: 400, msg: "case_id: at most 128 bytes"},
		{name: "openai: body over the limit", path: openai, auth: dev, body: oai(`"user":"` + big + `",`), status: 413, msg: "request body exceeds the limit of 1048576 bytes"},
		{name: "openai: unknown token", path: openai, auth: "bearer:nobody", body: oai(""), status: 401, msg: "invalid client token"},

		// The Anthropic-compatible endpoint (the SDK sends its token in x-api-key).
		{name: "anthropic: missing max_tokens", path: anthro, auth: anth, body: `{"model":"claude-sonnet","messages":[{"role":"user","content":"x"}]}`, status: 400, msg: "max_tokens: required"},
		{name: "anthropic: unknown model", path: anthro, auth: anth, body: `{"model":"claude-opus-9","max_tokens":10,"messages":[{"role":"user","content":"x"}]}`, status: 404, msg: `unknown model "claude-opus-9"`},
		{name: "anthropic: image block", path: anthro, auth: anth, body: `{"model":"claude-sonnet","max_tokens":10,"messages":[{"role":"user","content":[{"type":"image","source":{}}]}]}`, status: 400, msg: `messages[0].content[0].type: "image" is not supported`},
		{name: "anthropic: tool_use from the user", path: anthro, auth: anth, body: `{"model":"claude-sonnet","max_tokens":10,"messages":[{"role":"user","content":[{"type":"tool_use","id":"t","name":"f","input":{}}]}]}`, status: 400, msg: "tool_use blocks belong in assistant messages"},
		{name: "anthropic: temperature out of range", path: anthro, auth: anth, body: ant(`"temperature":5,`), status: 400, msg: "temperature: must be between 0 and 2"},
		{name: "anthropic: Idempotency-Key too long", path: anthro, auth: anth, hdr: []string{"Idempotency-Key", strings.Repeat("k", 256)}, body: ant(""), status: 400, msg: "Idempotency-Key: at most 255 bytes"},
		{name: "anthropic: body over the limit", path: anthro, auth: anth, body: ant(`"system":"` + big + `",`), chunked: true, status: 413, msg: "request body exceeds the limit of 1048576 bytes"},
		{name: "anthropic: unknown token", path: anthro, auth: "x-api-key:nobody", body: ant(""), status: 401, msg: "invalid client token"},
		{name: "anthropic: max_tokens above the model's", path: anthro, auth: anth, body: `{"model":"claude-sonnet","max_tokens":64001,"messages":[{"role":"user","content":"x"}]}`, status: 400, msg: "max_tokens: 64001 > 64000, which is the maximum allowed number of output tokens for claude-sonnet"},

		// Anthropic's token count: the refusals of /v1/messages.
		{name: "count_tokens: malformed JSON", path: "/v1/messages/count_tokens", auth: anth, body: `{"model":`, status: 400, msg: "invalid JSON at byte"},
		{name: "count_tokens: unknown model", path: "/v1/messages/count_tokens", auth: anth, body: `{"model":"claude-opus-9","messages":[{"role":"user","content":"x"}]}`, status: 404, msg: `unknown model "claude-opus-9"`},
		{name: "count_tokens: last from the assistant", path: "/v1/messages/count_tokens", auth: anth, body: `{"model":"claude-sonnet","messages":[{"role":"assistant","content":"x"}]}`, status: 400, msg: "messages: the last message must come from the user"},
		{name: "count_tokens: unknown token", path: "/v1/messages/count_tokens", auth: "x-api-key:nobody", body: `{"model":"claude-sonnet","messages":[{"role":"user","content":"x"}]}`, status: 401, msg: "invalid client token"},

		// The admin endpoints.
		{name: "admin: no token", path: "/admin/breakers/all/reset", body: "{}", status: 401, msg: "admin token required"},
		{name: "admin: a tenant's token", path: "/admin/breakers/all/reset", auth: dev, body: "{}", status: 401, msg: "admin token required"},
		{name: "admin: cross-site write", path: "/admin/breakers/all/reset", auth: admin, hdr: []string{"Sec-Fetch-Site", "cross-site"}, body: "{}", status: 403, msg: "cross-site admin requests are refused"},
		{name: "admin: write from another origin", path: "/admin/breakers/all/reset", auth: admin, hdr: []string{"Origin", "https://evil.example"}, body: "{}", status: 403, msg: "admin requests from another origin are refused"},
		{name: "admin: write without JSON", path: "/admin/breakers/all/reset", auth: admin, hdr: []string{"Content-Type", "application/x-www-form-urlencoded"}, body: "a=1", status: 415, msg: "admin writes require Content-Type: application/json", field: "Content-Type"},
		{name: "admin: malformed invalidation", path: "/admin/cache/invalidate", auth: admin, body: `{"all":`, status: 400, msg: "malformed JSON"},
		{name: "admin: empty invalidation", path: "/admin/cache/invalidate", auth: admin, body: `{}`, status: 422, msg: "give case_id, or tenant and/or layer, or all: true", field: "case_id"},
		{name: "admin: report with a bad date", method: "GET", path: "/admin/report?from=yesterday", auth: admin, status: 400, msg: "must be RFC 3339", field: "from"},

		// The operator surfaces on the tenants' listener: the metrics and
		// the profiles want the admin token; /readyz answers a load
		// balancer with its status alone ({"status":"ok"} is not a
		// substring of the detailed answer, whose keys sort before it).
		{name: "metrics: no token", method: "GET", path: "/metrics", status: 401, msg: "admin token required"},
		{name: "metrics: a tenant's token", method: "GET", path: "/metrics", auth: dev, status: 401, msg: "admin token required"},
		{name: "metrics: the token in x-api-key of a tenant", method: "GET", path: "/metrics", auth: anth, status: 401, msg: "admin token required"},
		{name: "profiles: no token", method: "GET", path: "/admin/debug/pprof/goroutine?debug=1", status: 401, msg: "admin token required"},
		{name: "readyz: no token, the status alone", method: "GET", path: "/readyz", status: 200, msg: `{"status":"ok"}`},
		{name: "readyz: details with a tenant's token", method: "GET", path: "/readyz", auth: dev, status: 401, msg: "admin token required"},
	}
	ids := strings.NewReplacer("{queued}", queued, "{cancelled}", cancelled)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if tc.method == "" {
				tc.method = http.MethodPost
			}
			code, body := sendBad(t, api.ts.URL+ids.Replace(tc.path), tc)
			if code != tc.status {
				t.Fatalf("%s %s: %d %s, want %d", tc.method, tc.path, code, clip(body), tc.status)
			}
			if code/100 == 2 {
				if !strings.Contains(string(body), tc.msg) {
					t.Fatalf("answer %s, want it to contain %q", clip(body), tc.msg)
				}
				return
			}
			var e struct {
				Type  string `json:"type"`
				Error struct {
					Message string `json:"message"`
					Field   string `json:"field"`
				} `json:"error"`
			}
			if err := json.Unmarshal(body, &e); err != nil {
				t.Fatalf("not JSON (%v): %s", err, clip(body))
			}
			if tc.path == anthro && e.Type != "error" {
				t.Errorf("not in Anthropic's error format: %s", clip(body))
			}
			if !strings.Contains(e.Error.Message, tc.msg) {
				t.Fatalf("error.message %q, want it to contain %q (answer %s)", e.Error.Message, tc.msg, clip(body))
			}
			if e.Error.Field != tc.field {
				t.Errorf("error.field %q, want %q", e.Error.Field, tc.field)
			}
		})
	}

	// The capped tenant's critical request runs at its ceiling.
	t.Run("priority above the tenant's max is lowered", func(t *testing.T) {
		t.Parallel()
		code, out, _ := call(t, "POST", api.ts.URL+async, "capped-token", map[string]any{"provider": "claude", "model_tier": "sonnet",
			"priority": "critical", "messages": []map[string]any{{"role": "user", "content": "lowered"}}})
		if code != http.StatusAccepted {
			t.Fatalf("submit: %d %v", code, out)
		}
		if _, got, _ := call(t, "GET", api.ts.URL+async+"/"+out["id"].(string), "capped-token", nil); got["priority"] != "normal" {
			t.Fatalf("priority %v, want normal (the tenant's max_priority)", got["priority"])
		}
	})
}

// sendBad sends one bad request and reads the whole answer.
func sendBad(t *testing.T, url string, tc badInput) (int, []byte) {
	t.Helper()
	var body io.Reader = strings.NewReader(tc.body)
	if tc.chunked {
		body = io.MultiReader(body) // hides the length: sent chunked
	}
	req, err := http.NewRequest(tc.method, url, body)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if kind, token, ok := strings.Cut(tc.auth, ":"); ok {
		if kind == "bearer" {
			req.Header.Set("Authorization", "Bearer "+token)
		} else {
			req.Header.Set("x-api-key", token)
		}
	}
	for i := 0; i+1 < len(tc.hdr); i += 2 {
		req.Header.Set(tc.hdr[i], tc.hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", tc.method, url, err)
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: read the answer: %v", tc.method, url, err)
	}
	return resp.StatusCode, out
}

// clip shortens an answer for a failure message.
func clip(b []byte) []byte {
	if len(b) > 300 {
		return append(bytes.Clone(b[:300]), "…"...)
	}
	return b
}
