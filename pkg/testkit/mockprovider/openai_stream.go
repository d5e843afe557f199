package mockprovider

// OpenAI Chat Completions streaming (also Azure's, which serves the same
// wire), as the API reference documents it ("Create chat completion",
// stream and stream_options; "The chat completion chunk object",
// https://platform.openai.com/docs/api-reference/chat-streaming): data-only
// server-sent events, each "data: " and one chat.completion.chunk, every
// chunk with the same id, created and model:
//
//	the role chunk       delta {"role":"assistant","content":""} (content null
//	                     when the answer calls tools)
//	content chunks       delta {"content": piece}
//	tool calls           per call a first chunk {"index","id","type":"function",
//	                     "function":{"name","arguments":""}}, then pieces
//	                     {"index","function":{"arguments": piece}}
//	the finish chunk     delta {} and finish_reason
//	the usage chunk      with "stream_options":{"include_usage":true} only:
//	                     "choices":[] and the usage of the whole request;
//	                     every other chunk then carries "usage":null
//	data: [DONE]
//
// When a stream fault breaks it, the stream ends with a line
// data: {"error":{"message",...,"type":"server_error"}} and no [DONE], the
// shape OpenAI's SDKs look for in a chunk (openai-go ssestream: a data
// object with an "error" key ends the stream with an error).

import "encoding/json"

type chatChunk struct {
	ID      string            `json:"id"`
	Object  string            `json:"object"`
	Created int64             `json:"created"`
	Model   string            `json:"model"`
	Choices []chatChunkChoice `json:"choices"`
	// Usage is null on every chunk but the usage chunk when the request
	// set include_usage, and absent otherwise.
	Usage json.RawMessage `json:"usage,omitempty"`
}

type chatChunkChoice struct {
	Index        int       `json:"index"`
	Delta        chatDelta `json:"delta"`
	Logprobs     *struct{} `json:"logprobs"`
	FinishReason *string   `json:"finish_reason"`
}

type chatDelta struct {
	Role string `json:"role,omitempty"`
	// Content is a JSON string, or null in the role chunk of a tool-call
	// answer; absent in the other chunks.
	Content   json.RawMessage     `json:"content,omitempty"`
	ToolCalls []chatToolCallDelta `json:"tool_calls,omitempty"`
}

type chatToolCallDelta struct {
	Index    int               `json:"index"`
	ID       string            `json:"id,omitempty"`
	Type     string            `json:"type,omitempty"`
	Function chatFunctionDelta `json:"function"`
}

type chatFunctionDelta struct {
	Name      string `json:"name,omitempty"`
	Arguments string `json:"arguments"`
}

// chatScript renders resp as a Chat Completions stream whose content
// chunks carry at most chunkBytes bytes of text or arguments.
func chatScript(resp chatResponse, includeUsage bool, chunkBytes int) *script {
	choice := resp.Choices[0]
	out := resp.Usage.CompletionTokens
	var usageNull json.RawMessage
	if includeUsage {
		usageNull = json.RawMessage("null")
	}
	chunk := func(d chatDelta, finish *string) frame {
		return sseData(chatChunk{ID: resp.ID, Object: "chat.completion.chunk", Created: resp.Created, Model: resp.Model,
			Choices: []chatChunkChoice{{Index: choice.Index, Delta: d, FinishReason: finish}}, Usage: usageNull})
	}
	content := func(d chatDelta, streamed int) frame {
		f := chunk(d, nil)
		f.content, f.tokens = true, produced(streamed, out)
		return f
	}

	role := chatDelta{Role: "assistant", Content: json.RawMessage("null")}
	if choice.Message.Content != nil {
		role.Content = json.RawMessage(`""`)
	}
	sc := &script{
		head:         []frame{chunk(role, nil)},
		outputTokens: out,
		fail: func(message string) frame {
			if message == "" {
				message = "The server had an error while processing your request. Sorry about that!"
			}
			return sseData(openAIErrorBody{Error: openAIErrorDetail{Message: message, Type: "server_error"}})
		},
	}
	streamed := 0 // bytes of output so far, as CountTokens counts them
	if choice.Message.Content != nil {
		for _, p := range pieces(*choice.Message.Content, chunkBytes) {
			streamed += len(p)
			sc.body = append(sc.body, content(chatDelta{Content: eventJSON(p)}, streamed))
		}
	}
	for i, tc := range choice.Message.ToolCalls {
		streamed += len(tc.Function.Name)
		sc.body = append(sc.body, content(chatDelta{ToolCalls: []chatToolCallDelta{{Index: i, ID: tc.ID, Type: tc.Type,
			Function: chatFunctionDelta{Name: tc.Function.Name}}}}, streamed))
		for _, p := range pieces(tc.Function.Arguments, chunkBytes) {
			streamed += len(p)
			sc.body = append(sc.body, content(chatDelta{ToolCalls: []chatToolCallDelta{{Index: i,
				Function: chatFunctionDelta{Arguments: p}}}}, streamed))
		}
	}
	finish := choice.FinishReason
	sc.body = append(sc.body, chunk(chatDelta{}, &finish))
	if includeUsage {
		sc.body = append(sc.body, sseData(chatChunk{ID: resp.ID, Object: "chat.completion.chunk", Created: resp.Created,
			Model: resp.Model, Choices: []chatChunkChoice{}, Usage: eventJSON(resp.Usage)}))
	}
	sc.body = append(sc.body, frame{data: []byte("data: [DONE]\n\n")})
	return sc
}
