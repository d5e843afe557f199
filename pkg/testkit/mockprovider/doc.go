// Package mockprovider is a mock LLM provider that speaks both wire formats
// Bulwark calls — Anthropic Messages and OpenAI Chat Completions and
// Embeddings — over real HTTP, and enforces per-key rate limits with the
// real 429 bodies and rate-limit headers. Tests, benchmarks and `make run`
// talk to it instead of the real providers.
//
// # Endpoints
//
//	POST   /v1/messages          Anthropic; x-api-key (or Bearer) and anthropic-version required
//	POST   /v1/chat/completions  OpenAI; Authorization: Bearer <key>
//	POST   /v1/embeddings        OpenAI; input string or []string, optional dimensions
//	POST   /model/{id}/invoke    AWS Bedrock InvokeModel (Claude); SigV4 Authorization required (shape checked)
//	POST   /model/{id}/invoke-with-response-stream  Bedrock InvokeModelWithResponseStream: the same, as an AWS event stream
//	POST   /openai/deployments/{d}/chat/completions?api-version=  Azure OpenAI; api-key or Bearer
//	GET    /mock/stats           Stats as JSON (counters and in-flight gauges)
//	POST   /mock/reset           zero the counters and in-flight maxima, refill every bucket
//	GET    /mock/faults          faults in force
//	POST   /mock/faults          add a Fault: {"provider","key_fingerprint","mode","count","retry_after":"2s","message","after_chunks"}
//	DELETE /mock/faults          remove every fault
//	POST   /mock/latency         {"latency":"200ms","jitter":"50ms","stream_first_token":"500ms",
//	                             "stream_chunk_interval":"20ms","stream_chunk_tokens":1} (any of them)
//
// Any non-empty key is accepted; a missing one gets 401 in the provider's
// error shape. The /mock endpoints are unauthenticated: bind the mock to
// loopback. The Messages, Chat Completions and Azure endpoints stream when
// the body says "stream": true (see "Streaming"); Bedrock streams on its
// own path.
//
// # Answers
//
// Answers are deterministic, and exported so tests can compute what to
// expect. The text answer is Reply(last user text), cut at the earliest stop
// sequence or at max_tokens*4 bytes (stop_reason max_tokens, finish_reason
// length). When the request offers tools (tool_choice not none) and the last
// user turn carries no tool results, the answer calls tools instead: the one
// tool_choice names, else every tool whose name occurs in the last user text
// (parallel calls, unless parallel use is disabled), else the first tool;
// each call's input is ToolCallInput(last user text), and ids are
// "toolu_<n>" / "call_<n>" numbered on from the calls already in the
// conversation. When the last user turn carries tool results (Anthropic
// tool_result blocks in the last user message; OpenAI tool messages after
// the last assistant message), the answer is ToolResultsReply.
//
// Tokens are counted with CountTokens (ceil(bytes/4), at least 1): input
// over the bytes of the system prompt, message texts, tool inputs and tool
// results; output over the answer text (or the tool calls' names and
// inputs). Embeddings are Embed(input, dims), with prompt tokens the sum of
// CountTokens over the inputs.
//
// # Rate limits
//
// Each (endpoint, key) has a request limit (RPM) and a token limit (TPM)
// (Limits), metered the way the providers document it:
//
//   - Enforcement is quantized. OpenAI: "Rate limits can be quantized,
//     meaning they are enforced over shorter periods of time (e.g. 60,000
//     requests/minute may be enforced as 1,000 requests/second). Sending
//     short bursts of requests or contexts (prompts+max_tokens) that are too
//     long can lead to rate limit errors, even when you are technically
//     below the rate limit per minute" (OpenAI Help Center, "How can I
//     solve 429: 'Too Many Requests' errors?",
//     https://help.openai.com/en/articles/6891753). Anthropic: limits are
//     enforced with a token bucket whose capacity is replenished
//     continuously up to the maximum rather than reset at fixed intervals,
//     and a limit of 60 RPM may be enforced as 1 request per second, so
//     short bursts can exceed it (https://platform.claude.com/docs/en/api/rate-limits,
//     formerly docs.anthropic.com/en/api/rate-limits). The mock therefore
//     enforces each limit with a continuously refilled bucket holding
//     Config.Window's share of it (default WindowDefault, 1 s): RPM ×
//     Window/1m requests, at least 1, and TPM × Window/1m tokens, each
//     refilled at limit/60 per second. A 120-RPM key takes 2 calls at once,
//     then one every 500 ms. Window = time.Minute gives whole-minute
//     buckets (burst = RPM), which no provider promises.
//   - Tokens are charged the way each provider documents it. At
//     admission every call costs 1 request and input_tokens + max_tokens
//     tokens (OpenAI without max_tokens: OpenAIMaxTokensDefault). What
//     happens after the answer differs:
//     OpenAI: "your rate limit is calculated as the maximum of max_tokens
//     and the estimated number of tokens based on the character count of
//     your request" (OpenAI rate limits guide,
//     https://platform.openai.com/docs/guides/rate-limits, "Reduce the
//     max_tokens to match the size of your completions"); no refund of the
//     unused part is documented, and x-ratelimit-remaining-tokens reports
//     what is left. Azure OpenAI: "TPM rate limits are based on the
//     maximum number of tokens that are estimated to be processed by a
//     request at the time the request is received … not the same as the
//     token count used for billing" — prompt text and count, max_tokens,
//     best_of (Azure OpenAI "Manage quota", how-to/quota). So on the chat
//     and Azure endpoints the admission charge stands, also when the client
//     gives up mid-call (Config.RefundOpenAI gives the unused part back
//     instead, for comparison).
//     Anthropic: input and output tokens are limited separately (ITPM,
//     OTPM), and the output count is estimated from max_tokens when a
//     request starts and adjusted to the output actually produced when it
//     ends (rate-limits page above, as the design document reads it). Bedrock
//     reserves input + max_tokens of the tokens-per-minute quota at the
//     start of a request and adjusts to the real usage at its end ("How
//     tokens are counted in Amazon Bedrock", bedrock/latest/userguide/
//     quotas-token-burndown; its 5x output burndown for some Claude 4
//     models is not modelled). So on the Messages and Bedrock endpoints
//     the unused part of max_tokens (all of it when the client gives up)
//     goes back after the answer. A key's Limits.TPM meters input and
//     output together; Limits.ITPM and OTPM, when set, meter them apart
//     on the Messages endpoint (the other APIs have no such split),
//     input_tokens against ITPM and max_tokens against OTPM at admission.
//   - Limits apply per model on both providers; the mock limits each
//     endpoint separately.
//   - A request costing more tokens than the window holds but no more than
//     TPM passes when the window's bucket is full, and leaves the bucket in
//     debt (a negative level, refilled at TPM/60 per second) that later
//     requests wait out: with TPM 60,000 a 5,000-token call passes on a
//     full 1,000-token bucket, and the next call waits about 4 s. A request
//     above TPM itself can never pass: 429 "request too large" without
//     retry-after.
//   - A refused request gets 429 and is charged nothing; retry-after is the
//     time until both buckets would admit it, in whole seconds rounded up,
//     as both providers send it (OpenAI adds retry-after-ms).
//
// The headers keep the providers' per-minute view, which is not what
// enforces. Both providers report the per-minute limit and the remaining
// budget and reset of that limit: Anthropic
// anthropic-ratelimit-{requests,tokens,input-tokens,output-tokens}-{limit,remaining,reset}
// with RFC 3339 resets; OpenAI x-ratelimit-{limit,remaining,reset}-{requests,tokens}
// where reset is "the time until the rate limit resets to its initial
// state" as a duration ("1s", "6m0s"; OpenAI rate limits guide,
// https://platform.openai.com/docs/guides/rate-limits). So each (endpoint,
// key) also keeps a per-minute bucket per limit, charged, credited and
// refilled exactly like the enforcing one but holding the whole limit, and
// the headers report it: limit = RPM or TPM, remaining and reset of that
// bucket. Remaining may therefore say 118 while a third call in the same
// second gets 429 at 120 RPM. That is the real behaviour, and why a client
// that paces by remaining alone is not enough. Every answer to an
// authenticated request, 200 or not, carries the key's headers. Anthropic's
// input-tokens-* and output-tokens-* report the ITPM and OTPM buckets (the
// TPM bucket where a key has no such limit), tokens-* the most restrictive
// token bucket in effect.
// Remaining counts are exact, not rounded. An unlimited limit sends no
// headers. Request ids go in request-id (Anthropic) and x-request-id
// (OpenAI).
//
// # Streaming
//
// With "stream": true the answer is the one the same request gets without
// it (text, tool calls and their ids, stop reason, usage), sent as
// server-sent events, so a client that accumulates the stream holds the
// non-streamed answer (the message or completion id aside, which is random
// per call). What the mock imitates, and where it comes from:
//
//   - Anthropic: the event flow of "Streaming Messages"
//     (https://platform.claude.com/docs/en/build-with-claude/streaming):
//     message_start (the Message with empty content and usage
//     input_tokens, output_tokens 1, as the page's example has it);
//     content_block_start, ping (once, after the first block starts, as in
//     the example), content_block_delta (text_delta, or input_json_delta
//     pieces of a tool_use block that starts with input {}) and
//     content_block_stop per block; message_delta with stop_reason,
//     stop_sequence and usage.output_tokens, which the page gives as
//     cumulative (the whole answer's count, not an increment);
//     message_stop. See anthropic_stream.go.
//   - OpenAI and Azure: the chat.completion.chunk stream of the API
//     reference (https://platform.openai.com/docs/api-reference/chat-streaming,
//     and "Create chat completion", stream and stream_options): the role
//     chunk {"role":"assistant","content":""}, content chunks, per tool
//     call a chunk with index, id, type and function.name then
//     function.arguments pieces, a chunk with finish_reason, then with
//     stream_options.include_usage the chunk with "choices":[] and the
//     usage ("All other chunks will also include a usage field, but with a
//     null value"), then data: [DONE]. A stream_options without
//     "stream": true is 400 invalid_request_error, param stream_options,
//     "The 'stream_options' parameter is only allowed when 'stream' is
//     enabled." (OpenAI's answer, as quoted in BerriAI/litellm#5803). The
//     obfuscation field OpenAI adds to deltas is not sent. See
//     openai_stream.go.
//   - Headers first: the status (200), Content-Type text/event-stream, the
//     request id and the rate-limit headers go out with message_start or
//     the role chunk, flushed at admission, before the first token, as
//     the providers send them; the rate-limit figures are therefore the
//     buckets as admission left them, before any credit-back.
//   - Pace: the first content chunk comes Config.StreamFirstToken after
//     admission (the provider's time to first token; default the latency
//     in force), each next one Config.StreamChunkInterval later (default
//     20 ms), each carrying Config.StreamChunkTokens tokens of text or
//     tool input (default 1, 4 bytes, cut at a UTF-8 rune boundary); the
//     closing events follow the last chunk at once. Every frame is flushed
//     as it is written. SetStreamFirstToken, SetStreamChunkInterval,
//     SetStreamChunkTokens and POST /mock/latency change the pace at run
//     time.
//   - Mid-stream errors: FaultStreamError ends the stream after
//     Fault.AfterChunks content chunks with Anthropic's "event: error"
//     {"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}
//     (the streaming page's "Error events": "during periods of high usage,
//     you may receive an overloaded_error, which would normally correspond
//     to an HTTP 529 in a non-streaming context"), or OpenAI's
//     data: {"error":{"message":...,"type":"server_error","param":null,"code":null}}
//     line, which the OpenAI SDKs read as an error; no message_stop or
//     [DONE] follows. FaultStreamCut drops the connection there instead.
//   - Metering: admission charges a streamed call as any other. The
//     credit-back of Anthropic's settle happens when the stream ends:
//     max_tokens − output when it finished. A client that goes away
//     mid-stream (its request context ends: every wait watches it, and the
//     mock writes nothing more) is settled as a client that gives up
//     before a non-streamed answer, to what was produced: the part of
//     max_tokens not yet streamed goes back (all of it before the first
//     token). A stream broken by a fault settles the same way. On the
//     OpenAI and Azure endpoints the admission charge stands, as for
//     every call (unless Config.RefundOpenAI).
//   - Stats count a streamed call when its stream ends, and gauge it in
//     flight until its last byte is written.
//
// Bedrock's InvokeModelWithResponseStream streams the Messages events
// (but ping) at the same pace, each an AWS event-stream "chunk" message
// whose payload {"bytes": "<base64>"} holds the event's JSON; a
// FaultStreamError ends it with a modelStreamErrorException message
// (bedrock_stream.go).
//
// # Stats
//
// Stats (GET /mock/stats) counts answers per key fingerprint and per
// provider, and gauges the calls in flight: from admission by the buckets
// until the answer is written (a stream: until its last byte). in_flight is the number now and
// max_in_flight the most at once since the last reset, over all keys
// (top level), per key and per provider. Load tests read max_in_flight to
// check a global concurrency cap from the provider's side.
//
// # Faults
//
// SetFault (or POST /mock/faults) makes matching requests fail on purpose
// (see FaultMode); injected faults do not touch the buckets and are counted
// apart from bucket 429s in Stats. The stream modes (stream_error,
// stream_cut) are met by streamed requests only, after admission; a request
// that does not stream passes them by and leaves their Count alone.
//
// # Secrets
//
// Key values are hashed at the door: limits, stats, faults and logs know a
// key only by its Fingerprint.
package mockprovider
