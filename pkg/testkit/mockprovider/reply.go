package mockprovider

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"strconv"
	"strings"
	"unicode/utf8"
)

// ReplyPromptRunes is how many runes of the prompt Reply quotes.
const ReplyPromptRunes = 60

// CountTokens is the mock's token estimate of s: one token per 4 bytes,
// rounded up, and at least 1. Both formats count input and output with it.
func CountTokens(s string) int {
	return max(1, (len(s)+3)/4)
}

// Reply is the mock's deterministic text answer to prompt, the text of the
// last user message: "mock answer " + the first 12 hex digits of
// sha256(prompt) + ": " + prompt cut to ReplyPromptRunes runes. Before
// max_tokens and stop sequences are applied.
func Reply(prompt string) string {
	sum := sha256.Sum256([]byte(prompt))
	return "mock answer " + hex.EncodeToString(sum[:])[:12] + ": " + truncateRunes(prompt, ReplyPromptRunes)
}

// ToolResultsReply is the text answer to a user turn that carries tool
// results: "tool results: " + the results in order joined by "; ", an error
// result prefixed "error: ".
func ToolResultsReply(results []ToolResult) string {
	parts := make([]string, len(results))
	for i, r := range results {
		if r.IsError {
			parts[i] = "error: " + r.Content
		} else {
			parts[i] = r.Content
		}
	}
	return "tool results: " + strings.Join(parts, "; ")
}

// ToolResult is one tool result of the last user turn, as ToolResultsReply
// quotes it.
type ToolResult struct {
	Content string
	IsError bool
}

// ToolCallInput is the input (Anthropic) or arguments (OpenAI) of every
// mock tool call: {"query": <the last user text>}.
func ToolCallInput(lastUserText string) json.RawMessage {
	b, _ := json.Marshal(map[string]string{"query": lastUserText}) // a string map always marshals
	return b
}

func truncateRunes(s string, n int) string {
	i := 0
	for pos := range s {
		if i == n {
			return s[:pos]
		}
		i++
	}
	return s
}

// truncateBytes cuts s to at most n bytes without splitting a rune.
func truncateBytes(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// choiceMode says whether and how a tool must be called, in Anthropic's
// vocabulary (OpenAI's "required" is any, "function" is tool).
type choiceMode string

const (
	choiceAuto choiceMode = "auto"
	choiceAny  choiceMode = "any"
	choiceTool choiceMode = "tool"
	choiceNone choiceMode = "none"
)

// conversation is a parsed request in provider-neutral form: only what the
// mock's answer depends on.
type conversation struct {
	lastUserText string
	// toolResults of the last user turn; non-empty switches the answer to
	// ToolResultsReply.
	toolResults []ToolResult
	// priorCalls counts tool calls already in the history, so new call ids
	// continue the numbering and stay unique within the conversation.
	priorCalls int
	tools      []string // tool names, in request order
	choice     choiceMode
	choiceName string
	// singleCall: the caller disabled parallel tool use.
	singleCall bool
	maxTokens  int
	stops      []string
}

// stopKind says why the answer ended, in Anthropic's vocabulary.
type stopKind string

const (
	stopEndTurn      stopKind = "end_turn"
	stopMaxTokens    stopKind = "max_tokens"
	stopToolUse      stopKind = "tool_use"
	stopStopSequence stopKind = "stop_sequence"
)

// toolCall is one call the answer makes.
type toolCall struct {
	n     int // 1-based across the conversation; ids are "toolu_<n>" / "call_<n>"
	name  string
	input json.RawMessage
}

// answer is the mock's reply in provider-neutral form.
type answer struct {
	text         string
	calls        []toolCall
	stop         stopKind
	stopSequence string
	outputTokens int
}

// answerTo computes the deterministic answer to c.
//
// With tools offered (and tool_choice not none) and no tool results in the
// last user turn, it calls tools: the one tool_choice names; else every tool
// whose name occurs in the last user text (only the first when parallel use
// is off); else the first tool. Output tokens of calls are CountTokens over
// their names and inputs. Otherwise it answers text (Reply, or
// ToolResultsReply), cut at the earliest stop sequence or at max_tokens*4
// bytes, whichever comes first.
func answerTo(c *conversation) answer {
	if len(c.toolResults) == 0 && len(c.tools) > 0 && c.choice != choiceNone {
		if names := c.callNames(); len(names) > 0 {
			a := answer{stop: stopToolUse}
			input := ToolCallInput(c.lastUserText)
			var out strings.Builder
			for i, name := range names {
				a.calls = append(a.calls, toolCall{n: c.priorCalls + i + 1, name: name, input: input})
				out.WriteString(name)
				out.Write(input)
			}
			a.outputTokens = CountTokens(out.String())
			return a
		}
	}

	text := Reply(c.lastUserText)
	if len(c.toolResults) > 0 {
		text = ToolResultsReply(c.toolResults)
	}
	a := answer{text: text, stop: stopEndTurn}
	limit := c.maxTokens * 4
	at, seq := -1, ""
	for _, s := range c.stops {
		if i := strings.Index(text, s); s != "" && i >= 0 && (at < 0 || i < at) {
			at, seq = i, s
		}
	}
	switch {
	case at >= 0 && at <= limit:
		a.text, a.stop, a.stopSequence = text[:at], stopStopSequence, seq
	case len(text) > limit:
		a.text, a.stop = truncateBytes(text, limit), stopMaxTokens
	}
	a.outputTokens = CountTokens(a.text)
	return a
}

// callNames picks the tools to call (see answerTo).
func (c *conversation) callNames() []string {
	if c.choice == choiceTool {
		for _, t := range c.tools {
			if t == c.choiceName {
				return []string{t}
			}
		}
		return nil // validated by the parser; unreachable
	}
	var names []string
	for _, t := range c.tools {
		if strings.Contains(c.lastUserText, t) {
			names = append(names, t)
			if c.singleCall {
				break
			}
		}
	}
	if len(names) == 0 {
		names = c.tools[:1]
	}
	return names
}

// callID formats a tool call id with the provider's prefix.
func callID(prefix string, n int) string { return prefix + strconv.Itoa(n) }
