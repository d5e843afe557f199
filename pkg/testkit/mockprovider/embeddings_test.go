package mockprovider

import (
	"encoding/base64"
	"encoding/binary"
	"math"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func cosine(a, b []float32) float64 {
	var s float64
	for i := range a {
		s += float64(a[i]) * float64(b[i])
	}
	return s
}

func TestEmbedSimilarity(t *testing.T) {
	t.Parallel()
	const q = "Why did the OTA update fail on vehicle 17 with error E42?"
	tests := []struct {
		name     string
		a, b     string
		min, max float64
	}{
		{"identical", q, q, 0.9999, 1.0001},
		{"case, spacing, punctuation", q, "why did the  ota update fail on vehicle 17, with error e42", 0.9999, 1.0001},
		{"one word differs", q, "Why did the OTA update fail on vehicle 18 with error E42?", 0.85, 0.99},
		{"reworded", q, "OTA update failed on vehicle 17 with error E42, why?", 0.7, 0.95},
		{"spelling variant", "Summarise the diagnosis for case 1234", "Summarize the diagnosis for case 1234", 0.8, 0.99},
		{"unrelated", q, "What is the recommended tyre pressure for winter driving?", -0.3, 0.3},
		{"unrelated, no common words", "battery voltage dropped below threshold during flashing",
			"The infotainment screen shows a blank display after reboot", -0.3, 0.3},
	}
	for _, dims := range []int{EmbeddingDimsDefault, 1536} {
		for _, tt := range tests {
			a, b := Embed(tt.a, dims), Embed(tt.b, dims)
			if len(a) != dims {
				t.Fatalf("len = %d, want %d", len(a), dims)
			}
			if c := cosine(a, b); c < tt.min || c > tt.max {
				t.Errorf("dims %d, %s: cosine %.3f, want in [%.2f, %.2f]", dims, tt.name, c, tt.min, tt.max)
			}
		}
	}
	near := cosine(Embed(q, 256), Embed("Why did the OTA update fail on vehicle 18 with error E42?", 256))
	far := cosine(Embed(q, 256), Embed("What is the recommended tyre pressure for winter driving?", 256))
	if near < far+0.5 {
		t.Errorf("near-duplicate %.3f not well above unrelated %.3f", near, far)
	}
}

func TestEmbedIsNormalisedAndDeterministic(t *testing.T) {
	t.Parallel()
	for _, text := range []string{"x", "brake warning", strings.Repeat("long text ", 500), " ", "!!!", "日本語のテキスト"} {
		v := Embed(text, 64)
		var n float64
		for _, f := range v {
			n += float64(f) * float64(f)
		}
		if math.Abs(n-1) > 1e-5 {
			t.Errorf("%q: |v|² = %f, want 1", text, n)
		}
		if diff := cmp.Diff(v, Embed(text, 64)); diff != "" {
			t.Errorf("%q: not deterministic", text)
		}
	}
	if v := Embed(" ", 8); v[0] != 1 {
		t.Errorf("a text without words = %v, want e0", v)
	}
}

type embeddingsReply struct {
	Object string `json:"object"`
	Data   []struct {
		Object    string    `json:"object"`
		Index     int       `json:"index"`
		Embedding []float32 `json:"embedding"`
	} `json:"data"`
	Model string         `json:"model"`
	Usage map[string]int `json:"usage"`
}

func TestEmbeddingsEndpoint(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{DefaultLimits: Limits{RPM: 100, TPM: 1000}, Window: time.Minute})
	inputs := []string{"brake warning on car 17", "OTA failed"}
	r := b.embed(t, "k", map[string]any{"model": "text-embedding-3-small", "input": inputs})
	wantStatus(t, r, http.StatusOK)
	var got embeddingsReply
	r.decode(t, &got)
	tokens := CountTokens(inputs[0]) + CountTokens(inputs[1])
	if got.Object != "list" || got.Model != "text-embedding-3-small" || len(got.Data) != 2 ||
		got.Usage["prompt_tokens"] != tokens || got.Usage["total_tokens"] != tokens {
		t.Fatalf("response = %s", r.body)
	}
	for i, d := range got.Data {
		if d.Object != "embedding" || d.Index != i {
			t.Errorf("data[%d] = %s %d", i, d.Object, d.Index)
		}
		if diff := cmp.Diff(Embed(inputs[i], EmbeddingDimsDefault), d.Embedding); diff != "" {
			t.Errorf("data[%d] is not Embed(input, 256)", i)
		}
	}
	// Only input tokens are charged: no output reservation.
	if got := r.headerInt(t, "x-ratelimit-remaining-tokens"); got != 1000-tokens {
		t.Errorf("remaining tokens = %d, want %d", got, 1000-tokens)
	}

	// A single string, "dimensions", base64.
	r = b.embed(t, "k", map[string]any{"model": "m", "input": "OTA failed", "dimensions": 32, "encoding_format": "base64"})
	wantStatus(t, r, http.StatusOK)
	var b64 struct {
		Data []struct {
			Embedding string `json:"embedding"`
		} `json:"data"`
	}
	r.decode(t, &b64)
	raw, err := base64.StdEncoding.DecodeString(b64.Data[0].Embedding)
	if err != nil || len(raw) != 4*32 {
		t.Fatalf("base64 embedding: %d bytes, %v", len(raw), err)
	}
	vec := make([]float32, 32)
	for i := range vec {
		vec[i] = math.Float32frombits(binary.LittleEndian.Uint32(raw[4*i:]))
	}
	if diff := cmp.Diff(Embed("OTA failed", 32), vec); diff != "" {
		t.Errorf("base64 vector differs from Embed(-want +got):\n%s", diff)
	}

	st := b.srv.Stats()
	if c := st.Keys[Fingerprint("k")]; c.Embeddings != 2 || c.EmbeddingInputs != 3 || c.OK != 2 || c.OutputTokens != 0 {
		t.Errorf("key stats = %+v", c)
	}
	if c := st.Providers["openai"]; c.Embeddings != 2 {
		t.Errorf("openai totals = %+v", c)
	}
}

func TestEmbeddingsInvalid(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{EmbeddingDims: 16})
	tests := []struct {
		name string
		key  string
		body any
		code int
		msg  string
	}{
		{"no key", "", map[string]any{"model": "m", "input": "x"}, 401, "API key"},
		{"no model", "k", map[string]any{"input": "x"}, 400, "model"},
		{"no input", "k", map[string]any{"model": "m"}, 400, "input"},
		{"empty string", "k", map[string]any{"model": "m", "input": ""}, 400, "input"},
		{"empty list", "k", map[string]any{"model": "m", "input": []string{}}, 400, "input"},
		{"token arrays", "k", map[string]any{"model": "m", "input": []int{1, 2}}, 400, "token arrays"},
		{"dimensions", "k", map[string]any{"model": "m", "input": "x", "dimensions": 0}, 400, "dimensions"},
		{"encoding", "k", map[string]any{"model": "m", "input": "x", "encoding_format": "hex"}, 400, "encoding_format"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := b.embed(t, tt.key, tt.body)
			wantStatus(t, r, tt.code)
			var e openAIErrorBody
			r.decode(t, &e)
			if !strings.Contains(e.Error.Message, tt.msg) || e.Error.Type != "invalid_request_error" {
				t.Errorf("body = %s", r.body)
			}
		})
	}
	r := b.embed(t, "k", map[string]any{"model": "m", "input": "x"})
	var got embeddingsReply
	r.decode(t, &got)
	if len(got.Data[0].Embedding) != 16 {
		t.Errorf("Config.EmbeddingDims 16: got %d dims", len(got.Data[0].Embedding))
	}
}
