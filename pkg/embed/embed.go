// Package embed turns prompt text into vectors for the semantic cache
// (pkg/cache).
//
// Two embedders are built in:
//
//   - Local (the default): hashed character n-grams and word unigrams,
//     deterministic, in-process, no network and no model files. It is
//     lexical, not semantic: it scores near-duplicates (prompts that differ
//     in a VIN, a timestamp or a few words) very high, and paraphrases that
//     use different words low. See NewLocal.
//   - OpenAI-compatible: any server that speaks POST /v1/embeddings in
//     OpenAI's wire format (OpenAI, Ollama, vLLM, Hugging Face TEI), sent,
//     classified and redacted exactly as the OpenAI chat adapter sends its
//     calls (pkg/provider, pkg/provider/openai). See NewOpenAI.
//
// An Embedder's Name identifies the model and the dimension together: the
// cache keeps one vector index per name and never compares vectors of two
// different names, so changing the model or the dimension must change the
// name.
package embed

import (
	"context"
	"fmt"
)

// Embedder turns texts into vectors. Implementations are safe for concurrent
// use.
type Embedder interface {
	// Name identifies the model and its dimension, e.g. "local-ngram-384".
	// Vectors from embedders with different names are never compared.
	Name() string
	// Dims is the length of every vector Embed returns.
	Dims() int
	// Embed returns one vector per text, in order.
	Embed(ctx context.Context, texts []string) ([][]float32, error)
}

// Kinds accepted by Config.Kind.
const (
	KindLocal  = "local"
	KindOpenAI = "openai"
)

// KindDefault is the embedder used when Config.Kind is empty.
const KindDefault = KindLocal

// Config selects and configures an embedder. The zero value is the local
// embedder with DimsDefault dimensions.
type Config struct {
	// Kind is "local" (default) or "openai".
	Kind string `yaml:"kind"`
	// Dims is the local embedder's vector length; 0 means DimsDefault (384).
	// Ignored for "openai", which uses OpenAI.Dims.
	Dims int `yaml:"dims"`
	// OpenAI configures the "openai" kind.
	OpenAI OpenAIConfig `yaml:"openai"`
}

// Validate reports what New would refuse in c, without building anything
// that costs.
func (c Config) Validate() error {
	_, err := New(c)
	return err
}

// New builds the embedder cfg selects.
func New(cfg Config) (Embedder, error) {
	switch cfg.Kind {
	case "", KindLocal:
		return NewLocal(cfg.Dims)
	case KindOpenAI:
		return NewOpenAI(cfg.OpenAI)
	default:
		return nil, fmt.Errorf("embed: Config.Kind %q: want %q or %q", cfg.Kind, KindLocal, KindOpenAI)
	}
}
