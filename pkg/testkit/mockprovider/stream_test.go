package mockprovider

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/google/go-cmp/cmp"
)

// streamPrompt makes a multi-chunk answer with runes of 2, 3 and 4 bytes.
const streamPrompt = "Why did the OTA update fail on car 17? ünïcødé ✓ 🚗"

func claudeToolResults() map[string]any {
	return map[string]any{
		"model": "claude-test", "max_tokens": 200,
		"tools": claudeTools("", "search_kb")["tools"],
		"messages": []any{
			map[string]any{"role": "user", "content": "look up E42"},
			map[string]any{"role": "assistant", "content": []any{
				map[string]any{"type": "tool_use", "id": "toolu_1", "name": "search_kb", "input": map[string]any{"query": "E42"}}}},
			map[string]any{"role": "user", "content": []any{
				map[string]any{"type": "tool_result", "tool_use_id": "toolu_1", "content": "E42 means battery low"}}},
		},
	}
}

func chatToolResults() map[string]any {
	body := chatTools("", "search_kb")
	body["messages"] = []any{
		map[string]any{"role": "user", "content": "look up E42"},
		map[string]any{"role": "assistant", "content": nil, "tool_calls": []any{
			map[string]any{"id": "call_1", "type": "function", "function": map[string]any{"name": "search_kb", "arguments": `{"query":"E42"}`}}}},
		map[string]any{"role": "tool", "tool_call_id": "call_1", "content": "E42 means battery low"},
	}
	return body
}

func TestStreamClaudeMatchesAnswer(t *testing.T) {
	t.Parallel()
	// Chunks back to back: this test is about content, TestStreamPace
	// about time.
	b := setup(t, Config{DefaultLimits: Limits{RPM: 6000, TPM: 1000000}, StreamChunkInterval: -1})
	tests := []struct {
		name  string
		body  func() map[string]any
		multi bool // the answer takes more than one content chunk
	}{
		{"text", func() map[string]any { return claudeText(streamPrompt, 200) }, true},
		{"max_tokens", func() map[string]any { return claudeText(streamPrompt, 3) }, true},
		{"stop sequence", func() map[string]any { return with(claudeText(streamPrompt, 200), "stop_sequences", []string{"OTA"}) }, true},
		{"empty text", func() map[string]any { return with(claudeText(streamPrompt, 200), "stop_sequences", []string{"mock"}) }, false},
		{"tool calls", func() map[string]any { return claudeTools("run fetch_logs and search_kb", "fetch_logs", "search_kb") }, true},
		{"tool results", claudeToolResults, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			want := decodeClaudeAnswer(t, b.claude(t, "k", tt.body()))
			s := b.claudeStream(t, context.Background(), "k", tt.body())
			if s.resp.Header.Get("request-id") == "" || s.resp.Header.Get("anthropic-ratelimit-requests-remaining") == "" {
				t.Errorf("stream lacks the request id or rate-limit headers: %v", s.resp.Header)
			}
			msgs := s.all(t)
			if st := b.srv.Stats(); st.InFlight != 0 {
				t.Errorf("in flight after the last byte: %d", st.InFlight)
			}
			if diff := cmp.Diff(want, accumulateClaude(t, msgs)); diff != "" {
				t.Errorf("streamed answer (-non-streamed +streamed):\n%s", diff)
			}

			var start claudeEvent
			if err := json.Unmarshal([]byte(msgs[0].data), &start); err != nil {
				t.Fatal(err)
			}
			var usage map[string]int
			if err := json.Unmarshal(start.Message, &struct {
				Usage *map[string]int `json:"usage"`
			}{&usage}); err != nil || usage["input_tokens"] != want.Usage.InputTokens || usage["output_tokens"] != 1 {
				t.Errorf("message_start usage = %v (%v), want input_tokens %d and output_tokens 1", usage, err, want.Usage.InputTokens)
			}
			if msgs[1].event != "content_block_start" || msgs[2].event != "ping" {
				t.Errorf("events 1 and 2 = %s, %s; want content_block_start, ping", msgs[1].event, msgs[2].event)
			}
			deltas := 0
			for _, m := range msgs {
				if m.event != "content_block_delta" {
					continue
				}
				deltas++
				var e claudeEvent
				if err := json.Unmarshal([]byte(m.data), &e); err != nil {
					t.Fatal(err)
				}
				if piece := e.Delta.Text + e.Delta.PartialJSON; len(piece) > 4 || !utf8.ValidString(piece) {
					t.Errorf("delta %q: want at most 4 bytes of whole runes (1 token)", piece)
				}
			}
			if tt.multi != (deltas > 1) {
				t.Errorf("%d content chunks; want more than one: %v", deltas, tt.multi)
			}
		})
	}
}

func TestStreamChatMatchesAnswer(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{DefaultLimits: Limits{RPM: 6000, TPM: 1000000}, StreamChunkInterval: -1})
	tests := []struct {
		name  string
		azure bool
		body  func() map[string]any
		tools bool
	}{
		{"text", false, func() map[string]any { return chatText(streamPrompt, 200) }, false},
		{"length", false, func() map[string]any { return chatText(streamPrompt, 3) }, false},
		{"stop", false, func() map[string]any { return with(chatText(streamPrompt, 200), "stop", "OTA") }, false},
		{"tool calls", false, func() map[string]any { return chatTools("run fetch_logs and search_kb", "fetch_logs", "search_kb") }, true},
		{"tool results", false, chatToolResults, false},
		{"azure", true, func() map[string]any {
			body := chatText(streamPrompt, 200)
			delete(body, "model") // the deployment names it
			return body
		}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var want chatAnswer
			var s *sseStream
			body := with(tt.body(), "stream_options", map[string]any{"include_usage": true})
			if tt.azure {
				want = decodeChatAnswer(t, b.azure(t, "gpt-deploy", "k", tt.body()))
				s = b.stream(t, context.Background(), azurePath("gpt-deploy"), map[string]string{"api-key": "k"}, with(body, "stream", true))
			} else {
				want = decodeChatAnswer(t, b.chat(t, "k", tt.body()))
				s = b.chatStream(t, context.Background(), "k", body)
			}
			if s.resp.Header.Get("x-ratelimit-remaining-requests") == "" {
				t.Errorf("stream lacks the rate-limit headers: %v", s.resp.Header)
			}
			msgs := s.all(t)
			if n := contentChunks(msgs); n < 2 {
				t.Errorf("%d content chunks, want more than one", n)
			}
			chunks := chatChunks(t, msgs)
			if diff := cmp.Diff(want, accumulateChat(t, chunks)); diff != "" {
				t.Errorf("streamed answer (-non-streamed +streamed):\n%s", diff)
			}

			wantContent := `""`
			if tt.tools {
				wantContent = "null"
			}
			if got := string(chunks[0].Choices[0].Delta.Content); got != wantContent {
				t.Errorf("role chunk content = %s, want %s", got, wantContent)
			}
			last := chunks[len(chunks)-1]
			if last.Choices == nil || len(last.Choices) != 0 || len(last.Usage) < 3 || string(last.Usage) == "null" {
				t.Errorf("last chunk: choices %v usage %s, want [] and the usage", last.Choices, last.Usage)
			}
			for _, c := range chunks[:len(chunks)-1] {
				if string(c.Usage) != "null" {
					t.Errorf("chunk usage = %q, want null with include_usage", c.Usage)
				}
			}
		})
	}
}

func TestStreamChatWithoutUsage(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{StreamChunkInterval: -1})
	msgs := b.chatStream(t, context.Background(), "k", chatText("x", 50)).all(t)
	for _, m := range msgs[:len(msgs)-1] {
		var raw map[string]json.RawMessage
		if err := json.Unmarshal([]byte(m.data), &raw); err != nil {
			t.Fatal(err)
		}
		if _, ok := raw["usage"]; ok {
			t.Errorf("chunk carries usage without include_usage: %s", m.data)
		}
		if string(raw["choices"]) == "[]" {
			t.Errorf("usage chunk without include_usage: %s", m.data)
		}
	}
	if a := accumulateChat(t, chatChunks(t, msgs)); deref(a.Content) != Reply("x") || a.FinishReason != "stop" {
		t.Errorf("answer = %+v", a)
	}
}

func TestStreamOptionsWithoutStream(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	r := b.chat(t, "k", with(chatText("x", 5), "stream_options", map[string]any{"include_usage": true}))
	wantStatus(t, r, http.StatusBadRequest)
	var e openAIErrorBody
	r.decode(t, &e)
	if e.Error.Type != "invalid_request_error" || deref(e.Error.Param) != "stream_options" || !strings.Contains(e.Error.Message, "'stream' is enabled") {
		t.Errorf("body = %s", r.body)
	}
	wantStatus(t, b.chat(t, "k", with(chatText("x", 5), "stream_options", nil)), http.StatusOK)
	r = b.azure(t, "d", "k", with(chatText("x", 5), "stream_options", map[string]any{"include_usage": true}))
	wantStatus(t, r, http.StatusBadRequest)
}

// isContent reports whether m is a content chunk: an Anthropic
// content_block_delta, or an OpenAI chunk whose delta carries content (not
// the role chunk's) or a tool call.
func isContent(m sseMsg) bool {
	return m.event == "content_block_delta" ||
		(m.event == "" && (strings.Contains(m.data, `"delta":{"content"`) || strings.Contains(m.data, `"tool_calls"`)))
}

// contentChunks counts the content chunks among a stream's events.
func contentChunks(msgs []sseMsg) int {
	n := 0
	for _, m := range msgs {
		if isContent(m) {
			n++
		}
	}
	return n
}

func TestStreamPace(t *testing.T) {
	t.Parallel()
	const first, interval = 100 * time.Millisecond, 10 * time.Millisecond
	b := setup(t, Config{StreamFirstToken: first, StreamChunkInterval: interval})
	for name, open := range map[string]func() *sseStream{
		"claude": func() *sseStream { return b.claudeStream(t, context.Background(), "k", claudeText("pace", 200)) },
		"chat":   func() *sseStream { return b.chatStream(t, context.Background(), "k", chatText("pace", 200)) },
	} {
		t.Run(name, func(t *testing.T) {
			s := open()
			msgs := s.all(t)
			k := 0
			for _, m := range msgs {
				if !isContent(m) {
					continue
				}
				// Chunk k is due first + k×interval after admission, which
				// follows the request; only lower bounds hold reliably.
				if at, due := m.at.Sub(s.sent), first+time.Duration(k)*interval; at < due {
					t.Errorf("content chunk %d arrived %s after the request, want >= %s", k, at, due)
				}
				k++
			}
			if k < 3 {
				t.Errorf("%d content chunks, want several", k)
			}
		})
	}
}

func TestStreamHeadersBeforeFirstToken(t *testing.T) {
	t.Parallel()
	// The first token never comes: the headers and the head are all a
	// client can have received, and then it goes away.
	tests := []struct {
		name       string
		cfg        Config
		open       func(b *bundle, ctx context.Context) *sseStream
		headEvent  string // event name, or a string the head's data holds
		answer     func(b *bundle) reply
		wantTokens func(out int) int // tokens remaining after the second call
	}{
		{"claude", Config{StreamFirstToken: time.Hour},
			func(b *bundle, ctx context.Context) *sseStream {
				return b.claudeStream(t, ctx, "k", claudeText("x", 1000))
			},
			"message_start",
			func(b *bundle) reply { return b.claude(t, "k", claudeText("x", 1000)) },
			// Nothing was produced: all of max_tokens came back.
			func(out int) int { return 600000 - 1 - (1 + out) }},
		{"chat, first token follows the latency", Config{Latency: time.Hour},
			func(b *bundle, ctx context.Context) *sseStream { return b.chatStream(t, ctx, "k", chatText("x", 1000)) },
			`"role":"assistant"`,
			func(b *bundle) reply {
				b.srv.SetLatency(0)
				return b.chat(t, "k", chatText("x", 50))
			},
			// OpenAI's admission charge stands.
			func(int) int { return 600000 - (1 + 1000) - (1 + 50) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			tt.cfg.DefaultLimits = Limits{RPM: 600, TPM: 600000}
			b := setup(t, tt.cfg)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			s := tt.open(b, ctx) // returns with the headers
			if s.resp.Header.Get("anthropic-ratelimit-tokens-remaining")+s.resp.Header.Get("x-ratelimit-remaining-tokens") == "" {
				t.Errorf("headers lack the rate-limit headers: %v", s.resp.Header)
			}
			m, err := s.next()
			if err != nil || (m.event != tt.headEvent && !strings.Contains(m.data, tt.headEvent)) {
				t.Fatalf("first event = %+v (%v), want %s", m, err, tt.headEvent)
			}
			fp := Fingerprint("k")
			if st := b.srv.Stats(); st.InFlight != 1 || st.Keys[fp].Requests != 0 {
				t.Errorf("while streaming: in flight %d, requests %d; want 1 and 0 (counted when the stream ends)", st.InFlight, st.Keys[fp].Requests)
			}
			cancel()
			waitFor(t, "the abandoned stream to end", func() bool {
				st := b.srv.Stats()
				return st.InFlight == 0 && st.Keys[fp].Requests == 1
			})
			r := tt.answer(b)
			wantStatus(t, r, http.StatusOK)
			out := CountTokens(Reply("x"))
			got := r.header.Get("anthropic-ratelimit-tokens-remaining") + r.header.Get("x-ratelimit-remaining-tokens")
			if want := tt.wantTokens(out); got != strconv.Itoa(want) {
				t.Errorf("tokens remaining = %s, want %d", got, want)
			}
			if st := b.srv.Stats().Keys[fp]; st.OK != 1 || st.Requests != 2 {
				t.Errorf("stats = %+v; want the abandoned stream counted as a request only", st)
			}
		})
	}
}

func TestStreamClientLeavesMidStream(t *testing.T) {
	t.Parallel()
	// The first chunk comes at once, the second an hour later.
	b := setup(t, Config{DefaultLimits: Limits{RPM: 600, TPM: 600000}, StreamFirstToken: -1, StreamChunkInterval: time.Hour})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s := b.claudeStream(t, ctx, "k", claudeText("x", 1000))
	for {
		m, err := s.next()
		if err != nil {
			t.Fatal(err)
		}
		if m.event == "content_block_delta" {
			break
		}
	}
	cancel()
	fp := Fingerprint("k")
	waitFor(t, "the abandoned stream to end", func() bool {
		st := b.srv.Stats()
		return st.InFlight == 0 && st.Keys[fp].Requests == 1
	})
	r := b.claude(t, "k", claudeText("x", 1000))
	wantStatus(t, r, http.StatusOK)
	// The stream produced one token (4 bytes) of output before the client
	// left: 1000 - 1 came back.
	want := 600000 - (1 + 1) - (1 + CountTokens(Reply("x")))
	if got := r.headerInt(t, "anthropic-ratelimit-tokens-remaining"); got != want {
		t.Errorf("tokens remaining = %d, want %d", got, want)
	}
}

func TestStreamSettles(t *testing.T) {
	t.Parallel()
	// A finished stream settles as the non-streamed answer does: Anthropic
	// gives the unused max_tokens back, OpenAI keeps them.
	out := CountTokens(Reply("x"))
	tests := []struct {
		name  string
		twice func(b *bundle) reply
		want  int
	}{
		{"claude", func(b *bundle) reply {
			b.claudeStream(t, context.Background(), "k", claudeText("x", 1000)).all(t)
			return b.claude(t, "k", claudeText("x", 1000))
		}, 600000 - 2*(1+out)},
		{"chat", func(b *bundle) reply {
			b.chatStream(t, context.Background(), "k", chatText("x", 1000)).all(t)
			return b.chat(t, "k", chatText("x", 1000))
		}, 600000 - 2*(1+1000)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, Config{DefaultLimits: Limits{RPM: 600, TPM: 600000}, StreamChunkInterval: -1})
			r := tt.twice(b)
			got := r.header.Get("anthropic-ratelimit-tokens-remaining") + r.header.Get("x-ratelimit-remaining-tokens")
			if got != strconv.Itoa(tt.want) {
				t.Errorf("tokens remaining = %s, want %d", got, tt.want)
			}
			st := b.srv.Stats().Keys[Fingerprint("k")]
			if st.OK != 2 || st.Requests != 2 || st.InputTokens != 2 || st.OutputTokens != int64(2*out) {
				t.Errorf("stats = %+v; want two answers", st)
			}
		})
	}
}

func TestStreamFaults(t *testing.T) {
	t.Parallel()
	const (
		claudeOverloaded = `{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}`
		openAIServer     = `{"error":{"message":"The server had an error while processing your request. Sorry about that!","type":"server_error","param":null,"code":null}}`
	)
	chunks := len(pieces(Reply("fault"), 4))
	tests := []struct {
		name      string
		format    string // claude, chat, azure
		fault     Fault
		wantCount int    // content chunks before the break
		wantError string // the error event's data; "" for a dropped connection
	}{
		{"claude error after 2", "claude", Fault{Mode: FaultStreamError, AfterChunks: 2}, 2, claudeOverloaded},
		{"claude error default", "claude", Fault{Mode: FaultStreamError}, 1, claudeOverloaded},
		{"claude error at first token", "claude", Fault{Mode: FaultStreamError, AfterChunks: -1}, 0, claudeOverloaded},
		{"claude error after the last chunk", "claude", Fault{Mode: FaultStreamError, AfterChunks: 1000}, chunks, claudeOverloaded},
		{"claude error message", "claude", Fault{Mode: FaultStreamError, Message: "upstream org-x1"},
			1, `{"type":"error","error":{"type":"overloaded_error","message":"upstream org-x1"}}`},
		{"claude cut after 3", "claude", Fault{Mode: FaultStreamCut, AfterChunks: 3}, 3, ""},
		{"chat error after 2", "chat", Fault{Mode: FaultStreamError, AfterChunks: 2}, 2, openAIServer},
		{"chat cut after 2", "chat", Fault{Mode: FaultStreamCut, AfterChunks: 2}, 2, ""},
		{"azure error", "azure", Fault{Provider: "azure", Mode: FaultStreamError}, 1, openAIServer},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, Config{DefaultLimits: Limits{RPM: 600, TPM: 600000}, StreamChunkInterval: -1})
			tt.fault.Count = 1
			if err := b.srv.SetFault(tt.fault); err != nil {
				t.Fatal(err)
			}
			var s *sseStream
			switch tt.format {
			case "claude":
				s = b.claudeStream(t, context.Background(), "k", claudeText("fault", 200))
			case "chat":
				s = b.chatStream(t, context.Background(), "k", chatText("fault", 200))
			default:
				s = b.stream(t, context.Background(), azurePath("d"), map[string]string{"api-key": "k"}, with(chatText("fault", 200), "stream", true))
			}
			msgs, err := s.rest()
			if got := contentChunks(msgs); got != tt.wantCount {
				t.Errorf("%d content chunks before the break, want %d", got, tt.wantCount)
			}
			switch {
			case tt.wantError == "":
				if !errors.Is(err, io.ErrUnexpectedEOF) {
					t.Errorf("stream ended with %v, want a dropped connection (unexpected EOF)", err)
				}
			case err != nil:
				t.Errorf("stream ended with %v, want a clean end after the error event", err)
			default:
				last := msgs[len(msgs)-1]
				wantEvent := ""
				if tt.format == "claude" {
					wantEvent = "error"
				}
				if last.event != wantEvent || last.data != tt.wantError {
					t.Errorf("last event %q %s, want %q %s", last.event, last.data, wantEvent, tt.wantError)
				}
			}
			for _, m := range msgs {
				if m.event == "message_delta" || m.event == "message_stop" || m.data == "[DONE]" || strings.Contains(m.data, `"finish_reason":"`) {
					t.Errorf("broken stream carries its end: %s %s", m.event, m.data)
				}
			}
			fp := Fingerprint("k")
			if st := b.srv.Stats(); st.InFlight != 0 || st.Keys[fp].Injected[tt.fault.Mode] != 1 || st.Keys[fp].OK != 0 || st.Keys[fp].Requests != 1 {
				t.Errorf("stats = %+v", st)
			}
			if f := b.srv.Faults(); len(f) != 0 {
				t.Errorf("faults left = %+v, want the one used up", f)
			}
		})
	}
}

func TestStreamFaultMatching(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{StreamChunkInterval: -1})
	if err := b.srv.SetFault(Fault{Mode: FaultStreamError, Count: 1}); err != nil {
		t.Fatal(err)
	}
	// A request that does not stream passes a stream fault by.
	wantStatus(t, b.claude(t, "k", claudeText("x", 50)), http.StatusOK)
	if f := b.srv.Faults(); len(f) != 1 || f[0].Count != 1 {
		t.Fatalf("faults = %+v, want the stream fault untouched", f)
	}
	// A streamed request meets an ordinary fault first: it answers before
	// the body is read.
	if err := b.srv.SetFault(Fault{Mode: FaultOverloaded, Count: 1}); err != nil {
		t.Fatal(err)
	}
	r := b.claude(t, "k", with(claudeText("x", 50), "stream", true))
	wantStatus(t, r, 529)
	msgs, err := b.claudeStream(t, context.Background(), "k", claudeText("x", 50)).rest()
	if err != nil || msgs[len(msgs)-1].event != "error" {
		t.Errorf("stream = %v (%v), want it broken by the stream fault", msgs, err)
	}

	if err := b.srv.SetFault(Fault{Mode: FaultRateLimit, AfterChunks: 2}); err == nil || !strings.Contains(err.Error(), "AfterChunks") {
		t.Errorf("SetFault rate_limit with AfterChunks: err = %v, want a refusal", err)
	}
	var f Fault
	if err := json.Unmarshal([]byte(`{"mode":"stream_cut","after_chunks":3}`), &f); err != nil || f.Mode != FaultStreamCut || f.AfterChunks != 3 {
		t.Errorf("decoded %+v (%v)", f, err)
	}
	if raw, _ := json.Marshal(f); !strings.Contains(string(raw), `"after_chunks":3`) {
		t.Errorf("encoded %s", raw)
	}
}

func TestStreamPaceSettings(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	r := b.do(t, http.MethodPost, "/mock/latency", nil,
		`{"stream_first_token":"-1ms","stream_chunk_interval":"-1s","stream_chunk_tokens":3}`)
	wantStatus(t, r, http.StatusOK)
	if m := r.json(t); m["stream_first_token"] != "-1ms" || m["stream_chunk_interval"] != "0s" || m["stream_chunk_tokens"] != 3.0 || m["latency"] != "0s" {
		t.Errorf("latency answer = %s", r.body)
	}
	// Three tokens a chunk: 12 bytes, the last shorter.
	msgs := b.claudeStream(t, context.Background(), "k", claudeText("chunk size", 200)).all(t)
	text := Reply("chunk size")
	var got []string
	for _, m := range msgs {
		if m.event == "content_block_delta" {
			var e claudeEvent
			if err := json.Unmarshal([]byte(m.data), &e); err != nil {
				t.Fatal(err)
			}
			got = append(got, e.Delta.Text)
		}
	}
	if diff := cmp.Diff(pieces(text, 12), got); diff != "" || len(got[0]) != 12 {
		t.Errorf("chunks (-want +got):\n%s", diff)
	}

	for _, bad := range []string{`{"stream_chunk_tokens":-1}`, `{"stream_first_token":"soon"}`, `{"latency":"-1s"}`} {
		if r := b.do(t, http.MethodPost, "/mock/latency", nil, bad); r.status != http.StatusBadRequest {
			t.Errorf("POST latency %s: %d, want 400", bad, r.status)
		}
	}
	if _, err := New(Config{StreamChunkTokens: -1}); err == nil || !strings.Contains(err.Error(), "StreamChunkTokens") {
		t.Errorf("New with StreamChunkTokens -1: err = %v", err)
	}
}

func TestPieces(t *testing.T) {
	t.Parallel()
	tests := []struct {
		s    string
		n    int
		want []string
	}{
		{"", 4, nil},
		{"abcdefgh", 4, []string{"abcd", "efgh"}},
		{"abcdefghi", 4, []string{"abcd", "efgh", "i"}},
		{"ü✓🚗", 4, []string{"ü", "✓", "🚗"}}, // 2, 3 and 4 bytes: never split
		{"ü✓🚗", 8, []string{"ü✓", "🚗"}},
		{"🚗", 1, []string{"🚗"}}, // a rune longer than n is a chunk of its own
	}
	for _, tt := range tests {
		if diff := cmp.Diff(tt.want, pieces(tt.s, tt.n)); diff != "" {
			t.Errorf("pieces(%q, %d) (-want +got):\n%s", tt.s, tt.n, diff)
		}
	}
}
