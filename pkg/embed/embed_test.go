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

	"bulwark/pkg/llm"
	"bulwark/pkg/provider"
	"bulwark/pkg/provider/openai"
	"bulwark/pkg/secret"
	"bulwark/pkg/testkit/mockprovider"
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
		name      string
		f         *fakeEmbeddings
		dims      int
		wantClass llm.Class // "" for an error that is no *llm.Error
		wantCode  string
		wantMsg   string
	}{
		{
			name: "401 echoing the key",
			f: &fakeEmbeddings{dims: 4, status: 401, errBody: `{"error":{"message":"Incorrect API key provided: ` + key +
				`. You can find your API key at https://platform.openai.com/account/api-keys.","type":"invalid_request_error","param":null,"code":"invalid_api_key"}}`},
			dims: 4, wantClass: llm.ClassAuth, wantCode: "invalid_api_key",
			wantMsg: "auth (HTTP 401 invalid_api_key): Incorrect API key provided: [redacted]",
		},
		{
			name:      "429 plain text",
			f:         &fakeEmbeddings{dims: 4, status: 429, errBody: strings.Repeat("slow down ", 100)},
			dims:      4,
			wantClass: llm.ClassRateLimited, wantMsg: "rate_limited (HTTP 429): slow down",
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
			var pe *llm.Error
			if tt.wantClass != "" {
				require.ErrorAs(t, err, &pe)
				require.Equal(t, tt.wantClass, pe.Class)
				require.Equal(t, tt.f.status, pe.Status)
				require.Equal(t, tt.wantCode, pe.Code)
				require.Equal(t, llm.ProviderOpenAI, pe.Provider)
				require.LessOrEqual(t, len(pe.Message), provider.MaxMessageLen)
			} else {
				_, classified := llm.ClassOf(err)
				require.False(t, classified, "a malformed 200 of the right shape is no provider failure: %v", err)
			}
			require.ErrorContains(t, err, "embed: openai: ")
			require.ErrorContains(t, err, tt.wantMsg)
			require.NotContains(t, err.Error(), key)
			require.NotContains(t, fmt.Sprintf("%+v %#v", err, err), key)
			if pe != nil {
				require.NotContains(t, fmt.Sprintf("%#v", *pe), key)
			}
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

	// Its own Timeout is the chat adapter's per-call timeout: transient,
	// and not the caller's context.DeadlineExceeded.
	e, err := NewOpenAI(OpenAIConfig{BaseURL: srv.URL + "/v1", Model: "m", Dims: 4, Timeout: 50 * time.Millisecond})
	require.NoError(t, err)
	_, err = e.Embed(context.Background(), []string{"x"})
	require.ErrorContains(t, err, "embed: openai: POST embeddings")
	require.ErrorContains(t, err, "no answer within 50ms")
	class, ok := llm.ClassOf(err)
	require.True(t, ok)
	require.Equal(t, llm.ClassTransient, class)
	require.False(t, errors.Is(err, context.DeadlineExceeded))

	// The caller's deadline stays the caller's: unclassified.
	e, err = NewOpenAI(OpenAIConfig{BaseURL: srv.URL + "/v1", Model: "m", Dims: 4, Timeout: time.Minute})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	_, err = e.Embed(ctx, []string{"x"})
	require.ErrorIs(t, err, context.DeadlineExceeded)
	_, ok = llm.ClassOf(err)
	require.False(t, ok)
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

// startMock serves the mock provider over real HTTP.
func startMock(t *testing.T, cfg mockprovider.Config) (*mockprovider.Server, string) {
	t.Helper()
	m, err := mockprovider.New(cfg)
	require.NoError(t, err)
	srv := httptest.NewServer(m)
	t.Cleanup(srv.Close)
	t.Cleanup(m.Close) // runs first
	return m, srv.URL
}

func TestOpenAIAgainstMockProvider(t *testing.T) {
	t.Parallel()
	_, base := startMock(t, mockprovider.Config{EmbeddingDims: 32})
	e, err := NewOpenAI(OpenAIConfig{BaseURL: base, Model: "text-embedding-3-small", Dims: 32, APIKey: secret.New("sk-mock-1")})
	require.NoError(t, err)
	texts := []string{"brake warning after OTA update", "", "battery voltage low"}
	vecs, err := e.Embed(t.Context(), texts)
	require.NoError(t, err)
	require.Len(t, vecs, 3)
	require.Equal(t, mockprovider.Embed(texts[0], 32), vecs[0])
	require.Equal(t, mockprovider.Embed(" ", 32), vecs[1], "an empty text is sent as a space")
	require.Equal(t, mockprovider.Embed(texts[2], 32), vecs[2])
}

// chatRequest is the smallest request the chat adapter sends.
func chatRequest() *llm.Request {
	return &llm.Request{
		Model:     "gpt-4o-mini",
		MaxTokens: 16,
		Messages:  []llm.Message{{Role: llm.RoleUser, Content: []llm.Block{{Type: llm.BlockText, Text: "hi"}}}},
	}
}

// The same failure of the provider is the same *llm.Error, from the
// embeddings endpoint through the embedder and from the chat endpoint
// through the chat adapter: one transport, one classification, one
// redaction.
func TestOpenAIClassifiedLikeChatAdapter(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		fault     *mockprovider.Fault // nil: no fault
		noKey     bool
		wantClass llm.Class
		wantCode  string
		wantRetry time.Duration
	}{
		{name: "429 rate limit", fault: &mockprovider.Fault{Mode: mockprovider.FaultRateLimit, RetryAfter: 1500 * time.Millisecond,
			Message: "Rate limit reached for key KEY (Bearer KEY)"},
			wantClass: llm.ClassRateLimited, wantCode: "rate_limit_exceeded", wantRetry: 1500 * time.Millisecond},
		{name: "429 insufficient quota", fault: &mockprovider.Fault{Mode: mockprovider.FaultInsufficientQuota},
			wantClass: llm.ClassQuota, wantCode: "insufficient_quota"},
		{name: "500 server error", fault: &mockprovider.Fault{Mode: mockprovider.FaultServerError, RetryAfter: 2 * time.Second,
			Message: "upstream failed for key KEY (Bearer KEY)"},
			wantClass: llm.ClassTransient, wantCode: "server_error", wantRetry: 2 * time.Second},
		{name: "503 overloaded", fault: &mockprovider.Fault{Mode: mockprovider.FaultOverloaded},
			wantClass: llm.ClassOverloaded, wantCode: "server_error"},
		{name: "400 invalid request", fault: &mockprovider.Fault{Mode: mockprovider.FaultInvalidRequest},
			wantClass: llm.ClassPermanent, wantCode: "invalid_request_error"},
		{name: "401 missing key", noKey: true, wantClass: llm.ClassAuth, wantCode: "invalid_request_error"},
	}
	m, base := startMock(t, mockprovider.Config{EmbeddingDims: 8})
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			key := secret.New(fmt.Sprintf("sk-proj-Classify%02dZx9Qw8Er7Ty6Ui5Op4", i))
			if tt.noKey {
				key = secret.String{}
			}
			if tt.fault != nil {
				f := *tt.fault
				f.Provider = "openai"
				f.KeyFingerprint = mockprovider.Fingerprint(key.Reveal())
				f.Count = 2 // one embeddings call, one chat call
				// The provider quotes the key back: neither error may.
				f.Message = strings.ReplaceAll(f.Message, "KEY", key.Reveal())
				require.NoError(t, m.SetFault(f))
			}

			e, err := NewOpenAI(OpenAIConfig{BaseURL: base, Model: "m", Dims: 8, APIKey: key})
			require.NoError(t, err)
			_, embedErr := e.Embed(t.Context(), []string{"x"})
			_, chatErr := openai.New(openai.Config{BaseURL: base}, nil).Complete(t.Context(), llm.Credential{APIKey: key}, chatRequest())

			var got, want *llm.Error
			require.ErrorAs(t, embedErr, &got)
			require.ErrorAs(t, chatErr, &want)
			require.Equal(t, tt.wantClass, want.Class, "the chat adapter's class: %v", chatErr)
			require.Equal(t, tt.wantCode, want.Code)
			require.Equal(t, tt.wantRetry, want.RetryAfter)
			for name, pair := range map[string][2]any{
				"class":       {want.Class, got.Class},
				"status":      {want.Status, got.Status},
				"code":        {want.Code, got.Code},
				"provider":    {want.Provider, got.Provider},
				"retry-after": {want.RetryAfter, got.RetryAfter},
				"message":     {want.Message, got.Message},
			} {
				require.Equal(t, pair[0], pair[1], "%s: embedder %v, chat adapter %v", name, embedErr, chatErr)
			}
			if k := key.Reveal(); k != "" {
				for _, s := range []string{embedErr.Error(), fmt.Sprintf("%+v", embedErr), fmt.Sprintf("%#v", *got)} {
					require.NotContains(t, s, k)
				}
				if tt.fault != nil && tt.fault.Message != "" {
					require.Contains(t, got.Message, "for key "+provider.Redacted+" (Bearer "+provider.Redacted+")")
				}
			}
		})
	}
}

// A key no header can carry is the chat adapter's auth error, and is not
// sent.
func TestOpenAIBadKeyHeader(t *testing.T) {
	t.Parallel()
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { calls.Add(1) }))
	defer srv.Close()
	key := secret.New("sk-pasted-with-newline-0123456789\n")
	e, err := NewOpenAI(OpenAIConfig{BaseURL: srv.URL, Model: "m", Dims: 4, APIKey: key})
	require.NoError(t, err)
	_, err = e.Embed(t.Context(), []string{"x"})
	class, ok := llm.ClassOf(err)
	require.True(t, ok)
	require.Equal(t, llm.ClassAuth, class)
	require.NotContains(t, err.Error(), strings.TrimSpace(key.Reveal()))
	require.Zero(t, calls.Load())
}

// BaseURL follows the chat adapter's convention (provider.Endpoint): with
// or without "/v1", with a gateway's prefix; the default is the adapter's.
func TestOpenAIBaseURL(t *testing.T) {
	t.Parallel()
	require.Equal(t, openai.BaseURLDefault, OpenAIBaseURLDefault)
	e, err := NewOpenAI(OpenAIConfig{})
	require.NoError(t, err)
	require.Equal(t, "https://api.openai.com/v1/embeddings", e.url)

	paths := make(chan string, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		paths <- r.URL.Path
		http.Error(w, "stop here", http.StatusTeapot)
	}))
	defer srv.Close()
	for _, tt := range []struct{ base, path string }{
		{srv.URL, "/v1/embeddings"},
		{srv.URL + "/", "/v1/embeddings"},
		{srv.URL + "/v1", "/v1/embeddings"}, // the old convention keeps its meaning
		{srv.URL + "/v1/", "/v1/embeddings"},
		{srv.URL + "/gw/openai", "/gw/openai/v1/embeddings"},
		{srv.URL + "/gw/openai/v1", "/gw/openai/v1/embeddings"},
	} {
		e, err := NewOpenAI(OpenAIConfig{BaseURL: tt.base, Model: "m", Dims: 4})
		require.NoError(t, err)
		_, err = e.Embed(t.Context(), []string{"x"})
		require.Error(t, err)
		require.Equal(t, tt.path, <-paths, "base %s", tt.base)
		// And the chat adapter reads the same base the same way.
		_, _ = openai.New(openai.Config{BaseURL: tt.base}, nil).Complete(context.Background(), llm.Credential{APIKey: secret.New("k")}, chatRequest())
		require.Equal(t, strings.Replace(tt.path, "/embeddings", "/chat/completions", 1), <-paths, "chat, base %s", tt.base)
	}

	for _, bad := range []string{"localhost:11434", "http://host/v1?key=sk-in-query-123", "ftp://host", "/v1"} {
		_, err := NewOpenAI(OpenAIConfig{BaseURL: bad})
		require.ErrorContains(t, err, "OpenAIConfig.BaseURL")
		require.NotContains(t, err.Error(), "sk-in-query", "the URL is not quoted")
	}
}

// A 2xx that is no embeddings answer (a proxy's page) is transient, as in
// the chat adapter.
func TestOpenAIUnreadableAnswer(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "<html>login at https://proxy.internal:8443/?token=sk-leaky-0123456789abcdef</html>")
	}))
	defer srv.Close()
	e, err := NewOpenAI(OpenAIConfig{BaseURL: srv.URL, Model: "m", Dims: 4, APIKey: secret.New("sk-leaky-0123456789abcdef")})
	require.NoError(t, err)
	_, err = e.Embed(t.Context(), []string{"x"})
	var pe *llm.Error
	require.ErrorAs(t, err, &pe)
	require.Equal(t, llm.ClassTransient, pe.Class)
	require.Equal(t, http.StatusOK, pe.Status)
	require.ErrorContains(t, err, "decode response")
	require.NotContains(t, err.Error(), "sk-leaky")
}

// BenchmarkLocalEmbed is the local embedder's cost per prompt: a short
// question (the compat benchmark's), and a request with a 2 KB system
// prompt (what an agent usually sends).
func BenchmarkLocalEmbed(b *testing.B) {
	l, err := NewLocal(0)
	if err != nil {
		b.Fatal(err)
	}
	short := "question 17 of run x: what does DTC P0300 mean?"
	long := strings.Repeat("You are the diagnosis assistant of a vehicle platform; answer with root cause and fix. ", 24) + short
	for _, c := range []struct{ name, text string }{{"short", short}, {"2KB", long}} {
		b.Run(c.name, func(b *testing.B) {
			for b.Loop() {
				if _, err := l.Embed(context.Background(), []string{c.text}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
