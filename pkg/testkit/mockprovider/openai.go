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

// openAIBase is what the OpenAI endpoints (chat and embeddings) share:
// Bearer auth, x-ratelimit-* headers and the error shape.
type openAIBase struct{}

func (openAIBase) provider() provider                { return providerOpenAI }
func (openAIBase) requestIDHeader() string           { return "x-request-id" }
func (openAIBase) preflight(*http.Request) *apiError { return nil }

func (openAIBase) apiKey(r *http.Request) string { return bearerKey(r) }

// bearerKey reads "Authorization: Bearer <key>" (scheme case-insensitive).
func bearerKey(r *http.Request) string {
	scheme, key, ok := strings.Cut(strings.TrimSpace(r.Header.Get("Authorization")), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return ""
	}
	return strings.TrimSpace(key)
}

// formatOpenAIDuration renders d as OpenAI's reset headers and messages do:
// a Go-style duration rounded up to the millisecond ("1s", "6m0s", "120ms",
// "1.5s").
func formatOpenAIDuration(d time.Duration) string {
	if d <= 0 {
		return "0s"
	}
	return ((d + time.Millisecond - 1) / time.Millisecond * time.Millisecond).String()
}

// setRateHeaders writes x-ratelimit-{limit,remaining,reset}-{requests,
// tokens}; a reset is the time until the bucket is full again. An unlimited
// bucket sends no headers.
func (openAIBase) setRateHeaders(h http.Header, s snapshot) {
	set := func(name string, st state) {
		if !st.limited {
			return
		}
		h.Set("x-ratelimit-limit-"+name, strconv.Itoa(st.limit))
		h.Set("x-ratelimit-remaining-"+name, strconv.Itoa(st.remaining))
		h.Set("x-ratelimit-reset-"+name, formatOpenAIDuration(st.reset))
	}
	set("requests", s.requests)
	set("tokens", s.tokens)
}

type openAIErrorBody struct {
	Error openAIErrorDetail `json:"error"`
}

type openAIErrorDetail struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    *string `json:"code"`
}

const openAIRateLimitDocs = "Visit https://platform.openai.com/account/rate-limits to learn more."

func (openAIBase) writeError(w http.ResponseWriter, e *apiError, _ string) {
	str := func(s string) *string { return &s }
	d := openAIErrorDetail{}
	status := http.StatusBadRequest
	perMin := func() string {
		if e.limitedBy != limitByRequests {
			return "tokens per min (TPM)"
		}
		return "requests per min (RPM)"
	}
	model := e.model
	if model == "" {
		model = "this model"
	}
	switch e.kind {
	case errInvalid:
		d.Type, d.Message = "invalid_request_error", e.message
		if e.status != 0 {
			status = e.status
		}
		if e.param != "" {
			d.Param = str(e.param)
		}
	case errAuth:
		status, d.Type = http.StatusUnauthorized, "invalid_request_error"
		d.Message = "You didn't provide an API key. You need to provide your API key in an Authorization header " +
			"using Bearer auth (i.e. Authorization: Bearer YOUR_KEY)."
	case errRateLimit:
		status, d.Type, d.Code = http.StatusTooManyRequests, e.limitedBy, str("rate_limit_exceeded")
		if e.limit > 0 {
			d.Message = fmt.Sprintf("Rate limit reached for %s in organization org-mock on %s: Limit %d, Used %d, Requested %d. "+
				"Please try again in %s. %s", model, perMin(), e.limit, e.used, e.requested, formatOpenAIDuration(e.retryAfter), openAIRateLimitDocs)
		} else {
			d.Message = fmt.Sprintf("Rate limit reached for %s in organization org-mock on %s. Please try again in %s. %s",
				model, perMin(), formatOpenAIDuration(e.retryAfter), openAIRateLimitDocs)
		}
	case errTooLarge:
		status, d.Type, d.Code = http.StatusTooManyRequests, "tokens", str("rate_limit_exceeded")
		d.Message = fmt.Sprintf("Request too large for %s in organization org-mock on tokens per min (TPM): Limit %d, Requested %d. "+
			"The input or output tokens must be reduced in order to run successfully. %s", model, e.limit, e.requested, openAIRateLimitDocs)
	case errOverloaded:
		status, d.Type = http.StatusServiceUnavailable, "server_error"
		d.Message = "The engine is currently overloaded, please try again later."
	case errServer:
		status, d.Type = http.StatusInternalServerError, "server_error"
		d.Message = "The server had an error while processing your request. Sorry about that!"
	case errQuota:
		status, d.Type, d.Code = http.StatusTooManyRequests, "insufficient_quota", str("insufficient_quota")
		d.Message = "You exceeded your current quota, please check your plan and billing details."
	}
	if e.custom != "" {
		d.Message = e.custom
	}
	if e.retryAfter > 0 {
		w.Header().Set("retry-after", strconv.FormatInt(retryAfterSeconds(e.retryAfter), 10))
		w.Header().Set("retry-after-ms", strconv.FormatInt(retryAfterMillis(e.retryAfter), 10))
	}
	writeJSON(w, status, openAIErrorBody{Error: d})
}

// chatWire is OpenAI Chat Completions: POST /v1/chat/completions.
type chatWire struct{ openAIBase }

func (chatWire) endpoint() string { return "chat" }

type chatRequest struct {
	Model               string          `json:"model"`
	Messages            []chatMessage   `json:"messages"`
	Tools               []chatTool      `json:"tools"`
	ToolChoice          json.RawMessage `json:"tool_choice"`
	ParallelToolCalls   *bool           `json:"parallel_tool_calls"`
	MaxTokens           *int            `json:"max_tokens"`
	MaxCompletionTokens *int            `json:"max_completion_tokens"`
	Temperature         *float64        `json:"temperature"`
	Stop                json.RawMessage `json:"stop"`
	Stream              bool            `json:"stream"`
	StreamOptions       json.RawMessage `json:"stream_options"`
	N                   *int            `json:"n"`
}

// chatStreamOptions is "stream_options".
type chatStreamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

type chatMessage struct {
	Role       string          `json:"role"`
	Content    json.RawMessage `json:"content"`
	ToolCalls  []chatToolCall  `json:"tool_calls"`
	ToolCallID string          `json:"tool_call_id"`
}

type chatToolCall struct {
	ID       string           `json:"id"`
	Type     string           `json:"type"`
	Function chatFunctionCall `json:"function"`
}

type chatFunctionCall struct {
	Name      string `json:"name"`
	Arguments string `json:"arguments"`
}

type chatTool struct {
	Type     string `json:"type"`
	Function struct {
		Name        string          `json:"name"`
		Description string          `json:"description"`
		Parameters  json.RawMessage `json:"parameters"`
	} `json:"function"`
}

type chatToolChoice struct {
	Type     string `json:"type"`
	Function struct {
		Name string `json:"name"`
	} `json:"function"`
}

type chatResponse struct {
	ID      string       `json:"id"`
	Object  string       `json:"object"`
	Created int64        `json:"created"`
	Model   string       `json:"model"`
	Choices []chatChoice `json:"choices"`
	Usage   chatUsage    `json:"usage"`
}

type chatChoice struct {
	Index        int            `json:"index"`
	Message      chatOutMessage `json:"message"`
	Logprobs     *struct{}      `json:"logprobs"`
	FinishReason string         `json:"finish_reason"`
}

type chatOutMessage struct {
	Role      string         `json:"role"`
	Content   *string        `json:"content"`
	Refusal   *string        `json:"refusal"`
	ToolCalls []chatToolCall `json:"tool_calls,omitempty"`
}

type chatUsage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	TotalTokens      int `json:"total_tokens"`
}

// chatContentText reads message content: a string, null, or an array of
// parts of which the text parts count.
func chatContentText(raw json.RawMessage, field string) (string, *apiError) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return "", nil
	}
	if raw[0] == '"' {
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return "", invalid("%s: %v", field, err)
		}
		return s, nil
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if err := json.Unmarshal(raw, &parts); err != nil {
		return "", invalid("%s: want a string or an array of content parts: %v", field, err)
	}
	var sb strings.Builder
	for _, p := range parts {
		if p.Type == "text" {
			sb.WriteString(p.Text)
		}
	}
	return sb.String(), nil
}

// finishReason maps the neutral stop onto OpenAI's finish_reason.
func finishReason(k stopKind) string {
	switch k {
	case stopMaxTokens:
		return "length"
	case stopToolUse:
		return "tool_calls"
	}
	return "stop"
}

func (chatWire) parse(body []byte) (*call, *apiError) {
	var req chatRequest
	if err := json.Unmarshal(body, &req); err != nil {
		return nil, invalid("We could not parse the JSON body of your request: %v", err)
	}
	var opts chatStreamOptions
	if raw := bytes.TrimSpace(req.StreamOptions); len(raw) > 0 && !bytes.Equal(raw, []byte("null")) {
		if !req.Stream {
			// OpenAI's wording (as quoted in BerriAI/litellm#5803).
			return nil, &apiError{kind: errInvalid, param: "stream_options",
				message: "The 'stream_options' parameter is only allowed when 'stream' is enabled."}
		}
		if err := json.Unmarshal(raw, &opts); err != nil {
			return nil, &apiError{kind: errInvalid, param: "stream_options", message: fmt.Sprintf("stream_options: %v", err)}
		}
	}
	switch {
	case req.Model == "":
		return nil, invalid("you must provide a model parameter")
	case len(req.Messages) == 0:
		return nil, invalid("[] is too short - 'messages'")
	case req.N != nil && *req.N != 1:
		return nil, invalid("n: the mock provider answers n=1 only")
	case req.Temperature != nil && (*req.Temperature < 0 || *req.Temperature > 2):
		return nil, invalid("temperature: must be between 0 and 2")
	case req.MaxTokens != nil && *req.MaxTokens < 1:
		return nil, invalid("max_tokens: must be at least 1")
	case req.MaxCompletionTokens != nil && *req.MaxCompletionTokens < 1:
		return nil, invalid("max_completion_tokens: must be at least 1")
	}

	c := &conversation{choice: choiceAuto, singleCall: req.ParallelToolCalls != nil && !*req.ParallelToolCalls}
	reserve, cut := OpenAIMaxTokensDefault, false
	if req.MaxTokens != nil {
		reserve, cut = *req.MaxTokens, true
	}
	if req.MaxCompletionTokens != nil {
		reserve, cut = *req.MaxCompletionTokens, true
	}
	if limit, ok := MaxOutputTokens(req.Model); ok && cut && reserve > limit {
		// OpenAI's wording (as quoted in ChatGPTNextWeb/NextChat#3195).
		param := "max_tokens"
		if req.MaxCompletionTokens != nil {
			param = "max_completion_tokens"
		}
		return nil, &apiError{kind: errInvalid, param: param, message: fmt.Sprintf(
			"%s is too large: %d. This model supports at most %d completion tokens, whereas you provided %d.", param, reserve, limit, reserve)}
	}
	c.maxTokens = reserve
	if !cut {
		c.maxTokens = 1 << 30 // no limit asked: never cut the answer
	}

	stops, e := parseStop(req.Stop)
	if e != nil {
		return nil, e
	}
	c.stops = stops

	lastAssistant := -1
	for i, m := range req.Messages {
		if m.Role == "assistant" {
			lastAssistant = i
		}
	}
	inputBytes := 0
	for i, m := range req.Messages {
		field := fmt.Sprintf("messages[%d]", i)
		text, e := chatContentText(m.Content, field+".content")
		if e != nil {
			return nil, e
		}
		inputBytes += len(text)
		switch m.Role {
		case "system", "developer":
		case "user":
			c.lastUserText = text
		case "assistant":
			for j, tc := range m.ToolCalls {
				if tc.ID == "" || tc.Function.Name == "" {
					return nil, invalid("%s.tool_calls[%d]: id and function.name are required", field, j)
				}
				inputBytes += len(tc.Function.Arguments)
				c.priorCalls++
			}
		case "tool":
			if m.ToolCallID == "" {
				return nil, invalid("%s.tool_call_id: missing required parameter", field)
			}
			if i > lastAssistant {
				c.toolResults = append(c.toolResults, ToolResult{Content: text})
			}
		default:
			return nil, invalid("%s.role: %q is not one of 'system', 'developer', 'user', 'assistant', 'tool'", field, m.Role)
		}
	}

	for i, t := range req.Tools {
		if t.Type != "function" || t.Function.Name == "" {
			return nil, invalid("tools[%d]: want type \"function\" with function.name", i)
		}
		c.tools = append(c.tools, t.Function.Name)
	}
	if e := parseChatToolChoice(req.ToolChoice, c); e != nil {
		return nil, e
	}

	input := tokensForBytes(inputBytes)
	cl := &call{
		model:       req.Model,
		inputTokens: input,
		reserve:     reserve,
		build: func(now time.Time) (any, int) {
			a := answerTo(c)
			return chatCompletion(req.Model, now, input, a), a.outputTokens
		},
	}
	if req.Stream {
		cl.stream = func(now time.Time, chunkBytes int) *script {
			return chatScript(chatCompletion(req.Model, now, input, answerTo(c)), opts.IncludeUsage, chunkBytes)
		}
	}
	return cl, nil
}

// chatCompletion is the chat.completion carrying a.
func chatCompletion(model string, now time.Time, input int, a answer) chatResponse {
	msg := chatOutMessage{Role: "assistant"}
	if len(a.calls) == 0 {
		msg.Content = &a.text
	}
	for _, tc := range a.calls {
		msg.ToolCalls = append(msg.ToolCalls, chatToolCall{
			ID: callID("call_", tc.n), Type: "function",
			Function: chatFunctionCall{Name: tc.name, Arguments: string(tc.input)},
		})
	}
	return chatResponse{
		ID:      "chatcmpl-" + randomHex(12),
		Object:  "chat.completion",
		Created: now.Unix(),
		Model:   model,
		Choices: []chatChoice{{Index: 0, Message: msg, FinishReason: finishReason(a.stop)}},
		Usage:   chatUsage{PromptTokens: input, CompletionTokens: a.outputTokens, TotalTokens: input + a.outputTokens},
	}
}

// parseStop reads "stop": a string or up to 4 strings.
func parseStop(raw json.RawMessage) ([]string, *apiError) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return nil, nil
	}
	if raw[0] == '"' {
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, invalid("stop: %v", err)
		}
		return []string{s}, nil
	}
	var list []string
	if err := json.Unmarshal(raw, &list); err != nil {
		return nil, invalid("stop: want a string or an array of strings: %v", err)
	}
	if len(list) > 4 {
		return nil, invalid("stop: at most 4 sequences")
	}
	return list, nil
}

// parseChatToolChoice reads "tool_choice": "none", "auto", "required" or
// {"type":"function","function":{"name":...}}.
func parseChatToolChoice(raw json.RawMessage, c *conversation) *apiError {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return nil
	}
	if raw[0] == '"' {
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return invalid("tool_choice: %v", err)
		}
		switch s {
		case "none":
			c.choice = choiceNone
		case "auto":
			c.choice = choiceAuto
		case "required":
			if len(c.tools) == 0 {
				return invalid("tool_choice: 'required' needs tools")
			}
			c.choice = choiceAny
		default:
			return invalid("tool_choice: want 'none', 'auto', 'required' or a function")
		}
		return nil
	}
	var tc chatToolChoice
	if err := json.Unmarshal(raw, &tc); err != nil {
		return invalid("tool_choice: %v", err)
	}
	if tc.Type != "function" || !containsString(c.tools, tc.Function.Name) {
		return invalid("tool_choice: function %q is not in tools", tc.Function.Name)
	}
	c.choice, c.choiceName = choiceTool, tc.Function.Name
	return nil
}
