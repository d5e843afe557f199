package config

import (
	"fmt"
	"strings"

	"gopkg.in/yaml.v3"

	"bulwark/pkg/intake"
	"bulwark/pkg/llm"
)

// Tier is one model tier of a provider. In the file it is the model name
// alone (sonnet: claude-sonnet-4-5) or a mapping that also gives its
// output limit (sonnet: {model: claude-sonnet-4-5, max_output_tokens: 64000}).
type Tier struct {
	// Model is the provider's model name: the Bedrock model (or inference
	// profile) id, the Azure deployment name. Required.
	Model string `yaml:"model"`
	// MaxOutputTokens is the most max_tokens a request may ask of this
	// tier: a request above it is refused as the provider refuses it (400),
	// and a request that falls back to this tier from another is clamped
	// to it. Default: the model's documented maximum when Bulwark knows
	// the model (KnownMaxOutputTokens), else MaxOutputTokensFallback
	// (32,000, the former server.max_tokens_limit default).
	MaxOutputTokens int `yaml:"max_output_tokens"`
}

// MaxOutputTokensFallback is max_output_tokens' default for a model
// Bulwark does not know (a local model, an Azure deployment name): the
// one limit every tier had before tiers had their own, so that such a
// configuration keeps its behaviour. Set max_output_tokens for them.
const MaxOutputTokensFallback = intake.OutputLimitDefault

// knownOutputLimits are the documented maximum output tokens (the largest
// max_tokens accepted) of the models the example configurations name,
// from the providers' model pages (Anthropic's models overview; OpenAI's
// GPT-4o and GPT-4o mini model pages). A tier's model name matches an
// entry that it contains, so dated snapshots ("claude-sonnet-4-5-20250929")
// and Bedrock ids ("us.anthropic.claude-sonnet-4-5-20250929-v1:0") match
// too; the first match wins, so a name that contains another comes first.
var knownOutputLimits = []struct {
	model string
	max   int
}{
	{"claude-sonnet-4-5", 64_000},
	{"claude-haiku-4-5", 64_000},
	{"claude-opus-4-1", 32_000},
	{"gpt-4o-mini", 16_384},
	{"gpt-4o", 16_384},
}

// KnownMaxOutputTokens returns the documented maximum output tokens of
// model, and whether Bulwark knows the model.
func KnownMaxOutputTokens(model string) (int, bool) {
	for _, k := range knownOutputLimits {
		if strings.Contains(model, k.model) {
			return k.max, true
		}
	}
	return 0, false
}

// UnmarshalYAML accepts a model name or a mapping of model and
// max_output_tokens, refusing other keys (the strict decoder does not
// reach inside a custom unmarshaler).
func (t *Tier) UnmarshalYAML(value *yaml.Node) error {
	if value.Kind == yaml.ScalarNode {
		return value.Decode(&t.Model)
	}
	if value.Kind != yaml.MappingNode {
		return fmt.Errorf("line %d: a tier is a model name or {model: ..., max_output_tokens: ...}", value.Line)
	}
	for i := 0; i+1 < len(value.Content); i += 2 {
		switch k := value.Content[i]; k.Value {
		case "model", "max_output_tokens":
		default:
			return fmt.Errorf("line %d: field %s not found in a tier (model, max_output_tokens)", k.Line, k.Value)
		}
	}
	type plain Tier // without this method
	return value.Decode((*plain)(t))
}

// OutputLimit returns route r's max_output_tokens (defaults applied), 0
// for a route that is not configured.
func (c *Config) OutputLimit(r llm.Route) int {
	return c.Providers[r.Provider].Tiers[r.Tier].MaxOutputTokens
}

// tierDefaults sets each tier's max_output_tokens default.
func (p *ProviderCfg) tierDefaults() {
	for name, t := range p.Tiers {
		if t.MaxOutputTokens == 0 {
			t.MaxOutputTokens = MaxOutputTokensFallback
			if n, ok := KnownMaxOutputTokens(t.Model); ok {
				t.MaxOutputTokens = n
			}
		}
		p.Tiers[name] = t
	}
}
