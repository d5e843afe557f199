package embed

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"strings"
	"time"
	"unicode/utf8"

	"bulwark/pkg/provider"
	"bulwark/pkg/secret"
)

// Defaults of OpenAIConfig.
const (
	OpenAIBaseURLDefault   = "https://api.openai.com/v1"
	OpenAIModelDefault     = "text-embedding-3-small"
	OpenAIDimsDefault      = 1536 // text-embedding-3-small's native length
	OpenAITimeoutDefault   = 10 * time.Second
	OpenAIBatchSizeDefault = 128
	// OpenAIBatchSizeMax is OpenAI's limit on inputs per request.
	OpenAIBatchSizeMax = 2048
)

// maxErrorBody bounds how much of an error response is read and how much of
// its message is quoted in an error.
const (
	maxErrorBody    = 64 << 10
	maxErrorMessage = 200
	maxResponseBody = 256 << 20
)

// OpenAIConfig configures an OpenAI-compatible embeddings client.
type OpenAIConfig struct {
	// BaseURL is the API root including the version path; the client POSTs
	// to BaseURL + "/embeddings". Default OpenAIBaseURLDefault. Examples:
	// Ollama "http://127.0.0.1:11434/v1", vLLM "http://host:8000/v1",
	// TEI "http://host:8080/v1".
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
	// Timeout bounds one HTTP request. Default OpenAITimeoutDefault (10 s).
	Timeout time.Duration `yaml:"timeout"`
	// BatchSize is the most texts sent in one request; Embed splits larger
	// calls. Default OpenAIBatchSizeDefault (128), at most 2048.
	BatchSize int `yaml:"batch_size"`
	// HTTPClient is the client used; nil means a new http.Client. Its own
	// Timeout, if any, applies on top of Timeout.
	HTTPClient *http.Client `yaml:"-"`
}

func (c *OpenAIConfig) withDefaults() {
	if c.BaseURL == "" {
		c.BaseURL = OpenAIBaseURLDefault
	}
	c.BaseURL = strings.TrimRight(c.BaseURL, "/")
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
	if !strings.HasPrefix(c.BaseURL, "http://") && !strings.HasPrefix(c.BaseURL, "https://") {
		// The URL is not quoted: it may carry a secret.
		return fmt.Errorf("embed: OpenAIConfig.BaseURL: want an http:// or https:// URL")
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
// for concurrent use. It does not retry: the cache fails open, so a slow or
// failing embedder only costs a cache miss.
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
	return &OpenAI{cfg: cfg, url: cfg.BaseURL + "/embeddings"}, nil
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

type errorResponse struct {
	Error struct {
		Message string `json:"message"`
		Type    string `json:"type"`
		Code    any    `json:"code"`
	} `json:"error"`
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

	ctx, cancel := context.WithTimeout(ctx, o.cfg.Timeout)
	defer cancel()
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, o.url, bytes.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("embed: openai: build request: %w", err)
	}
	hreq.Header.Set("Content-Type", "application/json")
	hreq.Header.Set("Accept", "application/json")
	if !o.cfg.APIKey.IsZero() {
		hreq.Header.Set("Authorization", "Bearer "+o.cfg.APIKey.Reveal())
	}
	resp, err := o.cfg.HTTPClient.Do(hreq)
	if err != nil {
		// *url.Error quotes the URL, which carries no key (the key is a
		// header); the cause is kept for errors.Is (e.g. DeadlineExceeded).
		return nil, fmt.Errorf("embed: openai: POST embeddings: %w", err)
	}
	defer resp.Body.Close()

	if resp.StatusCode != http.StatusOK {
		return nil, o.statusError(resp)
	}
	var er embeddingsResponse
	if err := json.NewDecoder(io.LimitReader(resp.Body, maxResponseBody)).Decode(&er); err != nil {
		return nil, fmt.Errorf("embed: openai: decode response: %w", err)
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

// ErrStatus is wrapped by errors for non-200 answers; use errors.As with
// *StatusError for the details.
var ErrStatus = errors.New("embeddings endpoint answered an error")

// StatusError is a non-200 answer of the embeddings endpoint.
type StatusError struct {
	// StatusCode is the HTTP status.
	StatusCode int
	// Type and Code are the OpenAI error's type and code, when given.
	Type, Code string
	// Message is the server's message, truncated, with the API key removed
	// should the server have echoed it.
	Message string
}

func (e *StatusError) Error() string {
	s := fmt.Sprintf("status %d", e.StatusCode)
	if e.Type != "" || e.Code != "" {
		s += fmt.Sprintf(" (%s/%s)", e.Type, e.Code)
	}
	if e.Message != "" {
		s += ": " + e.Message
	}
	return s
}

// Unwrap makes errors.Is(err, ErrStatus) true.
func (e *StatusError) Unwrap() error { return ErrStatus }

func (o *OpenAI) statusError(resp *http.Response) error {
	se := &StatusError{StatusCode: resp.StatusCode}
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
	var er errorResponse
	if json.Unmarshal(raw, &er) == nil && er.Error.Message != "" {
		se.Type = er.Error.Type
		if er.Error.Code != nil {
			se.Code = fmt.Sprint(er.Error.Code)
		}
		se.Message = er.Error.Message
	} else {
		se.Message = string(raw)
	}
	se.Message = o.scrub(se.Message)
	se.Type = o.scrub(se.Type)
	se.Code = o.scrub(se.Code)
	return fmt.Errorf("embed: openai: POST embeddings: %w", se)
}

// scrub removes the API key from server text and truncates it to a valid
// UTF-8 prefix of at most maxErrorMessage bytes.
func (o *OpenAI) scrub(s string) string {
	if k := o.cfg.APIKey.Reveal(); k != "" {
		s = strings.ReplaceAll(s, k, "[redacted]")
	}
	s = strings.TrimSpace(s)
	if len(s) > maxErrorMessage {
		cut := maxErrorMessage
		for cut > 0 && !utf8.RuneStart(s[cut]) {
			cut--
		}
		s = s[:cut] + "…"
	}
	return s
}
