// Package provider holds what Bulwark's provider adapters share: the one
// HTTP round trip every adapter makes (Post, read by Do) and its streaming
// sibling (DoStream), the parsing of Retry-After and rate-limit response
// headers, the fallback classification of an HTTP status, the redaction of
// anything key- or address-shaped from provider messages and errors
// (Redact, for what operators read), and Server-Sent Events: the framing
// the compat endpoints write (WriteEvent) and the reader of the providers'
// streams (EventReader).
//
// Each provider lives in its own sub-package (anthropic, openai), which owns
// that provider's wire format, its error-code table and its rate-limit
// headers. Nothing here knows a wire format.
//
// Adapters never retry: retrying, key choice and fallback belong to the
// worker, which branches on the llm.Class the adapters return.
package provider
