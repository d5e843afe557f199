package embed

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"bulwark/pkg/secret"
)

func cosine(a, b []float32) float64 {
	var dot, na, nb float64
	for i := range a {
		dot += float64(a[i]) * float64(b[i])
		na += float64(a[i]) * float64(a[i])
		nb += float64(b[i]) * float64(b[i])
	}
	return dot / math.Sqrt(na*nb)
}

func embedOne(t *testing.T, e Embedder, s string) []float32 {
	t.Helper()
	v, err := e.Embed(context.Background(), []string{s})
	require.NoError(t, err)
	require.Len(t, v, 1)
	return v[0]
}

func TestLocalDeterministicAndNormalised(t *testing.T) {
	t.Parallel()
	l, err := NewLocal(0)
	require.NoError(t, err)
	require.Equal(t, DimsDefault, l.Dims())
	require.Equal(t, "local-ngram-384", l.Name())

	text := "OTA batch 2024-11 failed: ECU BMS reports P0A80 on VIN LSVAU2180N2183294"
	a := embedOne(t, l, text)
	// A fresh embedder gives the very same vector: nothing is seeded per
	// process, so every api process agrees.
	l2, err := NewLocal(384)
	require.NoError(t, err)
	b := embedOne(t, l2, text)
	require.Equal(t, a, b)

	var norm float64
	for _, x := range a {
		norm += float64(x) * float64(x)
	}
	require.InDelta(t, 1.0, norm, 1e-5, "L2-normalised")

	// Case and white space do not matter.
	c := embedOne(t, l, "  ota BATCH 2024-11\tfailed:\n\necu bms reports p0a80 on vin lsvau2180n2183294 ")
	require.Equal(t, a, c)

	// Empty and blank texts embed to the zero vector.
	for _, s := range []string{"", " \n\t "} {
		z := embedOne(t, l, s)
		require.Len(t, z, 384)
		for _, x := range z {
			require.Zero(t, x)
		}
	}
}

func TestLocalGolden(t *testing.T) {
	t.Parallel()
	// A pinned fingerprint of the vector of a fixed text: if this changes,
	// cached vectors in the field no longer match new ones, so the
	// embedder's Name must change with it.
	l, err := NewLocal(16)
	require.NoError(t, err)
	v := embedOne(t, l, "Hello, world")
	got := make([]string, len(v))
	for i, x := range v {
		got[i] = fmt.Sprintf("%.4f", x)
	}
	require.Equal(t, goldenHello16, strings.Join(got, " "))
}

// goldenHello16 is NewLocal(16)'s vector of "Hello, world", 4 decimals.
const goldenHello16 = "0.2582 0.0000 -0.2582 0.2582 0.2582 0.0000 0.0000 -0.2582 0.0000 0.2582 0.0000 0.2582 0.5164 0.5164 0.0000 0.0000"

func TestLocalSimilarity(t *testing.T) {
	t.Parallel()
	l, err := NewLocal(384)
	require.NoError(t, err)
	base := "You are a vehicle diagnosis assistant. Analyse the OTA log of the battery management update. " +
		"Vehicle VIN LSVAU2180N2183294, log captured 2024-11-03T08:15:22Z. The update of the BMS firmware " +
		"stopped at 63% with DTC P0A80 and the gateway reported a CAN timeout. What is the likely root cause " +
		"and which next diagnostic step do you recommend for the service engineer?"
	vinTime := strings.NewReplacer("LSVAU2180N2183294", "WDBRF61J43F123456", "2024-11-03T08:15:22Z", "2024-11-04T17:02:09Z").Replace(base)
	paraphrase := "Which fault most probably explains the failed flashing of the traction battery controller, " +
		"and what should a technician check first?"
	unrelated := "Write a haiku about autumn leaves falling on a quiet pond."

	a, b := embedOne(t, l, base), embedOne(t, l, vinTime)
	require.Greater(t, cosine(a, b), 0.95, "near-duplicate differing in VIN and timestamp")
	require.Less(t, cosine(a, embedOne(t, l, paraphrase)), 0.5, "paraphrase: lexical embedder scores it low (documented limit)")
	require.Less(t, cosine(a, embedOne(t, l, unrelated)), 0.3)
}

func TestNewConfig(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		cfg     Config
		want    string
		wantErr string
	}{
		{name: "zero is local 384", cfg: Config{}, want: "local-ngram-384"},
		{name: "local dims", cfg: Config{Kind: "local", Dims: 128}, want: "local-ngram-128"},
		{name: "local too big", cfg: Config{Dims: DimsMax + 1}, wantErr: "dims"},
		{name: "local negative", cfg: Config{Dims: -1}, wantErr: "dims"},
		{name: "openai default model", cfg: Config{Kind: "openai"}, want: "openai-text-embedding-3-small-1536"},
		{name: "openai other model needs dims", cfg: Config{Kind: "openai", OpenAI: OpenAIConfig{Model: "nomic-embed-text"}}, wantErr: "OpenAIConfig.Dims"},
		{name: "openai other model", cfg: Config{Kind: "openai", OpenAI: OpenAIConfig{Model: "nomic-embed-text", Dims: 768}}, want: "openai-nomic-embed-text-768"},
		{name: "openai bad url", cfg: Config{Kind: "openai", OpenAI: OpenAIConfig{BaseURL: "localhost:11434"}}, wantErr: "OpenAIConfig.BaseURL"},
		{name: "openai batch", cfg: Config{Kind: "openai", OpenAI: OpenAIConfig{BatchSize: 5000}}, wantErr: "OpenAIConfig.BatchSize"},
		{name: "unknown kind", cfg: Config{Kind: "bert"}, wantErr: "Config.Kind"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			e, err := New(tt.cfg)
			if tt.wantErr != "" {
				require.ErrorContains(t, err, tt.wantErr)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tt.want, e.Name())
		})
	}
}

// fakeEmbeddings is an httptest handler speaking OpenAI's embeddings wire
// format: vector i of a request is [len(input_i), index, 0, ...].
type fakeEmbeddings struct {
	dims     int
	requests chan embeddingsRequest
	auth     chan string
	status   int
	errBody  string
	// shuffle answers data in reverse order, as the API may.
	shuffle bool
}

func (f *fakeEmbeddings) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || r.URL.Path != "/v1/embeddings" {
		http.Error(w, "not found", http.StatusNotFound)
		return
	}
	if f.auth != nil {
		f.auth <- r.Header.Get("Authorization")
	}
	var req embeddingsRequest
	body, _ := io.ReadAll(r.Body)
	if err := json.Unmarshal(body, &req); err != nil {
		http.Error(w, "bad json", http.StatusBadRequest)
		return
	}
	if f.requests != nil {
		f.requests <- req
	}
	if f.status != 0 {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(f.status)
		io.WriteString(w, f.errBody)
		return
	}
	type datum struct {
		Object    string    `json:"object"`
		Index     int       `json:"index"`
		Embedding []float32 `json:"embedding"`
	}
	resp := struct {
		Object string  `json:"object"`
		Data   []datum `json:"data"`
		Model  string  `json:"model"`
		Usage  struct {
			PromptTokens int `json:"prompt_tokens"`
			TotalTokens  int `json:"total_tokens"`
		} `json:"usage"`
	}{Object: "list", Model: req.Model}
	for i, s := range req.Input {
		v := make([]float32, f.dims)
		v[0], v[1] = float32(len(s)), float32(i)
		resp.Data = append(resp.Data, datum{Object: "embedding", Index: i, Embedding: v})
	}
	if f.shuffle {
		for i, j := 0, len(resp.Data)-1; i < j; i, j = i+1, j-1 {
			resp.Data[i], resp.Data[j] = resp.Data[j], resp.Data[i]
		}
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(resp)
}

func TestOpenAIEmbed(t *testing.T) {
	t.Parallel()
	f := &fakeEmbeddings{dims: 8, requests: make(chan embeddingsRequest, 10), auth: make(chan string, 10), shuffle: true}
	srv := httptest.NewServer(f)
	defer srv.Close()

	e, err := NewOpenAI(OpenAIConfig{
		BaseURL: srv.URL + "/v1/", Model: "nomic-embed-text", Dims: 8, SendDimensions: true,
		APIKey: secret.New("sk-test-123"), BatchSize: 2,
	})
	require.NoError(t, err)
	texts := []string{"a", "bb", "", "dddd", "eeeee"}
	vecs, err := e.Embed(context.Background(), texts)
	require.NoError(t, err)
	require.Len(t, vecs, len(texts))
	for i, v := range vecs {
		want := float32(len(texts[i]))
		if texts[i] == "" {
			want = 1 // sent as " "
		}
		require.Equal(t, want, v[0], "vector %d in input order", i)
		require.Equal(t, float32(i%2), v[1], "index within its batch")
	}
	// Three requests of at most 2 inputs, each with model, float format and
	// dimensions, and the bearer key.
	for _, n := range []int{2, 2, 1} {
		req := <-f.requests
		require.Len(t, req.Input, n)
		require.Equal(t, "nomic-embed-text", req.Model)
		require.Equal(t, "float", req.EncodingFormat)
		require.Equal(t, 8, req.Dimensions)
		require.Equal(t, "Bearer sk-test-123", <-f.auth)
	}
}

func TestOpenAINoKeyNoDimensions(t *testing.T) {
	t.Parallel()
	f := &fakeEmbeddings{dims: 4, requests: make(chan embeddingsRequest, 1), auth: make(chan string, 1)}
	srv := httptest.NewServer(f)
	defer srv.Close()
	e, err := NewOpenAI(OpenAIConfig{BaseURL: srv.URL + "/v1", Model: "m", Dims: 4})
	require.NoError(t, err)
	_, err = e.Embed(context.Background(), []string{"x"})
	require.NoError(t, err)
	require.Empty(t, <-f.auth)
	require.Zero(t, (<-f.requests).Dimensions)
}

func TestOpenAIErrors(t *testing.T) {
	t.Parallel()
	const key = "sk-secret-abcdef"
	tests := []struct {
		name    string
		f       *fakeEmbeddings
		dims    int
		wantIs  error
		wantMsg string
	}{
		{
			name: "401 echoing the key",
			f: &fakeEmbeddings{dims: 4, status: 401, errBody: `{"error":{"message":"Incorrect API key provided: ` + key +
				`. You can find your API key at https://platform.openai.com/account/api-keys.","type":"invalid_request_error","param":null,"code":"invalid_api_key"}}`},
			dims: 4, wantIs: ErrStatus, wantMsg: "status 401 (invalid_request_error/invalid_api_key)",
		},
		{
			name:   "429 plain text",
			f:      &fakeEmbeddings{dims: 4, status: 429, errBody: strings.Repeat("slow down ", 100)},
			dims:   4,
			wantIs: ErrStatus, wantMsg: "status 429: slow down",
		},
		{name: "wrong length", f: &fakeEmbeddings{dims: 5}, dims: 4, wantMsg: "length 5, configured Dims is 4"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			srv := httptest.NewServer(tt.f)
			defer srv.Close()
			e, err := NewOpenAI(OpenAIConfig{BaseURL: srv.URL + "/v1", Model: "m", Dims: tt.dims, APIKey: secret.New(key)})
			require.NoError(t, err)
			_, err = e.Embed(context.Background(), []string{"x"})
			require.Error(t, err)
			if tt.wantIs != nil {
				require.ErrorIs(t, err, tt.wantIs)
				var se *StatusError
				require.ErrorAs(t, err, &se)
				require.Equal(t, tt.f.status, se.StatusCode)
				require.LessOrEqual(t, len(se.Message), maxErrorMessage+len("…"))
			}
			require.ErrorContains(t, err, tt.wantMsg)
			require.NotContains(t, err.Error(), key)
			require.NotContains(t, fmt.Sprintf("%+v %#v", err, err), key)
		})
	}
}

func TestOpenAITimeout(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	defer srv.Close()
	defer close(release)
	e, err := NewOpenAI(OpenAIConfig{BaseURL: srv.URL + "/v1", Model: "m", Dims: 4, Timeout: 50 * time.Millisecond})
	require.NoError(t, err)
	_, err = e.Embed(context.Background(), []string{"x"})
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.ErrorContains(t, err, "embed: openai: POST embeddings")
	require.False(t, errors.Is(err, ErrStatus))
}

// The embedder never follows a redirect: it would carry the key to
// wherever the server points.
func TestOpenAIFollowsNoRedirect(t *testing.T) {
	t.Parallel()
	var elsewhere atomic.Int32
	target := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { elsewhere.Add(1) }))
	defer target.Close()
	redirect := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, target.URL+r.URL.Path, http.StatusTemporaryRedirect)
	}))
	defer redirect.Close()
	e, err := NewOpenAI(OpenAIConfig{BaseURL: redirect.URL + "/v1", Model: "m", Dims: 4, APIKey: secret.New("sk-redirected")})
	require.NoError(t, err)
	_, err = e.Embed(context.Background(), []string{"x"})
	require.Error(t, err)
	require.Zero(t, elsewhere.Load(), "the redirect was followed")
}
