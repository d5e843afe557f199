package mockprovider

import "strings"

// maxOutputTokens are the documented maximum output tokens (the largest
// max_tokens accepted) of the models the tests name, from the providers'
// model pages (Anthropic's models overview; OpenAI's GPT-4o and GPT-4o
// mini pages), kept here apart from Bulwark's own table (pkg/config) so
// that the mock refuses what the providers refuse whatever Bulwark
// believes. A model name matches an entry it contains (dated snapshots);
// the first match wins. Other names have no limit.
var maxOutputTokens = []struct {
	model string
	max   int
}{
	{"claude-sonnet-4-5", 64_000},
	{"claude-haiku-4-5", 64_000},
	{"claude-opus-4-1", 32_000},
	{"gpt-4o-mini", 16_384},
	{"gpt-4o", 16_384},
}

// MaxOutputTokens returns the most max_tokens the mock accepts for model,
// and whether it limits the model at all.
func MaxOutputTokens(model string) (int, bool) {
	for _, m := range maxOutputTokens {
		if strings.Contains(model, m.model) {
			return m.max, true
		}
	}
	return 0, false
}
