package llm

// EstimateTokens is the token reservation of a request before the call:
// input (about four bytes per token, rounded up per piece of text, which
// over- rather than under-counts) plus MaxTokens, the most the answer can
// use. Providers meter output-token limits by max_tokens at admission too,
// so reserving it is what keeps the pool from being told 429; afterwards
// the key pool settles it the way the key's provider does (keypool
// Metering: OpenAI and Azure keep the whole charge, Anthropic and Bedrock
// adjust it to the real usage).
func EstimateTokens(req *Request) int {
	return EstimateRequest(req).Total()
}

// Estimate is a request's token reservation split the way Anthropic meters
// it: input tokens against its input-tokens-per-minute limit, max_tokens
// against its output-tokens-per-minute limit (estimated from max_tokens at
// the start of a request, adjusted to the real output at its end).
type Estimate struct {
	// Input is the prompt's estimated tokens (system, messages, tools).
	Input int
	// Output is MaxTokens, the most the answer can use.
	Output int
}

// Total returns Input plus Output: what a provider with one token limit
// charges at admission.
func (e Estimate) Total() int { return e.Input + e.Output }

// EstimateRequest is EstimateTokens split into input and output.
func EstimateRequest(req *Request) Estimate {
	n := countText(req.System)
	for _, m := range req.Messages {
		for _, b := range m.Content {
			n += countText(b.Text) + countText(string(b.Input))
		}
	}
	for _, t := range req.Tools {
		n += countText(t.Name) + countText(t.Description) + countText(string(t.InputSchema))
	}
	return Estimate{Input: n, Output: req.MaxTokens}
}

func countText(s string) int {
	if s == "" {
		return 0
	}
	return (len(s) + 3) / 4
}
