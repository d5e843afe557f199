package httpapi_test

import (
	"encoding/json"
	"net/http"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

// jsonOf is a reply's body decoded to plain values, for go-cmp.
func jsonOf(t *testing.T, r reply) any {
	t.Helper()
	var v any
	if err := json.Unmarshal(r.body, &v); err != nil {
		t.Fatalf("body %q: %v", r.body, err)
	}
	return v
}

// GET /v1/models and /v1/models/{id} answer in OpenAI's format, or in
// Anthropic's when the request carries anthropic-version, errors too.
func TestModelsInEachDialect(t *testing.T) {
	t.Parallel()
	s := newServer(t, nil)
	an := []string{"anthropic-version", "2023-06-01"}
	oaModel := func(id string) map[string]any {
		return map[string]any{"id": id, "object": "model", "created": 0.0, "owned_by": "claude"}
	}
	anModel := func(id string) map[string]any {
		return map[string]any{"type": "model", "id": id, "display_name": id, "created_at": "1970-01-01T00:00:00Z", "max_tokens": 4096.0}
	}
	for _, tt := range []struct {
		name, path, token string
		hdr               []string
		code              int
		want              any
	}{
		{"openai list", "/v1/models", tokAcme, nil, 200,
			map[string]any{"object": "list", "data": []any{oaModel("claude-sonnet"), oaModel("gpt-4o")}}},
		{"anthropic list", "/v1/models", tokAcme, an, 200, map[string]any{"data": []any{anModel("claude-sonnet"), anModel("gpt-4o")},
			"has_more": false, "first_id": "claude-sonnet", "last_id": "gpt-4o"}},
		{"openai model", "/v1/models/gpt-4o", tokAcme, nil, 200, oaModel("gpt-4o")},
		{"anthropic model", "/v1/models/gpt-4o", tokAcme, an, 200, anModel("gpt-4o")},
		{"openai unknown model", "/v1/models/gpt-9", tokAcme, nil, 404, map[string]any{"error": map[string]any{
			"message": "The model 'gpt-9' does not exist", "type": "invalid_request_error", "param": "model", "code": "model_not_found"}}},
		{"anthropic unknown model", "/v1/models/gpt-9", tokAcme, an, 404, map[string]any{"type": "error", "error": map[string]any{
			"type": "not_found_error", "message": "model: gpt-9"}}},
		{"openai without a token", "/v1/models", "", nil, 401, map[string]any{"error": map[string]any{
			"message": "missing client token: send Authorization: Bearer <token> or x-api-key", "type": "authentication_error",
			"param": nil, "code": "invalid_api_key"}}},
		{"anthropic with a wrong token", "/v1/models/gpt-4o", "", append([]string{"x-api-key", "nope"}, an...), 401,
			map[string]any{"type": "error", "error": map[string]any{"type": "authentication_error", "message": "invalid client token",
				"details": map[string]any{"error_code": "invalid_api_key"}}}},
	} {
		r := s.do(t, "GET", tt.path, tt.token, "", tt.hdr...)
		if r.code != tt.code {
			t.Errorf("%s: %d %s, want %d", tt.name, r.code, r.body, tt.code)
			continue
		}
		if diff := cmp.Diff(tt.want, jsonOf(t, r)); diff != "" {
			t.Errorf("%s: (-want +got)\n%s", tt.name, diff)
		}
	}
}

// Anthropic's list pages by limit, after_id and before_id; a bad limit is
// a 400 in its format.
func TestModelPages(t *testing.T) {
	t.Parallel()
	s := newServer(t, nil)
	an := []string{"anthropic-version", "2023-06-01"}
	for _, tt := range []struct {
		query    string
		ids      []any
		hasMore  bool
		wantCode int
	}{
		{"?limit=1", []any{"claude-sonnet"}, true, 200},
		{"?limit=1&after_id=claude-sonnet", []any{"gpt-4o"}, false, 200},
		{"?limit=1&before_id=gpt-4o", []any{"claude-sonnet"}, false, 200},
		{"?before_id=gpt-4o", []any{"claude-sonnet"}, false, 200},
		{"?after_id=gpt-4o", []any{}, false, 200},
		{"?after_id=d", []any{"gpt-4o"}, false, 200}, // not a listed id: the page starts where it sorts
		{"?limit=0", nil, false, 400},
		{"?limit=1001", nil, false, 400},
		{"?after_id=a&before_id=z", nil, false, 400},
	} {
		r := s.do(t, "GET", "/v1/models"+tt.query, tokAcme, "", an...)
		if r.code != tt.wantCode {
			t.Errorf("%s: %d %s, want %d", tt.query, r.code, r.body, tt.wantCode)
			continue
		}
		m := r.json(t)
		if r.code != 200 {
			if e, _ := m["error"].(map[string]any); m["type"] != "error" || e["type"] != "invalid_request_error" {
				t.Errorf("%s: %s, want Anthropic's invalid_request_error", tt.query, r.body)
			}
			continue
		}
		var ids []any
		for _, d := range m["data"].([]any) {
			ids = append(ids, d.(map[string]any)["id"])
		}
		if diff := cmp.Diff(tt.ids, ids, cmpopts.EquateEmpty()); diff != "" || m["has_more"] != tt.hasMore {
			t.Errorf("%s: ids (-want +got) %s, has_more %v", tt.query, diff, m["has_more"])
		}
	}
}

// count_tokens answers Bulwark's estimate of the prompt (four bytes a
// token) without queueing anything, and refuses what /v1/messages refuses
// the same way, in Anthropic's format.
func TestCountTokens(t *testing.T) {
	t.Parallel()
	s := newServer(t, nil)
	key := []string{"x-api-key", tokAcme}
	for _, tt := range []struct {
		name, body string
		hdr        []string
		code       int
		want       any
	}{
		{"estimate", `{"model":"claude-sonnet","system":"be brief","messages":[{"role":"user","content":"why is the sky blue?"}]}`,
			key, 200, map[string]any{"input_tokens": 7.0}}, // 8 bytes: 2, 20 bytes: 5
		{"with max_tokens all the same", `{"model":"claude-sonnet","max_tokens":10,"messages":[{"role":"user","content":"abcd"}]}`,
			key, 200, map[string]any{"input_tokens": 1.0}},
		{"unknown model", `{"model":"claude-opus-9","messages":[{"role":"user","content":"q"}]}`, key, 404,
			map[string]any{"type": "error", "error": map[string]any{"type": "not_found_error", "message": `unknown model "claude-opus-9"`,
				"details": map[string]any{"error_code": "model_not_found"}}}},
		{"last message from the assistant", `{"model":"claude-sonnet","messages":[{"role":"user","content":"q"},{"role":"assistant","content":"a"}]}`,
			key, 400, map[string]any{"type": "error", "error": map[string]any{"type": "invalid_request_error",
				"message": "messages: the last message must come from the user", "details": map[string]any{"error_code": "invalid_request"}}}},
		{"no messages", `{"model":"claude-sonnet","messages":[]}`, key, 400,
			map[string]any{"type": "error", "error": map[string]any{"type": "invalid_request_error",
				"message": "messages: at least one message is required", "details": map[string]any{"error_code": "invalid_request"}}}},
		{"no token", `{"model":"claude-sonnet","messages":[{"role":"user","content":"q"}]}`, nil, 401,
			map[string]any{"type": "error", "error": map[string]any{"type": "authentication_error",
				"message": "missing client token: send Authorization: Bearer <token> or x-api-key", "details": map[string]any{"error_code": "invalid_api_key"}}}},
	} {
		r := s.do(t, "POST", "/v1/messages/count_tokens", "", tt.body, tt.hdr...)
		if r.code != tt.code {
			t.Errorf("%s: %d %s, want %d", tt.name, r.code, r.body, tt.code)
			continue
		}
		if diff := cmp.Diff(tt.want, jsonOf(t, r)); diff != "" {
			t.Errorf("%s: (-want +got)\n%s", tt.name, diff)
		}
	}
	if n := len(s.queue.enqueued); n != 0 {
		t.Errorf("count_tokens enqueued %d requests", n)
	}
}

// A max_tokens above the model's maximum is refused as the dialect's
// provider refuses it: OpenAI's message on the field the caller used,
// Anthropic's naming the model the caller asked for.
func TestCompatMaxTokensAboveTheModel(t *testing.T) {
	t.Parallel()
	s := newServer(t, nil) // the fake intake's limit: 4096
	openAI := func(param string) map[string]any {
		return map[string]any{"error": map[string]any{"type": "invalid_request_error", "param": param, "code": nil,
			"message": param + " is too large: 4097. This model supports at most 4096 completion tokens, whereas you provided 4097."}}
	}
	for _, tt := range []struct {
		name, path, body string
		hdr              []string
		want             any
	}{
		{"openai max_tokens", "/v1/chat/completions", `{"model":"gpt-4o","max_tokens":4097,"messages":[{"role":"user","content":"q"}]}`,
			nil, openAI("max_tokens")},
		{"openai max_completion_tokens", "/v1/chat/completions",
			`{"model":"gpt-4o","max_completion_tokens":4097,"messages":[{"role":"user","content":"q"}]}`, nil, openAI("max_completion_tokens")},
		{"anthropic", "/v1/messages", `{"model":"claude-sonnet","max_tokens":4097,"messages":[{"role":"user","content":"q"}]}`,
			[]string{"anthropic-version", "2023-06-01"}, map[string]any{"type": "error", "error": map[string]any{"type": "invalid_request_error",
				"message": "max_tokens: 4097 > 4096, which is the maximum allowed number of output tokens for claude-sonnet"}}},
	} {
		r := s.do(t, "POST", tt.path, tokAcme, tt.body, tt.hdr...)
		if r.code != http.StatusBadRequest {
			t.Errorf("%s: %d %s, want 400", tt.name, r.code, r.body)
			continue
		}
		if diff := cmp.Diff(tt.want, jsonOf(t, r)); diff != "" {
			t.Errorf("%s: (-want +got)\n%s", tt.name, diff)
		}
	}
	if n := len(s.queue.enqueued); n != 0 {
		t.Errorf("refused calls enqueued %d requests", n)
	}
}
