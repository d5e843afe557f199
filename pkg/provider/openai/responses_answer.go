package openai

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"bulwark/pkg/llm"
	"bulwark/pkg/provider"
	"bulwark/pkg/provider/internal/wirejson"
)

// Statuses of a response and of its output items.
const (
	respCompleted  = "completed"
	respIncomplete = "incomplete"
	respInProgress = "in_progress"
	respFailed     = "failed"
)

// outRespObject is a response object as sent: the answer, and the shell
// that response.created, response.in_progress and response.failed carry.
// The request's parameters are not echoed: tools, metadata and the
// sampling settings are reported as their defaults.
type outRespObject struct {
	ID                 string           `json:"id"`
	Object             string           `json:"object"`
	CreatedAt          int64            `json:"created_at"`
	Status             string           `json:"status"`
	Background         bool             `json:"background"`
	CompletedAt        *int64           `json:"completed_at"`
	Error              *outRespError    `json:"error"`
	IncompleteDetails  *outIncomplete   `json:"incomplete_details"`
	Instructions       *string          `json:"instructions"`
	MaxOutputTokens    *int             `json:"max_output_tokens"`
	Model              string           `json:"model"`
	Output             []outRespItem    `json:"output"`
	ParallelToolCalls  bool             `json:"parallel_tool_calls"`
	PreviousResponseID *string          `json:"previous_response_id"`
	Reasoning          outRespReasoning `json:"reasoning"`
	// Store is always false: Bulwark keeps no response to fetch or
	// continue from, whatever the request said.
	Store       bool            `json:"store"`
	Temperature float64         `json:"temperature"`
	Text        outRespText     `json:"text"`
	ToolChoice  string          `json:"tool_choice"`
	Tools       []struct{}      `json:"tools"`
	TopP        float64         `json:"top_p"`
	Truncation  string          `json:"truncation"`
	Usage       *outRespUsage   `json:"usage"`
	User        *string         `json:"user"`
	Metadata    json.RawMessage `json:"metadata"`
}

type outRespError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

type outIncomplete struct {
	Reason string `json:"reason"`
}

type outRespReasoning struct {
	Effort  *string `json:"effort"`
	Summary *string `json:"summary"`
}

type outRespText struct {
	Format struct {
		Type string `json:"type"`
	} `json:"format"`
}

// outRespItem is an output item: a message (Role, Content) or a
// function_call (CallID, Name, Arguments).
type outRespItem struct {
	ID        string        `json:"id"`
	Type      string        `json:"type"`
	Status    string        `json:"status"`
	Role      string        `json:"role,omitempty"`
	Content   []outRespPart `json:"content,omitzero"` // [] for a message item yet empty
	CallID    string        `json:"call_id,omitempty"`
	Name      string        `json:"name,omitempty"`
	Arguments *string       `json:"arguments,omitempty"`
}

// outRespPart is an output_text content part.
type outRespPart struct {
	Type        string     `json:"type"`
	Annotations []struct{} `json:"annotations"`
	Logprobs    []struct{} `json:"logprobs"`
	Text        string     `json:"text"`
}

type outRespUsage struct {
	InputTokens        int `json:"input_tokens"`
	InputTokensDetails struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"input_tokens_details"`
	OutputTokens        int `json:"output_tokens"`
	OutputTokensDetails struct {
		ReasoningTokens int `json:"reasoning_tokens"`
	} `json:"output_tokens_details"`
	TotalTokens int `json:"total_tokens"`
}

// EncodeResponsesResponse renders resp as a Responses API response object,
// as the compat endpoint answers it. model is the model name to report
// (the one the client asked for); empty means resp.Model. An empty resp.ID
// gets a fresh "resp_…" id. Each text block becomes a message item with
// one output_text part, each tool_use block a function_call item, in
// order. An answer cut at max tokens is status "incomplete" with
// incomplete_details.reason "max_output_tokens"; a refusal likewise with
// "content_filter".
func EncodeResponsesResponse(resp *llm.Response, model string) ([]byte, error) {
	return encodeResponsesResponse(resp, model, time.Now().Unix())
}

func encodeResponsesResponse(resp *llm.Response, model string, now int64) ([]byte, error) {
	if resp == nil {
		return nil, errors.New("openai: encode response: nil response")
	}
	id := resp.ID
	if id == "" {
		id = provider.NewID("resp_")
	}
	if model == "" {
		model = resp.Model
	}
	out, err := finalResponse(id, model, now, now, resp)
	if err != nil {
		return nil, err
	}
	body, err := wirejson.Marshal(out)
	if err != nil {
		return nil, fmt.Errorf("openai: encode response: %w", err)
	}
	return body, nil
}

// respShell is the response object before its end: status in_progress,
// no output, no usage.
func respShell(id, model string, created int64) outRespObject {
	o := outRespObject{ID: id, Object: "response", CreatedAt: created, Status: respInProgress, Model: model,
		Output: []outRespItem{}, ParallelToolCalls: true, Temperature: 1, ToolChoice: "auto",
		Tools: []struct{}{}, TopP: 1, Truncation: "disabled", Metadata: json.RawMessage("{}")}
	o.Text.Format.Type = "text"
	return o
}

// finalResponse is the whole answer as a response object; its items' ids
// are those a stream of the same id gave them.
func finalResponse(id, model string, created, completed int64, resp *llm.Response) (outRespObject, error) {
	o := respShell(id, model, created)
	o.Status = respStatus(resp.StopReason)
	if o.Status == respIncomplete {
		o.IncompleteDetails = &outIncomplete{Reason: incompleteReason(resp.StopReason)}
	} else {
		o.CompletedAt = &completed
	}
	for i, b := range resp.Content {
		item, err := respItem(id, i, b, itemStatus(o.Status, i, len(resp.Content)))
		if err != nil {
			return outRespObject{}, err
		}
		o.Output = append(o.Output, item)
	}
	o.Usage = respUsageOf(resp.Usage)
	return o, nil
}

// respStatus is a response's status by its stop reason: incomplete when
// the model did not end its answer itself.
func respStatus(r llm.StopReason) string {
	if r == llm.StopMaxTokens || r == llm.StopRefusal {
		return respIncomplete
	}
	return respCompleted
}

func incompleteReason(r llm.StopReason) string {
	if r == llm.StopRefusal {
		return "content_filter"
	}
	return "max_output_tokens"
}

// itemStatus is output item i's status: the last item of an incomplete
// answer is the one that was cut.
func itemStatus(resp string, i, n int) string {
	if resp == respIncomplete && i == n-1 {
		return respIncomplete
	}
	return respCompleted
}

// respItem renders block i of an answer as an output item.
func respItem(respID string, i int, b llm.Block, status string) (outRespItem, error) {
	switch b.Type {
	case llm.BlockText:
		return outRespItem{ID: itemID(respID, "msg_", i), Type: "message", Status: status, Role: "assistant",
			Content: []outRespPart{textPart(b.Text)}}, nil
	case llm.BlockToolUse:
		args := string(wirejson.ObjectOrEmpty(b.Input, "{}"))
		return outRespItem{ID: itemID(respID, "fc_", i), Type: "function_call", Status: status,
			CallID: b.ToolUseID, Name: b.ToolName, Arguments: &args}, nil
	}
	return outRespItem{}, fmt.Errorf("openai: encode response: content[%d]: a %q block cannot be part of an answer", i, b.Type)
}

func textPart(text string) outRespPart {
	return outRespPart{Type: "output_text", Annotations: []struct{}{}, Logprobs: []struct{}{}, Text: text}
}

// itemID names output item i of response respID ("resp_X" → "msg_X_0"):
// derived, so that a stream's items and its final response agree, and a
// replayed answer gets the same ids again.
func itemID(respID, prefix string, i int) string {
	return prefix + strings.TrimPrefix(respID, "resp_") + "_" + strconv.Itoa(i)
}

func respUsageOf(u llm.Usage) *outRespUsage {
	return &outRespUsage{InputTokens: u.InputTokens, OutputTokens: u.OutputTokens, TotalTokens: u.Total()}
}
