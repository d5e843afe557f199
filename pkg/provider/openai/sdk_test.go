package openai

import (
	sdk "github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"bulwark/pkg/testkit/providertest"
	"bulwark/pkg/testkit/providertest/openaisdk"
)

// sdkHarness drives the official OpenAI SDK for the conformance suite's SDK
// cases.
func sdkHarness() *providertest.SDK {
	return openaisdk.Harness(openaisdk.Config{Model: "gpt-4o", ToolErrorPrefix: ToolErrorPrefix, StopReason: StopReasonOf,
		NewClient: func(baseURL string) sdk.Client {
			return sdk.NewClient(option.WithBaseURL(baseURL+"/v1/"), option.WithAPIKey("client-token"), option.WithMaxRetries(0))
		}})
}
