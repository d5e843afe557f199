package mockprovider

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"hash/fnv"
	"math"
	"strings"
	"time"
	"unicode"
)

// EmbeddingInputsMax is the most inputs one embeddings request may carry
// (OpenAI's limit).
const EmbeddingInputsMax = 2048

// Feature weights of Embed: whole words dominate, character trigrams make
// texts that differ by a typo or an inflection still close.
const (
	embedWordWeight    = 1.0
	embedTrigramWeight = 0.5
)

// Embed is the mock's deterministic embedding of text: an L2-normalised
// vector of dims float32 built by feature hashing. The features are the
// words of the text (lower-cased, split at anything not a letter or digit)
// and each word's character trigrams (with boundary marks), each hashed
// (FNV-1a) to a position and a sign. So texts that differ only in case,
// spacing or punctuation get the same vector, near-duplicates are close
// (cosine ~0.8-0.9 when one word in ten differs), and unrelated texts are
// near-orthogonal. A text without words gets the unit vector e0. dims must
// be at least 1.
func Embed(text string, dims int) []float32 {
	acc := make([]float64, dims)
	add := func(feature string, w float64) {
		h := fnv.New64a()
		_, _ = h.Write([]byte(feature)) // hash.Hash never fails
		sum := h.Sum64()
		i := int(sum % uint64(dims))
		if sum>>63 == 1 {
			w = -w
		}
		acc[i] += w
	}
	words := strings.FieldsFunc(strings.ToLower(text), func(r rune) bool {
		return !unicode.IsLetter(r) && !unicode.IsDigit(r)
	})
	for _, word := range words {
		add("w:"+word, embedWordWeight)
		r := []rune("#" + word + "#")
		for i := 0; i+3 <= len(r); i++ {
			add("t:"+string(r[i:i+3]), embedTrigramWeight)
		}
	}
	var norm float64
	for _, v := range acc {
		norm += v * v
	}
	out := make([]float32, dims)
	if norm == 0 {
		out[0] = 1
		return out
	}
	norm = math.Sqrt(norm)
	for i, v := range acc {
		out[i] = float32(v / norm)
	}
	return out
}

// embeddingsWire is OpenAI Embeddings: POST /v1/embeddings.
type embeddingsWire struct {
	openAIBase
	dims int // the Server's default length
}

func (embeddingsWire) endpoint() string { return "embeddings" }

type embeddingsRequest struct {
	Input          json.RawMessage `json:"input"`
	Model          string          `json:"model"`
	Dimensions     *int            `json:"dimensions"`
	EncodingFormat string          `json:"encoding_format"`
}

type embeddingsResponse struct {
	Object string          `json:"object"`
	Data   []embeddingItem `json:"data"`
	Model  string          `json:"model"`
	Usage  embeddingsUsage `json:"usage"`
}

type embeddingItem struct {
	Object    string `json:"object"`
	Index     int    `json:"index"`
	Embedding any    `json:"embedding"` // []float32, or a base64 string
}

type embeddingsUsage struct {
	PromptTokens int `json:"prompt_tokens"`
	TotalTokens  int `json:"total_tokens"`
}

func (e embeddingsWire) parse(body []byte) (*call, *apiError) {
	var req embeddingsRequest
	if err := json.Unmarshal(body, &req); err != nil {
		return nil, invalid("We could not parse the JSON body of your request: %v", err)
	}
	if req.Model == "" {
		return nil, invalid("you must provide a model parameter")
	}
	dims := e.dims
	if req.Dimensions != nil {
		if *req.Dimensions < 1 || *req.Dimensions > EmbeddingDimsMax {
			return nil, invalid("dimensions: must be between 1 and %d", EmbeddingDimsMax)
		}
		dims = *req.Dimensions
	}
	switch req.EncodingFormat {
	case "", "float", "base64":
	default:
		return nil, invalid("encoding_format: must be 'float' or 'base64'")
	}

	var inputs []string
	raw := bytes.TrimSpace(req.Input)
	switch {
	case len(raw) == 0 || bytes.Equal(raw, []byte("null")):
		return nil, invalid("input: missing required parameter")
	case raw[0] == '"':
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, invalid("input: %v", err)
		}
		inputs = []string{s}
	default:
		if err := json.Unmarshal(raw, &inputs); err != nil {
			return nil, invalid("input: want a string or an array of strings (token arrays are not supported by the mock)")
		}
	}
	if len(inputs) == 0 || len(inputs) > EmbeddingInputsMax {
		return nil, invalid("input: want 1..%d inputs", EmbeddingInputsMax)
	}
	tokens := 0
	for i, s := range inputs {
		if s == "" {
			return nil, invalid("'$.input[%d]' is invalid: empty strings are not allowed", i)
		}
		tokens += CountTokens(s)
	}

	return &call{
		model:           req.Model,
		inputTokens:     tokens,
		embeddingInputs: len(inputs),
		build: func(time.Time) (any, int) {
			resp := embeddingsResponse{
				Object: "list",
				Model:  req.Model,
				Usage:  embeddingsUsage{PromptTokens: tokens, TotalTokens: tokens},
			}
			for i, s := range inputs {
				v := Embed(s, dims)
				item := embeddingItem{Object: "embedding", Index: i, Embedding: v}
				if req.EncodingFormat == "base64" {
					b := make([]byte, 0, 4*len(v))
					for _, f := range v {
						b = binary.LittleEndian.AppendUint32(b, math.Float32bits(f))
					}
					item.Embedding = base64.StdEncoding.EncodeToString(b)
				}
				resp.Data = append(resp.Data, item)
			}
			return resp, 0
		},
	}, nil
}

// Compile-time checks that every endpoint implements wire.
var (
	_ wire = anthropicWire{}
	_ wire = chatWire{}
	_ wire = embeddingsWire{}
)
