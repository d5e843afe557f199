package provider_test

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"bulwark/pkg/llm"
	"bulwark/pkg/provider/anthropic"
	"bulwark/pkg/provider/openai"
	"bulwark/pkg/testkit/wiretest"
)

// codec is one provider's request and response translation.
type codec struct {
	name           string
	encodeRequest  func(*llm.Request) ([]byte, error)
	decodeRequest  func([]byte) (*llm.Request, error)
	encodeResponse func(*llm.Response) ([]byte, error)
	decodeResponse func([]byte) (*llm.Response, error)
}

var codecs = []codec{
	{
		name:          "claude",
		encodeRequest: anthropic.EncodeRequest,
		decodeRequest: func(b []byte) (*llm.Request, error) {
			_, r, err := anthropic.DecodeRequest(b)
			return r, err
		},
		encodeResponse: func(r *llm.Response) ([]byte, error) { return anthropic.EncodeResponse(r, "") },
		decodeResponse: anthropic.DecodeResponse,
	},
	{
		name:          "openai",
		encodeRequest: openai.EncodeRequest,
		decodeRequest: func(b []byte) (*llm.Request, error) {
			_, r, err := openai.DecodeRequest(b)
			return r, err
		},
		encodeResponse: func(r *llm.Response) ([]byte, error) { return openai.EncodeResponse(r, "") },
		decodeResponse: openai.DecodeResponse,
	},
}

// TestCrossProviderRequests is what fallback does: a request that arrived in
// one provider's shape is decoded, re-encoded in the other provider's shape,
// and must mean the same thing there. Starting from each golden wire body
// (what a client of the compat endpoint sends), both orders must be
// lossless.
func TestCrossProviderRequests(t *testing.T) {
	t.Parallel()
	for _, tc := range wiretest.Requests() {
		for _, from := range codecs {
			for _, to := range codecs {
				if from.name == to.name {
					continue
				}
				t.Run(tc.Name+"/"+from.name+"_to_"+to.name, func(t *testing.T) {
					t.Parallel()
					wire, err := os.ReadFile(filepath.Join(dirOf(from.name), "testdata", "request_"+tc.Name+".json"))
					if err != nil {
						t.Fatal(err)
					}
					first, err := from.decodeRequest(wire)
					if err != nil {
						t.Fatalf("%s decode: %v", from.name, err)
					}
					if d := wiretest.Diff(tc.Value, first); d != "" {
						t.Fatalf("%s golden decodes to something else (-want +got):\n%s", from.name, d)
					}
					other, err := to.encodeRequest(first)
					if err != nil {
						t.Fatalf("%s encode: %v", to.name, err)
					}
					second, err := to.decodeRequest(other)
					if err != nil {
						t.Fatalf("%s decode: %v", to.name, err)
					}
					if d := wiretest.Diff(first, second); d != "" {
						t.Errorf("%s → llm → %s → llm is lossy (-want +got):\n%s", from.name, to.name, d)
					}
					back, err := from.encodeRequest(second)
					if err != nil {
						t.Fatal(err)
					}
					if d := wiretest.Diff(string(compact(t, wire)), string(back)); d != "" {
						t.Errorf("the wire body did not come back byte for byte (-want +got):\n%s", d)
					}
				})
			}
		}
	}
}

// TestCrossProviderResponses: an answer from one provider served in the
// other provider's shape (fallback behind a compat endpoint) keeps its
// content, stop reason and usage.
func TestCrossProviderResponses(t *testing.T) {
	t.Parallel()
	for _, tc := range wiretest.Responses() {
		for _, from := range codecs {
			for _, to := range codecs {
				if from.name == to.name {
					continue
				}
				t.Run(tc.Name+"/"+from.name+"_to_"+to.name, func(t *testing.T) {
					t.Parallel()
					wire, err := from.encodeResponse(tc.Value)
					if err != nil {
						t.Fatal(err)
					}
					first, err := from.decodeResponse(wire)
					if err != nil {
						t.Fatal(err)
					}
					other, err := to.encodeResponse(first)
					if err != nil {
						t.Fatal(err)
					}
					second, err := to.decodeResponse(other)
					if err != nil {
						t.Fatal(err)
					}
					if d := wiretest.Diff(tc.Value, second); d != "" {
						t.Errorf("%s → %s is lossy (-want +got):\n%s", from.name, to.name, d)
					}
				})
			}
		}
	}
}

// compact strips the indentation of a golden file.
func compact(t *testing.T, b []byte) []byte {
	t.Helper()
	var out bytes.Buffer
	if err := json.Compact(&out, b); err != nil {
		t.Fatal(err)
	}
	return out.Bytes()
}

// dirOf is the package folder of a provider.
func dirOf(provider string) string {
	if provider == "claude" {
		return "anthropic"
	}
	return provider
}
