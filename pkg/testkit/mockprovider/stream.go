package mockprovider

// Streamed answers: stream=true on the Messages, Chat Completions and Azure
// chat endpoints. What each format sends, and where that comes from, is in
// the package doc ("Streaming"), anthropic_stream.go and openai_stream.go;
// this file paces the frames, breaks a stream on a fault and settles the
// call when the stream ends.

import (
	"encoding/json"
	"fmt"
	"net/http"
	"time"
	"unicode/utf8"
)

// SetStreamFirstToken sets the time to first token of streamed answers,
// with the meaning of Config.StreamFirstToken: 0 follows the latency,
// negative is none. Safe for concurrent use.
func (s *Server) SetStreamFirstToken(d time.Duration) {
	s.firstToken.Store(int64(d))
	s.log.Info("mock provider: stream first token set", "stream_first_token", d)
}

// SetStreamChunkInterval sets the gap between content chunks, with the
// meaning of Config.StreamChunkInterval: 0 is StreamChunkIntervalDefault,
// negative is none. Safe for concurrent use.
func (s *Server) SetStreamChunkInterval(d time.Duration) {
	d = streamChunkInterval(d)
	s.chunkInterval.Store(int64(d))
	s.log.Info("mock provider: stream chunk interval set", "stream_chunk_interval", d)
}

// SetStreamChunkTokens sets the tokens a content chunk carries, with the
// meaning of Config.StreamChunkTokens: 0 is StreamChunkTokensDefault; the
// value is clamped to 1..StreamChunkTokensMax. Safe for concurrent use.
func (s *Server) SetStreamChunkTokens(n int) {
	n = min(max(streamChunkTokens(n), 1), StreamChunkTokensMax)
	s.chunkTokens.Store(int64(n))
	s.log.Info("mock provider: stream chunk tokens set", "stream_chunk_tokens", n)
}

// firstTokenWait is this stream's time to first token.
func (s *Server) firstTokenWait() time.Duration {
	d := time.Duration(s.firstToken.Load())
	switch {
	case d == 0:
		return s.delay()
	case d < 0:
		return 0
	}
	return d
}

// frame is one server-sent event as it goes on the wire.
type frame struct {
	data []byte
	// content marks a content chunk: a text or tool-input delta, or an
	// OpenAI tool call's first chunk. The pace and AfterChunks count these.
	content bool
	// tokens is the output produced once this frame is out, for settling
	// a stream that ends early; set on content frames.
	tokens int
}

// script is an answer rendered as a stream before its first byte is
// written.
type script struct {
	// head goes out at admission, before the first-token wait:
	// message_start, or the role chunk.
	head []frame
	// body is the rest: each content chunk goes out with the frames
	// before it; the frames after the last one close the stream.
	body []frame
	// outputTokens is the usage of the whole answer.
	outputTokens int
	// fail renders the provider's mid-stream error event; message "" keeps
	// the provider's wording.
	fail func(message string) frame
}

// steps cuts the body into what goes out at one moment: the frames up to
// and including a content chunk, and last the frames that close the
// stream. It also returns how many content chunks there are.
func (sc *script) steps() (steps [][]frame, chunks int) {
	start := 0
	for i, f := range sc.body {
		if f.content {
			steps = append(steps, sc.body[start:i+1])
			start, chunks = i+1, chunks+1
		}
	}
	return append(steps, sc.body[start:]), chunks
}

// sseEvent is a named event: "event: <name>" and its JSON data, as
// Anthropic sends them.
func sseEvent(name string, v any) frame {
	return frame{data: fmt.Appendf(nil, "event: %s\ndata: %s\n\n", name, eventJSON(v))}
}

// sseData is a data-only event, as OpenAI sends them.
func sseData(v any) frame {
	return frame{data: fmt.Appendf(nil, "data: %s\n\n", eventJSON(v))}
}

// eventJSON marshals the mock's own event types, which cannot fail.
func eventJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic("mockprovider: encoding a stream event: " + err.Error()) // a bug in the mock
	}
	return b
}

// pieces cuts s into content chunks of at most n bytes, never inside a
// UTF-8 rune (a rune longer than n makes a chunk of its own).
func pieces(s string, n int) []string {
	var out []string
	for s != "" {
		p := truncateBytes(s, n)
		if p == "" {
			_, size := utf8.DecodeRuneInString(s)
			p = s[:size]
		}
		out = append(out, p)
		s = s[len(p):]
	}
	return out
}

// produced is the output tokens of the first n bytes of an answer whose
// whole is out tokens: CountTokens' rate, 0 for nothing.
func produced(n, out int) int {
	if n == 0 {
		return 0
	}
	return min(out, tokensForBytes(n))
}

// streamEnd says how a stream ended.
type streamEnd int

const (
	streamDone   streamEnd = iota // the whole answer went out
	streamGone                    // the client went away
	streamBroken                  // a stream fault broke it
)

// streamCall is one admitted call being answered as a stream. It belongs
// to the goroutine serving the request.
type streamCall struct {
	s   *Server
	w   http.ResponseWriter
	rc  *http.ResponseController
	wr  wire
	lk  limiterKey
	lim *limiter
	cl  *call
}

// streamAnswer writes an admitted call's answer as a stream. The headers
// (status 200, request id, rate-limit headers as admission left the
// buckets) and the head go out and are flushed at once; the first content
// chunk after the first-token wait, counted from admission; each next one
// StreamChunkInterval after the one before; the closing frames right after
// the last. A stream fault breaks it at the moment its chunk is due. Every
// wait ends when the client goes away, and nothing more is written then.
// The call is settled and counted when the stream ends, however it ends.
func (s *Server) streamAnswer(w http.ResponseWriter, r *http.Request, wr wire, lk limiterKey, lim *limiter, cl *call, admitted time.Time) {
	s.mu.Lock()
	fault, faulted := s.takeFault(wr.provider(), lk.fp, true)
	now := s.now()
	sc := cl.stream(now, 4*int(s.chunkTokens.Load()))
	snap := lim.snapshot(now)
	s.mu.Unlock()
	first := admitted.Add(s.firstTokenWait())
	interval := time.Duration(s.chunkInterval.Load())

	wr.setRateHeaders(w.Header(), snap)
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	sx := &streamCall{s: s, w: w, rc: http.NewResponseController(w), wr: wr, lk: lk, lim: lim, cl: cl}
	if !sx.write(sc.head) {
		sx.end(streamGone, 0, "")
		return
	}

	steps, chunks := sc.steps()
	breakAt := -1
	if faulted {
		breakAt = fault.afterChunks(chunks)
	}
	tokens := 0 // output streamed so far
	for k, step := range steps {
		// Content chunk k is due at first + k×interval; the closing frames
		// follow the last chunk at once (or the first token, without one).
		if k < chunks || chunks == 0 {
			if !s.sleep(r, time.Until(first.Add(time.Duration(k)*interval))) {
				sx.end(streamGone, tokens, "")
				return
			}
		}
		if k == breakAt {
			sx.breakOff(fault, sc, tokens)
			return
		}
		if !sx.write(step) {
			sx.end(streamGone, tokens, "")
			return
		}
		if last := step[len(step)-1]; last.content {
			tokens = last.tokens
		}
	}
	sx.end(streamDone, sc.outputTokens, "")
}

// write writes frames and flushes them to the client, and reports false
// when the client is gone.
func (sx *streamCall) write(frames []frame) bool {
	for _, f := range frames {
		if _, err := sx.w.Write(f.data); err != nil {
			return false
		}
	}
	return sx.rc.Flush() == nil
}

// breakOff ends the stream on fault f after tokens of output: with the
// provider's error event (FaultStreamError), or by dropping the connection
// (FaultStreamCut).
func (sx *streamCall) breakOff(f Fault, sc *script, tokens int) {
	sx.end(streamBroken, tokens, f.Mode)
	if f.Mode == FaultStreamCut {
		panic(http.ErrAbortHandler) // net/http drops the connection quietly
	}
	sx.write([]frame{sc.fail(f.Message)}) // the client may be gone; nothing to do about it
}

// end settles the call after tokens of output and counts it: a finished
// stream as an answer, a broken one as its fault mode, one the client left
// as a request only. As for a client that gives up before a non-streamed
// answer, a provider that settles to usage gives back the part of the
// reservation not produced: all of it when the client left before the
// first token, max_tokens − output when the stream finished.
func (sx *streamCall) end(how streamEnd, tokens int, mode FaultMode) {
	s, cl := sx.s, sx.cl
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.settles(cl) {
		sx.lim.credit(s.now(), max(0, cl.reserve-tokens))
	}
	s.book.record(sx.wr.provider(), sx.lk.fp, func(c *Counters) {
		c.Requests++
		switch how {
		case streamDone:
			c.OK++
			c.InputTokens += int64(cl.inputTokens)
			c.OutputTokens += int64(tokens)
		case streamBroken:
			if c.Injected == nil {
				c.Injected = map[FaultMode]int64{}
			}
			c.Injected[mode]++
		}
	})
}
