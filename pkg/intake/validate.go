package intake

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"bulwark/pkg/job"
	"bulwark/pkg/llm"
	"bulwark/pkg/priority"
)

// InputError is bad input: Status is the HTTP status to answer (400, 404,
// 413, 422) and Field names what is wrong. Cause, when set, is a typed
// error with the details (OutputLimitError).
type InputError struct {
	Status  int
	Code    string
	Field   string
	Message string
	Cause   error
}

// Unwrap returns Cause.
func (e *InputError) Unwrap() error { return e.Cause }

// OutputLimitError is the cause of the InputError of a request whose
// max_tokens is above its route's limit (Config.OutputLimit): the compat
// endpoints answer it in the words of the provider they speak for.
type OutputLimitError struct {
	Route llm.Route
	// Asked is the request's max_tokens, Limit the route's.
	Asked, Limit int
}

func (e *OutputLimitError) Error() string {
	return fmt.Sprintf("max_tokens: %d is above %d, the most %s gives", e.Asked, e.Limit, e.Route)
}

func (e *InputError) Error() string {
	if e.Field == "" {
		return e.Message
	}
	return e.Field + ": " + e.Message
}

// ErrInput matches every *InputError.
var ErrInput = errors.New("intake: invalid input")

func (e *InputError) Is(t error) bool { return t == ErrInput }

func invalid(field, format string, args ...any) *InputError {
	return &InputError{Status: http.StatusUnprocessableEntity, Code: "invalid_request", Field: field, Message: fmt.Sprintf(format, args...)}
}

// build validates a submission and turns it into a job.
// nul refuses a NUL byte: PostgreSQL text cannot hold one, so the history
// row and the cache entry of such a request would fail to be written.
func nul(field string) *InputError {
	return invalid(field, "must not contain a NUL character (\\u0000)")
}

// hasNUL reports whether v holds a NUL character in any string, key or raw
// JSON value (a tool's name as much as a prompt). Its JSON has a NUL
// escaped as \u0000; only then is it decoded, to tell a NUL from a text
// that spells the escape out.
func hasNUL(v any) bool {
	js, err := json.Marshal(v)
	if err != nil {
		return true
	}
	if !bytes.Contains(js, []byte(`\u0000`)) {
		return false
	}
	var doc any
	if err := json.Unmarshal(js, &doc); err != nil {
		return true
	}
	return nulIn(doc)
}

// nulField names the part of req that holds a NUL (hasNUL(req) is true).
func nulField(req llm.Request) string {
	if strings.ContainsRune(req.System, 0) {
		return "system"
	}
	for i, m := range req.Messages {
		for k, b := range m.Content {
			if hasNUL(b) {
				return fmt.Sprintf("messages[%d].content[%d]", i, k)
			}
		}
	}
	for i, tool := range req.Tools {
		if hasNUL(tool) {
			return fmt.Sprintf("tools[%d]", i)
		}
	}
	return "request" // stop sequences, tool choice
}

func nulIn(v any) bool {
	switch x := v.(type) {
	case string:
		return strings.ContainsRune(x, 0)
	case []any:
		return slices.ContainsFunc(x, nulIn)
	case map[string]any:
		for k, e := range x {
			if strings.ContainsRune(k, 0) || nulIn(e) {
				return true
			}
		}
	}
	return false
}

func (in *Intake) build(t Tenant, s Submission) (*job.Job, error) {
	req, err := in.check(s)
	if err != nil {
		return nil, err
	}
	if err := checkLabels(s); err != nil {
		return nil, err
	}
	p, err := resolvePriority(t, s.Priority)
	if err != nil {
		return nil, err
	}
	layer := s.Layer
	if layer == "" {
		layer = t.DefaultLayer
	}
	if layer == "" {
		layer = in.cfg.DefaultLayer
	}
	if len(in.cfg.Layers) > 0 && !in.cfg.Layers[layer] {
		return nil, invalid("cache_layer", "unknown cache layer %q", layer)
	}
	now := time.Now()
	j := &job.Job{
		ID: job.NewID(now), Tenant: t.Name, Priority: p, Route: s.Route, Request: req, CaseID: s.CaseID, Layer: layer,
		ToolResultsHash: s.ToolResultsHash, Metadata: s.Metadata,
		CacheRead: !s.NoCacheRead, CacheWrite: !s.NoCacheWrite, NoCompress: s.NoCompress, Stream: s.Stream,
		IdempotencyKey: s.IdempotencyKey,
		CreatedAt:      now, Deadline: now.Add(in.cfg.MaxWait),
	}
	if s.answeredInResponse() {
		j.KeepEnded = job.EndedEventsTTL
	}
	if j.ToolResultsHash == "" {
		j.ToolResultsHash = ToolResultsHash(req)
	}
	if in.cache != nil && in.cfg.CacheEnabled {
		j.CacheKey = in.cache.Ref(j)
	}
	if s.answeredInResponse() {
		j.JoinKey = joinKey(j) // a compat call without a key: join.go
	}
	return j, nil
}

// check validates what s asks of a provider and returns its request with
// max_tokens settled: the default when it gives none, within its route's
// limit.
func (in *Intake) check(s Submission) (llm.Request, error) {
	if !in.cfg.Routes[s.Route] {
		return llm.Request{}, &InputError{Status: http.StatusNotFound, Code: "unknown_model", Field: "model_tier",
			Message: fmt.Sprintf("no such provider/tier %q", s.Route.String())}
	}
	req := s.Request
	if len(req.Messages) == 0 {
		return llm.Request{}, invalid("messages", "at least one message is required")
	}
	chars := len(req.System)
	if hasNUL(req) { // one encoding of the request; nulField names where
		return llm.Request{}, nul(nulField(req))
	}
	for i, m := range req.Messages {
		if m.Role != llm.RoleUser && m.Role != llm.RoleAssistant {
			return llm.Request{}, invalid(fmt.Sprintf("messages[%d].role", i), "must be user or assistant, not %q", m.Role)
		}
		if len(m.Content) == 0 {
			return llm.Request{}, invalid(fmt.Sprintf("messages[%d].content", i), "must not be empty")
		}
		for k, b := range m.Content {
			chars += len(b.Text) + len(b.Input)
			switch b.Type {
			case llm.BlockText, llm.BlockToolUse, llm.BlockToolResult:
			default:
				return llm.Request{}, invalid(fmt.Sprintf("messages[%d].content[%d].type", i, k), "must be text, tool_use or tool_result, not %q", b.Type)
			}
		}
	}
	if err := checkToolUse(req); err != nil {
		return llm.Request{}, err
	}
	// Everything else the request carries to the provider, and into its
	// stored record, counts too: tool definitions can be as large as a
	// prompt.
	for _, tool := range req.Tools {
		chars += len(tool.Name) + len(tool.Description) + len(tool.InputSchema)
	}
	for _, stop := range req.StopSequences {
		chars += len(stop)
	}
	if req.Messages[len(req.Messages)-1].Role != llm.RoleUser {
		return llm.Request{}, invalid("messages", "the last message must come from the user")
	}
	if chars > in.cfg.MaxPromptChars {
		return llm.Request{}, &InputError{Status: http.StatusRequestEntityTooLarge, Code: "prompt_too_long", Field: "messages",
			Message: fmt.Sprintf("prompt is %d characters (system, messages, tools and stop sequences), the limit is %d", chars, in.cfg.MaxPromptChars)}
	}
	if err := in.settleMaxTokens(&req, s); err != nil {
		return llm.Request{}, err
	}
	if req.Temperature != nil && (*req.Temperature < 0 || *req.Temperature > 2) {
		return llm.Request{}, invalid("temperature", "must be between 0 and 2")
	}
	return req, nil
}

// settleMaxTokens gives req, of submission s, its default max_tokens
// when it has none, and refuses one outside its route's limit.
func (in *Intake) settleMaxTokens(req *llm.Request, s Submission) error {
	limit := in.cfg.OutputLimit(s.Route)
	switch {
	case req.MaxTokens == 0 && s.ModelMaxTokens:
		// The model's limit, as OpenAI gives a call without max_tokens;
		// metered at the default (llm.Request.MaxTokensDefault): reserving
		// 16k tokens of a key's TPM for each such call would cut its
		// calls a minute tenfold.
		req.MaxTokens, req.MaxTokensDefault = min(in.cfg.DefaultMaxTokens, limit), true
	case req.MaxTokens == 0:
		req.MaxTokens = min(in.cfg.DefaultMaxTokens, limit)
	case req.MaxTokens < 0:
		return invalid("max_tokens", "must be between 1 and %d, got %d", limit, req.MaxTokens)
	case req.MaxTokens > limit:
		e := invalid("max_tokens", "must be between 1 and %d (the most %s gives), got %d", limit, s.Route, req.MaxTokens)
		e.Cause = &OutputLimitError{Route: s.Route, Asked: req.MaxTokens, Limit: limit}
		return e
	}
	return nil
}

// InputTokens validates s as Submit does, without submitting it, and
// returns the estimate of its input tokens that the key pool meters
// (llm.EstimateRequest: about four bytes a token): POST
// /v1/messages/count_tokens. Bad input is the *InputError Submit returns.
func (in *Intake) InputTokens(s Submission) (int, error) {
	req, err := in.check(s)
	if err != nil {
		return 0, err
	}
	return llm.EstimateRequest(&req).Input, nil
}

// resolvePriority applies the tenant's default and ceiling: a tenant may
// not ask for more urgency than it is allowed; asking for more is lowered
// to its ceiling rather than refused, so a client with a hard-coded
// priority keeps working.
func resolvePriority(t Tenant, asked priority.Priority) (priority.Priority, error) {
	p := asked
	if p == 0 {
		p = t.DefaultPriority
	}
	if p == 0 {
		p = priority.Normal
	}
	if !p.Valid() {
		return 0, invalid("priority", "must be critical, high, normal, low or 1-4")
	}
	if t.MaxPriority.Valid() && p < t.MaxPriority {
		p = t.MaxPriority
	}
	return p, nil
}

// ToolResultsHash hashes the tool results a conversation carries, so that
// the same question after different tool output is a different cache entry.
func ToolResultsHash(req llm.Request) string {
	h := sha256.New()
	n := 0
	for _, m := range req.Messages {
		for _, b := range m.Content {
			if b.Type == llm.BlockToolResult {
				rec, _ := json.Marshal([]any{b.ToolUseID, b.Text, b.IsError})
				h.Write(rec)
				n++
			}
		}
	}
	if n == 0 {
		return ""
	}
	return hex.EncodeToString(h.Sum(nil))[:16]
}

// Limits of what a caller attaches to a request besides the prompt (the
// headers and metadata kept with its record for its whole life): counted,
// so that no tenant can grow Redis through them.
const (
	maxIdempotencyKey = 255 // as the providers' own idempotency keys
	maxLabel          = 128 // case id, tool-results hash, cache layer
	maxMetadata       = 16
	maxMetadataKey    = 64
	maxMetadataValue  = 512
)

// checkLabels refuses oversized or unprintable idempotency keys, case ids,
// tool-results hashes, layers and metadata.
func checkLabels(s Submission) error {
	for _, l := range []struct {
		field, v string
		max      int
	}{
		{"Idempotency-Key", s.IdempotencyKey, maxIdempotencyKey},
		{"case_id", s.CaseID, maxLabel},
		{"tool_results_hash", s.ToolResultsHash, maxLabel},
		{"cache_layer", s.Layer, maxLabel},
	} {
		if err := checkText(l.field, l.v, l.max); err != nil {
			return err
		}
	}
	if len(s.Metadata) > maxMetadata {
		return invalid("metadata", "at most %d entries, got %d", maxMetadata, len(s.Metadata))
	}
	for k, v := range s.Metadata {
		if k == "" {
			return invalid("metadata", "keys must not be empty")
		}
		if err := checkText("metadata key "+strconv.Quote(truncate(k, 32)), k, maxMetadataKey); err != nil {
			return err
		}
		if err := checkText("metadata."+truncate(k, 32), v, maxMetadataValue); err != nil {
			return err
		}
	}
	return nil
}

// checkText refuses v longer than max bytes or holding a control
// character (a NUL would also fail PostgreSQL).
func checkText(field, v string, max int) error {
	if len(v) > max {
		return invalid(field, "at most %d bytes, got %d", max, len(v))
	}
	if !utf8.ValidString(v) || strings.ContainsFunc(v, unicode.IsControl) {
		return invalid(field, "must be printable UTF-8 without control characters")
	}
	return nil
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// checkToolUse refuses the tool shapes that both providers refuse, so that
// they fail here with a 422 naming the field rather than later, after a
// wait in the queue, as a provider error (found by the fuzz run: the
// compat decoders refused them, the async API did not).
func checkToolUse(req llm.Request) error {
	for i, m := range req.Messages {
		for k, b := range m.Content {
			field := fmt.Sprintf("messages[%d].content[%d]", i, k)
			switch b.Type {
			case llm.BlockToolUse:
				if m.Role != llm.RoleAssistant {
					return invalid(field, "a tool_use block belongs to an assistant message")
				}
				if b.ToolUseID == "" || b.ToolName == "" {
					return invalid(field, "a tool_use block needs tool_use_id and tool_name")
				}
				if len(b.Input) > 0 && !isObject(b.Input) { // none: an empty input
					return invalid(field+".input", "must be a JSON object")
				}
			case llm.BlockToolResult:
				if m.Role != llm.RoleUser {
					return invalid(field, "a tool_result block belongs to a user message")
				}
				if b.ToolUseID == "" {
					return invalid(field, "a tool_result block needs the tool_use_id it answers")
				}
			}
		}
	}
	for i, t := range req.Tools {
		if t.Name == "" {
			return invalid(fmt.Sprintf("tools[%d].name", i), "is required")
		}
		if len(t.InputSchema) > 0 && !isObject(t.InputSchema) {
			return invalid(fmt.Sprintf("tools[%d].input_schema", i), "must be a JSON Schema object")
		}
	}
	if tc := req.ToolChoice; tc != nil {
		switch tc.Mode {
		case "", llm.ToolChoiceAuto, llm.ToolChoiceAny, llm.ToolChoiceNone:
		case llm.ToolChoiceTool:
			if tc.Name == "" {
				return invalid("tool_choice.name", "is required with mode tool")
			}
		default:
			return invalid("tool_choice.mode", "must be auto, any, tool or none, not %q", tc.Mode)
		}
	}
	return nil
}

// isObject reports whether raw is a JSON object.
func isObject(raw json.RawMessage) bool {
	var m map[string]json.RawMessage
	return json.Unmarshal(raw, &m) == nil && m != nil
}
