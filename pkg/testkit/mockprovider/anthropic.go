package mockprovider

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// anthropicWire is the Anthropic Messages API: POST /v1/messages.
type anthropicWire struct{}

func (anthropicWire) provider() provider      { return providerClaude }
func (anthropicWire) endpoint() string        { return "messages" }
func (anthropicWire) requestIDHeader() string { return "request-id" }

// apiKey reads x-api-key, else "Authorization: Bearer <key>": the Anthropic
// Go SDK (v2) sends its API key as a Bearer token.
func (anthropicWire) apiKey(r *http.Request) string {
	if k := strings.TrimSpace(r.Header.Get("x-api-key")); k != "" {
		return k
	}
	return bearerKey(r)
}

func (anthropicWire) preflight(r *http.Request) *apiError {
	if r.Header.Get("anthropic-version") == "" {
		return invalid("anthropic-version: header is required")
	}
	return nil
}

type anthropicRequest struct {
	Model         string               `json:"model"`
	System        json.RawMessage      `json:"system"`
	Messages      []anthropicMessage   `json:"messages"`
	MaxTokens     *int                 `json:"max_tokens"`
	Temperature   *float64             `json:"temperature"`
	StopSequences []string             `json:"stop_sequences"`
	Tools         []anthropicTool      `json:"tools"`
	ToolChoice    *anthropicToolChoice `json:"tool_choice"`
	Stream        bool                 `json:"stream"`
}

type anthropicMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

// anthropicBlock is any input content block; which fields apply depends on
// Type.
type anthropicBlock struct {
	Type      string          `json:"type"`
	Text      string          `json:"text"`
	ID        string          `json:"id"`
	Name      string          `json:"name"`
	Input     json.RawMessage `json:"input"`
	ToolUseID string          `json:"tool_use_id"`
	Content   json.RawMessage `json:"content"`
	IsError   bool            `json:"is_error"`
}

type anthropicTool struct {
	Name        string          `json:"name"`
	Description string          `json:"description"`
	InputSchema json.RawMessage `json:"input_schema"`
}

type anthropicToolChoice struct {
	Type                   string `json:"type"`
	Name                   string `json:"name"`
	DisableParallelToolUse bool   `json:"disable_parallel_tool_use"`
}

type anthropicResponse struct {
	ID           string         `json:"id"`
	Type         string         `json:"type"`
	Role         string         `json:"role"`
	Model        string         `json:"model"`
	Content      []any          `json:"content"`
	StopReason   string         `json:"stop_reason"`
	StopSequence *string        `json:"stop_sequence"`
	Usage        anthropicUsage `json:"usage"`
}

type anthropicTextBlock struct {
	Type string `json:"type"`
	Text string `json:"text"`
}

type anthropicToolUseBlock struct {
	Type  string          `json:"type"`
	ID    string          `json:"id"`
	Name  string          `json:"name"`
	Input json.RawMessage `json:"input"`
}

type anthropicUsage struct {
	InputTokens              int `json:"input_tokens"`
	OutputTokens             int `json:"output_tokens"`
	CacheCreationInputTokens int `json:"cache_creation_input_tokens"`
	CacheReadInputTokens     int `json:"cache_read_input_tokens"`
}

// parseBlocks reads content that is either a string (one text block) or an
// array of blocks.
func parseBlocks(raw json.RawMessage, field string) ([]anthropicBlock, *apiError) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || raw[0] == 'n' {
		return nil, invalid("%s: Field required", field)
	}
	if raw[0] == '"' {
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, invalid("%s: %v", field, err)
		}
		return []anthropicBlock{{Type: "text", Text: s}}, nil
	}
	var blocks []anthropicBlock
	if err := json.Unmarshal(raw, &blocks); err != nil {
		return nil, invalid("%s: want a string or an array of content blocks: %v", field, err)
	}
	return blocks, nil
}

// toolResultText reads a tool_result's content: a string or text blocks.
func toolResultText(raw json.RawMessage, field string) (string, *apiError) {
	if len(bytes.TrimSpace(raw)) == 0 {
		return "", nil
	}
	blocks, e := parseBlocks(raw, field)
	if e != nil {
		return "", e
	}
	var sb strings.Builder
	for _, b := range blocks {
		if b.Type == "text" {
			sb.WriteString(b.Text)
		}
	}
	return sb.String(), nil
}

// compactJSON is raw without insignificant space, so token counts do not
// depend on the client's encoder.
func compactJSON(raw json.RawMessage) string {
	var b bytes.Buffer
	if err := json.Compact(&b, raw); err != nil {
		return string(raw)
	}
	return b.String()
}

// tokensForBytes is CountTokens of a text n bytes long.
func tokensForBytes(n int) int { return max(1, (n+3)/4) }

func (anthropicWire) parse(body []byte) (*call, *apiError) {
	var req anthropicRequest
	if err := json.Unmarshal(body, &req); err != nil {
		return nil, invalid("invalid JSON body: %v", err)
	}
	switch {
	case req.Model == "":
		return nil, invalid("model: Field required")
	case req.MaxTokens == nil:
		return nil, invalid("max_tokens: Field required")
	case *req.MaxTokens < 1:
		return nil, invalid("max_tokens: Input should be greater than or equal to 1")
	case len(req.Messages) == 0:
		return nil, invalid("messages: at least one message is required")
	case req.Temperature != nil && (*req.Temperature < 0 || *req.Temperature > 1):
		return nil, invalid("temperature: Input should be between 0 and 1")
	}
	if limit, ok := MaxOutputTokens(req.Model); ok && *req.MaxTokens > limit {
		// Anthropic's wording (as quoted in BerriAI/litellm#15715).
		return nil, invalid("max_tokens: %d > %d, which is the maximum allowed number of output tokens for %s",
			*req.MaxTokens, limit, req.Model)
	}

	c := &conversation{maxTokens: *req.MaxTokens, stops: req.StopSequences, choice: choiceAuto}
	inputBytes := 0
	if len(req.System) > 0 && !bytes.Equal(bytes.TrimSpace(req.System), []byte("null")) {
		sys, e := parseBlocks(req.System, "system")
		if e != nil {
			return nil, e
		}
		for _, b := range sys {
			if b.Type != "text" {
				return nil, invalid("system: blocks must be of type text, got %q", b.Type)
			}
			inputBytes += len(b.Text)
		}
	}

	lastUser := -1
	for i, m := range req.Messages {
		if m.Role != "user" && m.Role != "assistant" {
			return nil, invalid("messages.%d.role: Input should be 'user' or 'assistant'", i)
		}
		if m.Role == "user" {
			lastUser = i
		}
	}
	if lastUser < 0 {
		return nil, invalid("messages: at least one user message is required")
	}
	for i, m := range req.Messages {
		field := fmt.Sprintf("messages.%d.content", i)
		blocks, e := parseBlocks(m.Content, field)
		if e != nil {
			return nil, e
		}
		var text strings.Builder
		for j, b := range blocks {
			bf := fmt.Sprintf("%s.%d", field, j)
			switch b.Type {
			case "text":
				inputBytes += len(b.Text)
				text.WriteString(b.Text)
			case "tool_use":
				if m.Role != "assistant" {
					return nil, invalid("%s: tool_use blocks belong in assistant messages", bf)
				}
				if b.ID == "" || b.Name == "" {
					return nil, invalid("%s: tool_use needs id and name", bf)
				}
				c.priorCalls++
				if len(b.Input) > 0 {
					inputBytes += len(compactJSON(b.Input))
				}
			case "tool_result":
				if m.Role != "user" {
					return nil, invalid("%s: tool_result blocks belong in user messages", bf)
				}
				if b.ToolUseID == "" {
					return nil, invalid("%s.tool_use_id: Field required", bf)
				}
				out, e := toolResultText(b.Content, bf+".content")
				if e != nil {
					return nil, e
				}
				inputBytes += len(out)
				if i == lastUser {
					c.toolResults = append(c.toolResults, ToolResult{Content: out, IsError: b.IsError})
				}
			default:
				// Images, documents and the like carry no text the mock
				// answers to; they are accepted and not counted.
			}
		}
		if i == lastUser {
			c.lastUserText = text.String()
		}
	}

	for i, t := range req.Tools {
		if t.Name == "" {
			return nil, invalid("tools.%d.name: Field required", i)
		}
		c.tools = append(c.tools, t.Name)
	}
	if tc := req.ToolChoice; tc != nil {
		switch choiceMode(tc.Type) {
		case choiceAuto, choiceAny, choiceNone:
		case choiceTool:
			if !containsString(c.tools, tc.Name) {
				return nil, invalid("tool_choice.name: tool %q is not in tools", tc.Name)
			}
		default:
			return nil, invalid("tool_choice.type: Input should be 'auto', 'any', 'tool' or 'none'")
		}
		if tc.Type != string(choiceNone) && tc.Type != string(choiceAuto) && len(c.tools) == 0 {
			return nil, invalid("tool_choice: requires tools")
		}
		c.choice, c.choiceName, c.singleCall = choiceMode(tc.Type), tc.Name, tc.DisableParallelToolUse
	}

	input := tokensForBytes(inputBytes)
	cl := &call{
		model:       req.Model,
		inputTokens: input,
		reserve:     *req.MaxTokens,
		// Anthropic estimates output from max_tokens at the start and
		// adjusts to the real output at the end; Bedrock, which reuses
		// this parse, reserves and adjusts the same way.
		settle: true,
		build: func(time.Time) (any, int) {
			a := answerTo(c)
			return anthropicAnswer(req.Model, input, a), a.outputTokens
		},
	}
	if req.Stream {
		cl.stream = func(_ time.Time, chunkBytes int) *script {
			return anthropicScript(anthropicAnswer(req.Model, input, answerTo(c)), chunkBytes)
		}
	}
	return cl, nil
}

// anthropicAnswer is the Messages response carrying a.
func anthropicAnswer(model string, input int, a answer) anthropicResponse {
	resp := anthropicResponse{
		ID:         "msg_" + randomHex(12),
		Type:       "message",
		Role:       "assistant",
		Model:      model,
		StopReason: string(a.stop),
		Usage:      anthropicUsage{InputTokens: input, OutputTokens: a.outputTokens},
	}
	if a.stop == stopStopSequence {
		resp.StopSequence = &a.stopSequence
	}
	if len(a.calls) == 0 {
		resp.Content = []any{anthropicTextBlock{Type: "text", Text: a.text}}
	}
	for _, tc := range a.calls {
		resp.Content = append(resp.Content, anthropicToolUseBlock{Type: "tool_use", ID: callID("toolu_", tc.n), Name: tc.name, Input: tc.input})
	}
	return resp
}

func containsString(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// setRateHeaders writes anthropic-ratelimit-*: input-tokens-* and
// output-tokens-* report the key's ITPM and OTPM buckets (each the TPM
// bucket when the key has no such limit), tokens-* the most restrictive
// token bucket in effect, as Anthropic's tokens-* do. Resets are RFC 3339
// times at which the bucket is full again, rounded up to the second. An
// unlimited bucket sends no headers.
func (anthropicWire) setRateHeaders(h http.Header, s snapshot) {
	set := func(name string, st state) {
		if !st.limited {
			return
		}
		h.Set("anthropic-ratelimit-"+name+"-limit", strconv.Itoa(st.limit))
		h.Set("anthropic-ratelimit-"+name+"-remaining", strconv.Itoa(st.remaining))
		reset := s.now.Add(st.reset)
		if t := reset.Truncate(time.Second); !t.Equal(reset) {
			reset = t.Add(time.Second)
		}
		h.Set("anthropic-ratelimit-"+name+"-reset", reset.UTC().Format(time.RFC3339))
	}
	orTokens := func(st state) state {
		if st.limited {
			return st
		}
		return s.tokens
	}
	set("requests", s.requests)
	set("tokens", s.tightest())
	set("input-tokens", orTokens(s.input))
	set("output-tokens", orTokens(s.output))
}

type anthropicErrorBody struct {
	Type      string               `json:"type"`
	Error     anthropicErrorDetail `json:"error"`
	RequestID string               `json:"request_id"`
}

type anthropicErrorDetail struct {
	Type    string                 `json:"type"`
	Message string                 `json:"message"`
	Details *anthropicErrorDetails `json:"details,omitempty"`
}

// anthropicErrorDetails carries the error_code that tells a spend cap from
// a rate limit: both are 429 rate_limit_error.
type anthropicErrorDetails struct {
	ErrorCode string `json:"error_code"`
}

const anthropicRateLimitDocs = "For details, refer to: https://docs.claude.com/en/api/rate-limits. " +
	"You can see the response headers for current usage."

func (anthropicWire) writeError(w http.ResponseWriter, e *apiError, requestID string) {
	d := anthropicErrorDetail{}
	status := http.StatusBadRequest
	switch e.kind {
	case errInvalid:
		d.Type, d.Message = "invalid_request_error", e.message
		if e.status != 0 {
			status = e.status
		}
		if status == http.StatusRequestEntityTooLarge {
			d.Type = "request_too_large"
		}
	case errAuth:
		status, d.Type, d.Message = http.StatusUnauthorized, "authentication_error", "x-api-key header is required"
	case errRateLimit:
		status, d.Type = http.StatusTooManyRequests, "rate_limit_error"
		if e.limit > 0 {
			d.Message = fmt.Sprintf("This request would exceed the rate limit for your organization of %d %s per minute. %s "+
				"Please reduce the prompt length or the maximum tokens requested, or try again later.", e.limit, e.limitedBy, anthropicRateLimitDocs)
		} else {
			d.Message = "This request would exceed your organization's rate limit. " + anthropicRateLimitDocs
		}
	case errTooLarge:
		status, d.Type = http.StatusTooManyRequests, "rate_limit_error"
		d.Message = fmt.Sprintf("This request would exceed the rate limit for your organization of %d tokens per minute "+
			"even with the limit fully available: it needs %d tokens (input + max_tokens). "+
			"Reduce the prompt length or max_tokens. %s", e.limit, e.requested, anthropicRateLimitDocs)
	case errOverloaded:
		status, d.Type, d.Message = 529, "overloaded_error", "Overloaded"
	case errServer:
		status, d.Type, d.Message = http.StatusInternalServerError, "api_error", "Internal server error"
	case errQuota:
		status, d.Type = http.StatusTooManyRequests, "rate_limit_error"
		d.Message = "This request would exceed your organization's monthly spend limit. " +
			"Usage resumes at the start of next month or when you move to a higher tier."
		d.Details = &anthropicErrorDetails{ErrorCode: "enforced_spend_limit_reached"}
	}
	if e.custom != "" {
		d.Message = e.custom
	}
	if e.retryAfter > 0 {
		w.Header().Set("retry-after", strconv.FormatInt(retryAfterSeconds(e.retryAfter), 10))
	}
	writeJSON(w, status, anthropicErrorBody{Type: "error", Error: d, RequestID: requestID})
}
