package service_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	ooption "github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"

	"bulwark/pkg/testkit/mockprovider"
)

// openai-go's Responses client, pointed at Bulwark, gets plain, tool-use
// (a function_call item, then its function_call_output) and streamed
// answers through the same layers as Chat Completions; with OpenAI forced
// to 429 the answer comes from Claude, as a response object; what needs
// stored state is refused with a 400 in OpenAI's error format.
func TestResponsesSDK(t *testing.T) {
	t.Parallel()
	s := newSystem(t, opts{extraYML: "cache: {enabled: false}"})
	api := s.startAPI()
	s.startWorker()
	c := openAIAt(api, devToken)
	ctx := context.Background()
	input := func(items ...responses.ResponseInputItemUnionParam) responses.ResponseNewParamsInputUnion {
		return responses.ResponseNewParamsInputUnion{OfInputItemList: items}
	}

	prompt := "summarise the OTA failure"
	var hdr *http.Response
	resp, err := c.Responses.New(ctx, responses.ResponseNewParams{Model: "gpt-4o", Instructions: openai.String("be brief"),
		Input: responses.ResponseNewParamsInputUnion{OfString: openai.String(prompt)}}, ooption.WithResponseInto(&hdr))
	if err != nil {
		t.Fatalf("plain: %v", err)
	}
	if resp.OutputText() != mockprovider.Reply(prompt) || resp.Model != "gpt-4o" || resp.Status != responses.ResponseStatusCompleted ||
		!strings.HasPrefix(resp.ID, "resp_") || resp.Usage.TotalTokens == 0 {
		t.Fatalf("plain answer %s", resp.RawJSON())
	}
	if hdr.Header.Get("X-Bulwark-Request-Id") == "" || hdr.Header.Get("X-Bulwark-Provider") != "openai" {
		t.Fatalf("headers %v", hdr.Header)
	}

	// Tool use: the call, then its output in the next request's input.
	ask := responses.ResponseInputItemParamOfMessage("run fetch_logs for car 17", responses.EasyInputMessageRoleUser)
	params := responses.ResponseNewParams{Model: "gpt-4o", Input: input(ask),
		Tools: []responses.ToolUnionParam{responses.ToolParamOfFunction("fetch_logs",
			map[string]any{"type": "object", "properties": map[string]any{"car": map[string]any{"type": "string"}}}, false)}}
	resp, err = c.Responses.New(ctx, params)
	if err != nil {
		t.Fatalf("tool round: %v", err)
	}
	if len(resp.Output) != 1 || resp.Output[0].Type != "function_call" {
		t.Fatalf("tool round: %s", resp.RawJSON())
	}
	call := resp.Output[0].AsFunctionCall()
	if call.Name != "fetch_logs" || call.CallID == "" || !strings.HasPrefix(call.ID, "fc_") {
		t.Fatalf("tool round: %s", resp.RawJSON())
	}
	params.Input = input(ask, responses.ResponseInputItemParamOfFunctionCall(call.Arguments, call.CallID, call.Name),
		responses.ResponseInputItemParamOfFunctionCallOutput("3 errors found"))
	params.Input.OfInputItemList[2].OfFunctionCallOutput.CallID = openai.String(call.CallID)
	resp, err = c.Responses.New(ctx, params)
	if err != nil || resp.OutputText() != "tool results: 3 errors found" {
		t.Fatalf("result round: %v %s", err, resp.RawJSON())
	}

	// Streaming, text and then a function call, read with the SDK's events.
	text := streamResponse(t, c, responses.ResponseNewParams{Model: "gpt-4o",
		Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("stream it")}})
	if got := text.OutputText(); got != mockprovider.Reply("stream it") {
		t.Fatalf("stream: %q", got)
	}
	params.Input = input(ask)
	streamed := streamResponse(t, c, params)
	if len(streamed.Output) != 1 || streamed.Output[0].AsFunctionCall().Name != "fetch_logs" {
		t.Fatalf("streamed call: %s", streamed.RawJSON())
	}

	// OpenAI is out of capacity: Claude answers, as a response object.
	if err := s.mock.SetFault(mockprovider.Fault{Provider: "openai", Mode: mockprovider.FaultRateLimit, RetryAfter: time.Second}); err != nil {
		t.Fatal(err)
	}
	resp, err = c.Responses.New(ctx, params, ooption.WithResponseInto(&hdr))
	if err != nil {
		t.Fatalf("fallback: %v", err)
	}
	if hdr.Header.Get("X-Bulwark-Provider") != "claude" || resp.Output[0].AsFunctionCall().Name != "fetch_logs" || resp.Model != "gpt-4o" {
		t.Fatalf("fallback answer from %s: %s", hdr.Header.Get("X-Bulwark-Provider"), resp.RawJSON())
	}

	// Stored state is refused, in OpenAI's error format.
	_, err = c.Responses.New(ctx, responses.ResponseNewParams{Model: "gpt-4o", PreviousResponseID: openai.String(resp.ID),
		Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("and then?")}})
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 400 || apiErr.Type != "invalid_request_error" ||
		!strings.Contains(apiErr.Message, "previous_response_id") {
		t.Fatalf("previous_response_id: %v", err)
	}
}

// streamResponse streams params with openai-go and returns the response
// its terminal event carries, after checking that the events come in
// sequence and the text deltas add up to the final text.
func streamResponse(t *testing.T, c openai.Client, params responses.ResponseNewParams) *responses.Response {
	t.Helper()
	stream := c.Responses.NewStreaming(context.Background(), params)
	defer stream.Close()
	var deltas strings.Builder
	var final *responses.Response
	seq := int64(0)
	for stream.Next() {
		ev := stream.Current()
		if ev.SequenceNumber != seq {
			t.Errorf("%s: sequence_number %d, want %d", ev.Type, ev.SequenceNumber, seq)
		}
		seq++
		switch ev.Type {
		case "response.output_text.delta":
			deltas.WriteString(ev.Delta)
		case "response.completed", "response.incomplete":
			r := ev.Response
			final = &r
		case "error", "response.failed":
			t.Fatalf("stream failed: %s", ev.RawJSON())
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatalf("stream: %v", err)
	}
	if final == nil {
		t.Fatal("the stream ended without response.completed")
	}
	if deltas.String() != final.OutputText() {
		t.Errorf("deltas %q, final text %q", deltas.String(), final.OutputText())
	}
	return final
}

// An earlier answer's output item may be named instead of sent again
// (item_reference, what the AI SDK sends for earlier assistant turns by
// default): it is read from the tenant's own answer and becomes the
// assistant turn of the new request. A reference to another tenant's
// answer, or to none, is a 400 that says so.
func TestResponsesItemReference(t *testing.T) {
	t.Parallel()
	s := newSystem(t, opts{extraYML: "cache: {enabled: false}",
		tenantYML: `{name: stranger, token: "stranger-token", max_priority: critical}`})
	api := s.startAPI()
	s.startWorker()
	c := openAIAt(api, devToken)
	ctx := context.Background()
	first, err := c.Responses.New(ctx, responses.ResponseNewParams{Model: "gpt-4o",
		Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("what failed on car 7?")}})
	if err != nil {
		t.Fatal(err)
	}
	turns := func(ref string) responses.ResponseNewParams {
		return responses.ResponseNewParams{Model: "gpt-4o", Input: responses.ResponseNewParamsInputUnion{OfInputItemList: []responses.ResponseInputItemUnionParam{
			responses.ResponseInputItemParamOfMessage("what failed on car 7?", responses.EasyInputMessageRoleUser),
			responses.ResponseInputItemParamOfItemReference(ref),
			responses.ResponseInputItemParamOfMessage("and how do I fix it?", responses.EasyInputMessageRoleUser)}}}
	}
	var hdr *http.Response
	second, err := c.Responses.New(ctx, turns(first.Output[0].ID), ooption.WithResponseInto(&hdr))
	if err != nil || second.OutputText() != mockprovider.Reply("and how do I fix it?") {
		t.Fatalf("with a reference to %s: %v %v (%s)", first.Output[0].ID, err, second, errorBody(err))
	}
	rec, err := api.base.Jobs.Get(ctx, hdr.Header.Get("X-Bulwark-Request-Id"))
	if err != nil {
		t.Fatal(err)
	}
	if m := rec.Job.Request.Messages; len(m) != 3 || m[1].Role != "assistant" || m[1].Content[0].Text != first.OutputText() {
		t.Fatalf("the request asked the provider %+v; want the referenced answer as its assistant turn", m)
	}
	var apiErr *openai.Error
	for name, tt := range map[string]struct {
		client openai.Client
		ref    string
	}{
		"another tenant's answer": {openAIAt(api, "stranger-token"), first.Output[0].ID},
		"no answer":               {c, "msg_req_nothing_0"},
		"past the answer's items": {c, strings.TrimSuffix(first.Output[0].ID, "_0") + "_9"},
	} {
		_, err := tt.client.Responses.New(ctx, turns(tt.ref))
		if !errors.As(err, &apiErr) || apiErr.StatusCode != 400 || !strings.Contains(apiErr.Message, "not an output item of one of this tenant's answers") {
			t.Errorf("%s: %v, want a 400 saying so", name, err)
		}
	}
}

// errorBody is the JSON of an OpenAI SDK error, for failure messages.
func errorBody(err error) string {
	var e *openai.Error
	if errors.As(err, &e) {
		return e.RawJSON()
	}
	return ""
}
