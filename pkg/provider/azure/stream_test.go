package azure

import (
	"net/http"
	"os"
	"path/filepath"
	"testing"

	"bulwark/pkg/llm"
	"bulwark/pkg/secret"
	"bulwark/pkg/testkit/providertest"
	"bulwark/pkg/testkit/wiretest"
)

// Azure's stream opens with a chunk of prompt filter results that has no
// id, model or choice, and its chunks carry content filter results: the
// answer is OpenAI's all the same. Stream goes where Complete goes: the
// key's resource and deployment, its api-key.
func TestStream(t *testing.T) {
	t.Parallel()
	stream, err := os.ReadFile(filepath.Join("testdata", "stream_content_filter.sse"))
	if err != nil {
		t.Fatal(err)
	}
	srv, ch := recorder(t, http.StatusOK, map[string]string{"x-ratelimit-remaining-requests": "19"}, string(stream))
	c := New(Config{}, srv.Client())
	cred := llm.Credential{KeyID: "k", APIKey: secret.New("key-1"), Endpoint: srv.URL, Deployment: "gpt4o-dep"}
	var deltas []llm.Delta
	res, err := c.Stream(t.Context(), cred, request("gpt4o"), func(d llm.Delta) { deltas = append(deltas, d) })
	if err != nil {
		t.Fatal(err)
	}
	got := <-ch
	if got.path != "/openai/deployments/gpt4o-dep/chat/completions" || got.query["api-version"][0] != APIVersionDefault {
		t.Errorf("request to %s?%v", got.path, got.query)
	}
	if got.header.Get("api-key") != "key-1" || got.header.Get("Accept") != "text/event-stream" {
		t.Errorf("headers %v", got.header)
	}
	want := &llm.Response{ID: "chatcmpl-AzUre1x2y3z4", Model: "gpt-4o-2024-08-06",
		Content:    []llm.Block{{Type: llm.BlockText, Text: "Hello! How can I help?"}},
		StopReason: llm.StopEndTurn, Usage: llm.Usage{InputTokens: 19, OutputTokens: 9}}
	if d := wiretest.Diff(want, res.Response); d != "" {
		t.Errorf("answer (-want +got):\n%s", d)
	}
	if res.RateLimit.RequestsRemaining != 19 {
		t.Errorf("rate limit %+v", res.RateLimit)
	}
	providertest.CheckDeltas(t, deltas, res.Response.Content)
}

// Stream authenticates as Complete does: here with an Entra token.
func TestStreamEntra(t *testing.T) {
	t.Parallel()
	srv, ch := recorder(t, http.StatusOK, nil, "data: [DONE]\n\n")
	c := New(Config{BaseURL: srv.URL, Auth: AuthEntra, Token: &tokenSource{token: "eyJ0eXAi.entra.token"}}, srv.Client())
	if _, err := c.Stream(t.Context(), llm.Credential{KeyID: "k"}, request("gpt4o"), nil); err != nil {
		t.Fatal(err)
	}
	if got := <-ch; got.header.Get("Authorization") != "Bearer eyJ0eXAi.entra.token" || got.header.Get("api-key") != "" {
		t.Errorf("headers %v", got.header)
	}
}
