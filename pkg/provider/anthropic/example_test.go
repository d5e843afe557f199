package anthropic_test

import (
	"fmt"

	"bulwark/pkg/provider/anthropic"
	"bulwark/pkg/provider/openai"
)

// A request that arrived at the Anthropic-compatible endpoint is decoded
// into the neutral model and, when Claude is exhausted, sent to OpenAI in
// its shape.
func ExampleDecodeRequest() {
	body := []byte(`{
		"model": "claude-sonnet-4-5",
		"max_tokens": 200,
		"system": "Be brief.",
		"messages": [{"role": "user", "content": "Why did OTA batch 42 fail?"}]
	}`)
	info, req, err := anthropic.DecodeRequest(body)
	if err != nil {
		fmt.Println("400:", err)
		return
	}
	req.Model = "gpt-4o" // the fallback tier's model
	out, err := openai.EncodeRequest(req)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(info.Model, info.Stream)
	fmt.Println(string(out))
	// Output:
	// claude-sonnet-4-5 false
	// {"model":"gpt-4o","messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Why did OTA batch 42 fail?"}],"max_completion_tokens":200}
}
