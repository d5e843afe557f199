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
	DefaultMaxTokensDefault = 1024
	// OutputLimitDefault is the max_tokens limit of a route OutputLimits
	// does not name.
	OutputLimitDefault = 32_000
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
	// OutputLimits is each route's most max_tokens, its model's maximum
	// output (config: providers.*.tiers.*.max_output_tokens); a route it
	// does not name has OutputLimitDefault. A request above its route's
	// limit is refused (OutputLimitError).
	OutputLimits map[llm.Route]int
	// MaxTokensLimit, when above 0, caps max_tokens on every route below
	// its own limit: an operator's ceiling. Default 0: none.
	MaxTokensLimit int
	// DefaultMaxTokens is a request's max_tokens when it gives none
	// (unless Submission.ModelMaxTokens), lowered to its route's limit; at
	// most MaxTokensLimit when that is set. Default DefaultMaxTokensDefault,
	// or MaxTokensLimit when that is lower.
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
	if c.DefaultMaxTokens == 0 {
		c.DefaultMaxTokens = DefaultMaxTokensDefault
		if c.MaxTokensLimit > 0 {
			c.DefaultMaxTokens = min(c.DefaultMaxTokens, c.MaxTokensLimit)
		}
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
	case c.MaxTokensLimit < 0:
		return fmt.Errorf("intake: MaxTokensLimit must be >= 0 (0: none), got %d", c.MaxTokensLimit)
	case c.DefaultMaxTokens <= 0:
		return fmt.Errorf("intake: DefaultMaxTokens must be > 0, got %d", c.DefaultMaxTokens)
	case c.MaxTokensLimit > 0 && c.DefaultMaxTokens > c.MaxTokensLimit:
		return fmt.Errorf("intake: DefaultMaxTokens must be in [1, MaxTokensLimit (%d)], got %d", c.MaxTokensLimit, c.DefaultMaxTokens)
	case c.Layers != nil && !c.Layers[c.DefaultLayer]:
		return fmt.Errorf("intake: DefaultLayer %q is not one of Layers", c.DefaultLayer)
	}
	for r, n := range c.OutputLimits {
		if n <= 0 {
			return fmt.Errorf("intake: OutputLimits[%s] must be > 0, got %d", r, n)
		}
	}
	return nil
}

// OutputLimit is route r's most max_tokens: its own limit, under
// MaxTokensLimit when that is set.
func (c Config) OutputLimit(r llm.Route) int {
	n, ok := c.OutputLimits[r]
	if !ok {
		n = OutputLimitDefault
	}
	if c.MaxTokensLimit > 0 {
		n = min(n, c.MaxTokensLimit)
	}
	return n
}
