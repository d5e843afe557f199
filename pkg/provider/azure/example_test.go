package azure_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"

	"bulwark/pkg/llm"
	"bulwark/pkg/provider/azure"
	"bulwark/pkg/secret"
)

// A provisioned (PTU) deployment's 429 is a rate limit with the code
// provisioned_capacity_full and the wait of retry-after-ms: the pool waits
// that long for the key instead of cooling it, and sends the request to
// another key meanwhile.
func ExampleClient_Complete() {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Println(r.URL.Path, r.URL.Query().Get("api-version"), r.Header.Get("api-key"))
		w.Header().Set("retry-after-ms", "250")
		w.Header().Set("retry-after", "1")
		w.WriteHeader(http.StatusTooManyRequests)
		fmt.Fprint(w, `{"error":{"code":"429","message":"Requests to the ChatCompletions_Create Operation have exceeded the capacity of this deployment."}}`)
	}))
	defer srv.Close()

	client := azure.New(azure.Config{BaseURL: srv.URL, PTUKeys: map[string]bool{"eastus-ptu": true}}, srv.Client())
	cred := llm.Credential{KeyID: "eastus-ptu", APIKey: secret.New("azure-key"), Deployment: "gpt4o-ptu"}
	_, err := client.Complete(context.Background(), cred, &llm.Request{
		Model:    "gpt4o",
		Messages: []llm.Message{{Role: llm.RoleUser, Content: []llm.Block{{Type: llm.BlockText, Text: "hi"}}}},
	})
	var pe *llm.Error
	if errors.As(err, &pe) {
		fmt.Println(pe.Class, pe.Code, pe.RetryAfter, azure.IsCapacityFull(err))
	}
	// Output:
	// /openai/deployments/gpt4o-ptu/chat/completions 2024-10-21 azure-key
	// rate_limited provisioned_capacity_full 250ms true
}
