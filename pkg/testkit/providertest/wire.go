package providertest

import (
	"bytes"
	"strings"
	"testing"

	"bulwark/pkg/llm"
	"bulwark/pkg/testkit/wiretest"
)

// sharedBadRequests are bodies every provider refuses with the same words.
var sharedBadRequests = []BadRequest{
	{"not JSON: cut off", `{"model":`, "invalid JSON"},
	{"not JSON: open bracket", `[`, "invalid JSON"},
	{"not JSON: text", `model=x`, "invalid JSON"},
}

func (h *Harness) testWire(t *testing.T) {
	t.Run("RequestGolden", func(t *testing.T) {
		t.Parallel()
		for _, tc := range wiretest.Requests() {
			t.Run(tc.Name, func(t *testing.T) {
				t.Parallel()
				body, err := h.Wire.EncodeRequest(tc.Value)
				if err != nil {
					t.Fatal(err)
				}
				wiretest.Golden(t, "request_"+tc.Name+".json", body)

				info, got, err := h.Wire.DecodeRequest(body)
				if err != nil {
					t.Fatalf("DecodeRequest(EncodeRequest(x)): %v", err)
				}
				want, model := tc.Value, tc.Value.Model
				if h.Wire.NoModelInBody {
					want, model = h.Wire.withoutModel(want), ""
				}
				if d := wiretest.Diff(want, got); d != "" {
					t.Errorf("DecodeRequest(EncodeRequest(x)) != x (-want +got):\n%s", d)
				}
				if info.Model != model || info.Stream || len(info.Ignored) != 0 {
					t.Errorf("info = %+v", info)
				}
			})
		}
	})

	t.Run("ResponseGolden", func(t *testing.T) {
		t.Parallel()
		for _, tc := range wiretest.Responses() {
			t.Run(tc.Name, func(t *testing.T) {
				t.Parallel()
				body, err := h.Wire.EncodeResponse(tc.Value, "")
				if err != nil {
					t.Fatal(err)
				}
				wiretest.Golden(t, "response_"+tc.Name+".json", body)

				got, err := h.Wire.DecodeResponse(body)
				if err != nil {
					t.Fatalf("DecodeResponse(EncodeResponse(x)): %v", err)
				}
				if d := wiretest.Diff(tc.Value, got); d != "" {
					t.Errorf("DecodeResponse(EncodeResponse(x)) != x (-want +got):\n%s", d)
				}
			})
		}
	})

	t.Run("StreamGolden", func(t *testing.T) {
		t.Parallel()
		if h.Wire.WriteStream == nil {
			t.Skip("no stream writer (Wire.WriteStream): the adapter writes no event streams")
		}
		var b bytes.Buffer
		info := Info{Model: h.Model, Stream: true, IncludeUsage: true}
		if err := h.Wire.WriteStream(&b, wiretest.Responses()[1].Value, info); err != nil {
			t.Fatal(err)
		}
		wiretest.GoldenText(t, "stream_tool_use_parallel.sse", b.Bytes())
	})

	t.Run("BadRequests", func(t *testing.T) {
		t.Parallel()
		for _, tt := range append(append([]BadRequest{}, sharedBadRequests...), h.BadRequests...) {
			t.Run(tt.Name, func(t *testing.T) {
				t.Parallel()
				_, _, err := h.Wire.DecodeRequest([]byte(tt.Body))
				if err == nil || !strings.Contains(err.Error(), tt.Want) {
					t.Errorf("DecodeRequest error = %v, want it to contain %q", err, tt.Want)
				}
			})
		}
	})
}

// withoutModel returns a copy of r without its model, for a wire whose
// body does not carry it (Wire.NoModelInBody).
func (w Wire) withoutModel(r *llm.Request) *llm.Request {
	c := *r
	c.Model = ""
	return &c
}
