package azure

import (
	sdk "github.com/openai/openai-go/v3"
	oaiazure "github.com/openai/openai-go/v3/azure"
	"github.com/openai/openai-go/v3/option"

	"bulwark/pkg/provider/openai"
	"bulwark/pkg/testkit/providertest"
	"bulwark/pkg/testkit/providertest/openaisdk"
)

// sdkHarness drives the official OpenAI SDK with its Azure options
// (github.com/openai/openai-go/v3/azure) for the conformance suite's SDK
// cases: the SDK addresses the deployment named by the model, adds the
// api-version and sends the api-key header (plain HTTP on loopback, which
// the SDK allows only when told).
func sdkHarness() *providertest.SDK {
	return openaisdk.Harness(openaisdk.Config{Model: "test-model", ToolErrorPrefix: openai.ToolErrorPrefix, StopReason: openai.StopReasonOf,
		NewClient: func(endpoint string) sdk.Client {
			return sdk.NewClient(oaiazure.WithEndpoint(endpoint, APIVersionDefault), oaiazure.WithAPIKey("client-token"),
				oaiazure.WithUnsafeAllowHTTP(), option.WithMaxRetries(0))
		}})
}
