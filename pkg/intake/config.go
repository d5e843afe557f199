package intake

import (
	"fmt"
	"time"

	"bulwark/pkg/cache"
	"bulwark/pkg/llm"
	"bulwark/pkg/queue"
)

// Defaults of Config; pkg/config uses these, so each is written once.
const (
	MaxPromptCharsDefault   = 200_000
	MaxTokensLimitDefault   = 32_000
	DefaultMaxTokensDefault = 1024
)

// Config configures intake.
type Config struct {
	Routes map[llm.Route]bool
	// RouteOrder returns the routes a request tries, in order (a routing
	// rule's first, the asked one, its fallback chain).
	RouteOrder func(asked llm.Route, layer string) []llm.Route
	// MaxWait is the longest a request waits to start (its deadline).
	// Default queue.MaxWaitDefault (300s).
	MaxWait time.Duration
	// MaxPromptChars caps a request's system prompt plus message text.
	// Default MaxPromptCharsDefault.
	MaxPromptChars int
	// MaxTokensLimit caps max_tokens. Default MaxTokensLimitDefault.
	MaxTokensLimit int
	// DefaultMaxTokens is a request's max_tokens when it gives none; at
	// most MaxTokensLimit. Default DefaultMaxTokensDefault.
	DefaultMaxTokens int
	// Layers are the cache layers a request may name (nil: any), and
	// DefaultLayer the one it gets when it names none, which must be one of
	// them. Default cache.DefaultLayerDefault ("agent").
	Layers       map[string]bool
	DefaultLayer string
	CacheEnabled bool
	// AfterStore, when set, runs between storing a request and enqueueing
	// it; an error stops the submission there, as a crash would. A
	// failpoint for tests of the orphan sweep; nil in production.
	AfterStore func(id string) error
}

// WithDefaults returns c with its zero fields set to their defaults.
func (c Config) WithDefaults() Config {
	if c.MaxWait == 0 {
		c.MaxWait = queue.MaxWaitDefault
	}
	if c.MaxPromptChars == 0 {
		c.MaxPromptChars = MaxPromptCharsDefault
	}
	if c.MaxTokensLimit == 0 {
		c.MaxTokensLimit = MaxTokensLimitDefault
	}
	if c.DefaultMaxTokens == 0 {
		c.DefaultMaxTokens = min(DefaultMaxTokensDefault, c.MaxTokensLimit)
	}
	if c.DefaultLayer == "" {
		c.DefaultLayer = cache.DefaultLayerDefault
	}
	return c
}

// Validate reports the first field of c (defaults applied) out of range.
func (c Config) Validate() error {
	switch {
	case c.MaxWait <= 0:
		return fmt.Errorf("intake: MaxWait must be > 0, got %s", c.MaxWait)
	case c.MaxPromptChars <= 0:
		return fmt.Errorf("intake: MaxPromptChars must be > 0, got %d", c.MaxPromptChars)
	case c.MaxTokensLimit <= 0:
		return fmt.Errorf("intake: MaxTokensLimit must be > 0, got %d", c.MaxTokensLimit)
	case c.DefaultMaxTokens <= 0 || c.DefaultMaxTokens > c.MaxTokensLimit:
		return fmt.Errorf("intake: DefaultMaxTokens must be in [1, MaxTokensLimit (%d)], got %d", c.MaxTokensLimit, c.DefaultMaxTokens)
	case c.Layers != nil && !c.Layers[c.DefaultLayer]:
		return fmt.Errorf("intake: DefaultLayer %q is not one of Layers", c.DefaultLayer)
	}
	return nil
}
