package embed

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"time"

	"bulwark/pkg/llm"
	"bulwark/pkg/provider"
	"bulwark/pkg/provider/openai"
	"bulwark/pkg/secret"
)

// Defaults of OpenAIConfig.
const (
	// OpenAIBaseURLDefault is the OpenAI chat adapter's default base URL:
	// one convention for both (see OpenAIConfig.BaseURL).
	OpenAIBaseURLDefault   = openai.BaseURLDefault
	OpenAIModelDefault     = "text-embedding-3-small"
	OpenAIDimsDefault      = 1536 // text-embedding-3-small's native length
	OpenAITimeoutDefault   = 10 * time.Second
	OpenAIBatchSizeDefault = 128
	// OpenAIBatchSizeMax is OpenAI's limit on inputs per request.
	OpenAIBatchSizeMax = 2048
)

// embeddingsPath is the Embeddings endpoint, joined to BaseURL with
// provider.Endpoint as the chat adapter joins its own.
const embeddingsPath = "/v1/embeddings"

// maxResponseBody bounds a response: a batch of float vectors in JSON is
// far larger than a chat answer (provider.MaxResponseBytes).
const maxResponseBody = 256 << 20

// OpenAIConfig configures an OpenAI-compatible embeddings client.
type OpenAIConfig struct {
	// BaseURL is the API's base URL, read as the OpenAI chat adapter reads
	// its own (pkg/provider/openai, provider.Endpoint): the client POSTs to
	// BaseURL + "/v1/embeddings", and a trailing "/v1" is not repeated, so
	// "https://api.openai.com" and "https://api.openai.com/v1" both work. It
	// may carry a gateway's path prefix ("https://gw.internal/openai").
	// Default OpenAIBaseURLDefault. Examples, each with or without "/v1":
	// Ollama "http://127.0.0.1:11434", vLLM "http://host:8000", TEI
	// "http://host:8080".
	//
	// Earlier versions appended only "/embeddings", so the base had to end
	// in the version path: such a base ending in "/v1" keeps its meaning,
	// while one ending in another path ("…/v1beta/openai") now gets
	// "/v1/embeddings" appended too.
	BaseURL string `yaml:"base_url"`
	// Model is the embedding model. Default OpenAIModelDefault.
	Model string `yaml:"model"`
	// Dims is the vector length the model returns. 0 means
	// OpenAIDimsDefault, and only when Model is defaulted too; any other
	// model must say its length. A response of another length is an error.
	Dims int `yaml:"dims"`
	// SendDimensions sends Dims as the request's "dimensions" field, asking
	// the model to shorten its vectors (OpenAI text-embedding-3 models can;
	// many compatible servers reject the field). Default false.
	SendDimensions bool `yaml:"send_dimensions"`
	// APIKey is sent as "Authorization: Bearer <key>" when set. Optional:
	// local servers usually need none.
	APIKey secret.String `yaml:"api_key"`
	// Timeout bounds one HTTP request, reading the answer included. Default
	// OpenAITimeoutDefault (10 s). Running out is a transient *llm.Error,
	// as in the chat adapter (provider.Post).
	Timeout time.Duration `yaml:"timeout"`
	// BatchSize is the most texts sent in one request; Embed splits larger
	// calls. Default OpenAIBatchSizeDefault (128), at most 2048.
	BatchSize int `yaml:"batch_size"`
	// HTTPClient is the client used; nil means http.DefaultClient's
	// Transport. Redirects are never followed (provider.NoRedirects). Its
	// own Timeout, if any, applies on top of Timeout.
	HTTPClient *http.Client `yaml:"-"`
}

func (c *OpenAIConfig) withDefaults() {
	if c.BaseURL == "" {
		c.BaseURL = OpenAIBaseURLDefault
	}
	if c.Model == "" {
		c.Model = OpenAIModelDefault
		if c.Dims == 0 {
			c.Dims = OpenAIDimsDefault
		}
	}
	if c.Timeout == 0 {
		c.Timeout = OpenAITimeoutDefault
	}
	if c.BatchSize == 0 {
		c.BatchSize = OpenAIBatchSizeDefault
	}
	// Redirects are never followed: one would carry the key (sent as a
	// header) to wherever the server points.
	c.HTTPClient = provider.NoRedirects(c.HTTPClient)
}

func (c *OpenAIConfig) validate() error {
	if provider.ValidateBaseURL("BaseURL", c.BaseURL) != nil {
		// The URL is not quoted: it may carry a secret.
		return errors.New("embed: OpenAIConfig.BaseURL: want an absolute http:// or https:// URL without query or fragment")
	}
	if c.Dims < 1 || c.Dims > DimsMax {
		return fmt.Errorf("embed: OpenAIConfig.Dims %d: want 1..%d (required unless Model is the default)", c.Dims, DimsMax)
	}
	if c.Timeout < 0 {
		return fmt.Errorf("embed: OpenAIConfig.Timeout %s: want > 0", c.Timeout)
	}
	if c.BatchSize < 1 || c.BatchSize > OpenAIBatchSizeMax {
		return fmt.Errorf("embed: OpenAIConfig.BatchSize %d: want 1..%d", c.BatchSize, OpenAIBatchSizeMax)
	}
	return nil
}

// OpenAI is a client of an OpenAI-compatible embeddings endpoint. It is safe
// for concurrent use.
//
// Its HTTP is the OpenAI chat adapter's: one provider.Post per batch, and an
// answer other than 2xx classified by openai.ErrorOf, so a failure is an
// *llm.Error of the class the chat adapter gives the same answer (429
// rate_limited or quota, 401/403 auth, 5xx transient or overloaded, …)
// with the key and anything key-shaped redacted (provider.Redact). A
// connection failure or Timeout is a transient *llm.Error; the caller's
// context ending is an error wrapping ctx.Err(). It does not retry: the
// cache fails open, so a slow or failing embedder only costs a cache miss.
type OpenAI struct {
	cfg OpenAIConfig
	url string
}

// NewOpenAI returns a client for cfg.
func NewOpenAI(cfg OpenAIConfig) (*OpenAI, error) {
	cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	return &OpenAI{cfg: cfg, url: provider.Endpoint(cfg.BaseURL, embeddingsPath)}, nil
}

// Name returns "openai-<model>-<dims>": the model and length, not the host,
// since the same model served by two hosts gives the same vectors.
func (o *OpenAI) Name() string { return fmt.Sprintf("openai-%s-%d", o.cfg.Model, o.cfg.Dims) }

// Dims returns the vector length.
func (o *OpenAI) Dims() int { return o.cfg.Dims }

type embeddingsRequest struct {
	Input          []string `json:"input"`
	Model          string   `json:"model"`
	EncodingFormat string   `json:"encoding_format"`
	Dimensions     int      `json:"dimensions,omitempty"`
}

type embeddingsResponse struct {
	Data []struct {
		Index     int       `json:"index"`
		Embedding []float32 `json:"embedding"`
	} `json:"data"`
}

// Embed returns one vector per text, in order, splitting the texts into
// requests of at most BatchSize. Empty texts are sent as a single space,
// since the OpenAI API rejects empty input.
func (o *OpenAI) Embed(ctx context.Context, texts []string) ([][]float32, error) {
	out := make([][]float32, 0, len(texts))
	for start := 0; start < len(texts); start += o.cfg.BatchSize {
		end := min(start+o.cfg.BatchSize, len(texts))
		vecs, err := o.embedBatch(ctx, texts[start:end])
		if err != nil {
			return nil, err
		}
		out = append(out, vecs...)
	}
	return out, nil
}

func (o *OpenAI) embedBatch(ctx context.Context, texts []string) ([][]float32, error) {
	in := make([]string, len(texts))
	for i, t := range texts {
		if t == "" {
			t = " "
		}
		in[i] = t
	}
	req := embeddingsRequest{Input: in, Model: o.cfg.Model, EncodingFormat: "float"}
	if o.cfg.SendDimensions {
		req.Dimensions = o.cfg.Dims
	}
	body, err := json.Marshal(req)
	if err != nil {
		return nil, fmt.Errorf("embed: openai: encode request: %w", err)
	}

	er, err := o.post(ctx, body)
	if err != nil {
		return nil, fmt.Errorf("embed: openai: POST embeddings: %w", err)
	}
	if len(er.Data) != len(texts) {
		return nil, fmt.Errorf("embed: openai: %d embeddings for %d inputs", len(er.Data), len(texts))
	}
	out := make([][]float32, len(texts))
	for _, d := range er.Data {
		if d.Index < 0 || d.Index >= len(texts) || out[d.Index] != nil {
			return nil, fmt.Errorf("embed: openai: bad or repeated embedding index %d", d.Index)
		}
		if len(d.Embedding) != o.cfg.Dims {
			return nil, fmt.Errorf("embed: openai: embedding of length %d, configured Dims is %d", len(d.Embedding), o.cfg.Dims)
		}
		for _, x := range d.Embedding {
			if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
				return nil, errors.New("embed: openai: embedding holds NaN or Inf")
			}
		}
		out[d.Index] = d.Embedding
	}
	return out, nil
}

// post sends one request body the way the chat adapter sends its own
// (provider.Post, then openai.ErrorOf for an answer other than 2xx) and
// decodes the answer.
func (o *OpenAI) post(ctx context.Context, body []byte) (*embeddingsResponse, error) {
	h := http.Header{}
	h.Set("User-Agent", provider.UserAgent)
	if !o.cfg.APIKey.IsZero() {
		if err := provider.CheckKey(llm.ProviderOpenAI, o.cfg.APIKey); err != nil {
			return nil, err
		}
		h.Set("Authorization", "Bearer "+o.cfg.APIKey.Reveal())
	}
	reply, err := provider.Post(ctx, o.cfg.HTTPClient, provider.Call{
		Provider:         llm.ProviderOpenAI,
		URL:              o.url,
		Header:           h,
		Body:             body,
		Timeout:          o.cfg.Timeout,
		MaxResponseBytes: maxResponseBody,
	})
	if err != nil {
		return nil, err
	}
	if reply.Status < 200 || reply.Status > 299 {
		return nil, openai.ErrorOf(reply, o.cfg.APIKey, time.Now())
	}
	var er embeddingsResponse
	if err := json.Unmarshal(reply.Body, &er); err != nil {
		return nil, provider.Unreadable(llm.ProviderOpenAI, reply, fmt.Errorf("decode response: %w", err), o.cfg.APIKey, llm.RateLimit{})
	}
	return &er, nil
}
