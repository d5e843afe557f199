package service_test

import (
	"strings"
	"testing"
	"time"

	"bulwark/pkg/testkit/mockprovider"
)

// A fallback chain longer than one hop, across wire formats: claude/sonnet
// refused (overloaded) goes to Claude on Bedrock (SigV4, InvokeModel);
// with Bedrock refused too, to OpenAI. Each hop is its own route with its
// own keys; the answer is the same question's.
func TestFallbackChainThroughBedrock(t *testing.T) {
	t.Parallel()
	s := newSystem(t, opts{
		extraYML:     "cache: {enabled: false}",
		providersYML: `  bedrock: {kind: bedrock, base_url: "{mock}", timeout: 10s, tiers: {sonnet: anthropic.claude-sonnet-4-5-v1:0}}`,
		fallbackYML:  "fallback:\n  claude/sonnet: [bedrock/sonnet, openai/gpt4o]",
		keysYML: defaultKeys + `
  - {id: br-use1, provider: bedrock, model_tier: sonnet, region: us-east-1, rpm_limit: 600, tpm_limit: 400000}
  - {id: br-euw1, provider: bedrock, model_tier: sonnet, region: eu-west-1, rpm_limit: 600, tpm_limit: 400000}`,
	})
	api := s.startAPI()
	s.startWorker()
	if err := s.mock.SetFault(mockprovider.Fault{Provider: "claude", Mode: mockprovider.FaultOverloaded}); err != nil {
		t.Fatal(err)
	}
	id := api.submit(t, ask("which hop answers?"))
	out := api.waitStatus(t, id, 20*time.Second, "completed", "failed")
	res, _ := out["result"].(map[string]any)
	if out["status"] != "completed" || res["provider"] != "bedrock" || res["content"] != mockprovider.Reply("which hop answers?") {
		t.Fatalf("with claude refused: %v", out)
	}
	// Streamed, Bedrock's event stream reaches the caller as deltas.
	body := ask("stream the hop")
	body["stream"] = true
	id = api.submit(t, body)
	ch, stop := stream(t, api.ts.URL+"/v1/requests/"+id+"/events", devToken, "")
	var text strings.Builder
	for ev := next(t, ch, 20*time.Second, "delta", "completed", "failed"); ev.Type != "completed"; ev = next(t, ch, 20*time.Second, "delta", "completed", "failed") {
		if ev.Type != "delta" {
			t.Fatalf("streamed through bedrock: %s %v", ev.Type, ev.Data)
		}
		addDeltas(t, &text, ev)
	}
	stop()
	if text.String() != mockprovider.Reply("stream the hop") {
		t.Fatalf("bedrock's deltas carry %q", text.String())
	}
	if err := s.mock.SetFault(mockprovider.Fault{Provider: "bedrock", Mode: mockprovider.FaultOverloaded}); err != nil {
		t.Fatal(err)
	}
	id = api.submit(t, ask("and the second hop?"))
	out = api.waitStatus(t, id, 20*time.Second, "completed", "failed")
	res, _ = out["result"].(map[string]any)
	if out["status"] != "completed" || res["provider"] != "openai" || res["content"] != mockprovider.Reply("and the second hop?") {
		t.Fatalf("with claude and bedrock refused: %v", out)
	}
}

// Azure OpenAI (deployments, api-key) and a local OpenAI-compatible model
// as routes of their own: a routing rule sends the router layer to the
// local model first; a request for azure/gpt4o is served by its PTU key.
func TestAzureAndLocalRoutes(t *testing.T) {
	t.Parallel()
	s := newSystem(t, opts{
		extraYML: "cache: {enabled: false}\nrouting: [{layer: router, route: local/qwen}]",
		providersYML: `  azure: {kind: azure, base_url: "{mock}", timeout: 10s, tiers: {gpt4o: gpt4o-standard}}
  local: {base_url: "{mock}", timeout: 10s, tiers: {qwen: "qwen2.5:7b"}}`,
		keysYML: defaultKeys + `
  - {id: az-ptu, provider: azure, model_tier: gpt4o, api_key: "mock-azure-key", deployment: gpt4o-ptu, ptu: true, rpm_limit: 600, tpm_limit: 400000}
  - {id: qwen-1, provider: local, model_tier: qwen, api_key: "mock-local-key", max_in_flight: 2}`,
	})
	api := s.startAPI()
	s.startWorker()

	body := ask("route me to the edge")
	body["cache_layer"] = "router"
	id := api.submit(t, body)
	out := api.waitStatus(t, id, 20*time.Second, "completed", "failed")
	if res, _ := out["result"].(map[string]any); out["status"] != "completed" || res["provider"] != "local" ||
		res["content"] != mockprovider.Reply("route me to the edge") {
		t.Fatalf("router layer: %v", out)
	}

	body = ask("azure please")
	body["provider"], body["model_tier"] = "azure", "gpt4o"
	id = api.submit(t, body)
	out = api.waitStatus(t, id, 20*time.Second, "completed", "failed")
	if res, _ := out["result"].(map[string]any); out["status"] != "completed" || res["provider"] != "azure" ||
		res["content"] != mockprovider.Reply("azure please") {
		t.Fatalf("azure route: %v", out)
	}
	if st := s.mock.Stats().Providers["azure"]; st.OK != 1 {
		t.Fatalf("the mock's Azure endpoint answered %d calls, want 1: %+v", st.OK, st)
	}
}
