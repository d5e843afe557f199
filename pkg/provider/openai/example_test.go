package openai_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"

	"bulwark/pkg/llm"
	"bulwark/pkg/provider/openai"
	"bulwark/pkg/secret"
)

// Complete returns a classified *llm.Error that the key pool, breaker and
// fallback branch on; a billing 429 is quota, not a rate limit.
func ExampleClient_Complete() {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("x-ratelimit-remaining-requests", "0")
		w.WriteHeader(http.StatusTooManyRequests)
		fmt.Fprint(w, `{"error":{"message":"You exceeded your current quota.","type":"insufficient_quota","param":null,"code":"insufficient_quota"}}`)
	}))
	defer srv.Close()

	client := openai.New(openai.Config{BaseURL: srv.URL}, srv.Client())
	_, err := client.Complete(context.Background(), llm.Credential{APIKey: secret.New("sk-test")}, &llm.Request{
		Model:    "gpt-4o-mini",
		Messages: []llm.Message{{Role: llm.RoleUser, Content: []llm.Block{{Type: llm.BlockText, Text: "hi"}}}},
	})
	var pe *llm.Error
	if errors.As(err, &pe) {
		fmt.Println(pe.Class, pe.Status, pe.Code, pe.RateLimit.Known)
	}
	// Output:
	// quota 429 insufficient_quota true
}
