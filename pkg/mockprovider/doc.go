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
//	GET    /mock/stats           Stats as JSON
//	POST   /mock/reset           zero the counters, refill every bucket
//	GET    /mock/faults          faults in force
//	POST   /mock/faults          add a Fault: {"provider","key_fingerprint","mode","count","retry_after":"2s"}
//	DELETE /mock/faults          remove every fault
//	POST   /mock/latency         {"latency":"200ms","jitter":"50ms"} (either field)
//
// Any non-empty key is accepted; a missing one gets 401 in the provider's
// error shape. The /mock endpoints are unauthenticated: bind the mock to
// loopback. Streaming is not supported (stream=true gets 400).
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
// Each (endpoint, key) has an RPM bucket and a TPM bucket (Limits), full at
// start and refilled continuously at capacity/60 per second. Admission
// charges 1 request and input_tokens + max_tokens tokens (OpenAI without
// max_tokens: OpenAIMaxTokensDefault); after the answer, max_tokens minus
// the output tokens is credited back. When either bucket lacks room the
// answer is 429 and nothing is charged; retry-after is the time until both
// would have room, in whole seconds rounded up (OpenAI adds
// retry-after-ms). A request whose token cost exceeds TPM itself can never
// pass: it gets 429 "request too large" without retry-after.
//
// Every answer to an authenticated request, 200 or not, carries the key's
// headers: Anthropic anthropic-ratelimit-{requests,tokens,input-tokens,
// output-tokens}-{limit,remaining,reset} (resets RFC 3339; the single token
// bucket is reported under all three token names), OpenAI
// x-ratelimit-{limit,remaining,reset}-{requests,tokens} (resets as
// durations such as "1s", "6m0s", "120ms"). Remaining counts are exact, not
// rounded. An unlimited bucket sends no headers. Request ids go in
// request-id (Anthropic) and x-request-id (OpenAI).
//
// # Faults
//
// SetFault (or POST /mock/faults) makes matching requests fail on purpose
// (see FaultMode); injected faults do not touch the buckets and are counted
// apart from bucket 429s in Stats.
//
// # Secrets
//
// Key values are hashed at the door: limits, stats, faults and logs know a
// key only by its Fingerprint.
package mockprovider
