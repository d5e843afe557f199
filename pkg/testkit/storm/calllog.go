package storm

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// callLog is a recording proxy between the worker processes and the mock
// provider. The mock counts calls per key, not per prompt; the fault tests
// need to know, for every provider call, which worker made it, which
// prompt it carried and how it ended — to tell which requests a killed
// worker had in flight, and whether a prompt was sent again after it had
// been answered. Each worker process gets a listener of its own (its
// provider base URL, options.ProviderURL), so a call's worker is known
// without guessing from ports.
//
// The proxy forwards every request unchanged to the mock and the answer
// unchanged back; the worker's own deadline ends the forwarded call. It
// can also drop connections without answering (dropEvery), which a worker
// sees as a connection error.
type callLog struct {
	client *http.Client
	// dropEvery > 0 drops every dropEvery-th call's connection without an
	// answer; 0 drops none.
	dropEvery atomic.Int64
	seq       atomic.Int64

	mu       sync.Mutex
	upstream string          // the mock's URL; guarded by mu
	calls    []*providerCall // every call so far, in start order; guarded by mu
	inflight map[string]int  // calls in flight by worker; guarded by mu
	servers  []*http.Server  // one per worker; guarded by mu
	changed  chan struct{}   // closed and replaced when a call starts; guarded by mu
	closed   bool            // guarded by mu
}

// providerCall is one call a worker made to a provider.
type providerCall struct {
	Worker string
	// Prompt is the text of the call's last user message.
	Prompt string
	// Path is the provider endpoint (/v1/chat/completions, /v1/messages).
	Path       string
	Start, End time.Time // End is zero while the call runs
	// Status is the HTTP status written to the worker; 0 when none was
	// (dropped on purpose, the worker gone, the mock unreachable).
	Status int
	// Aborted: the worker went away (killed, or its deadline passed)
	// before the answer was written.
	Aborted bool
	// Dropped: the proxy dropped the connection on purpose (dropEvery).
	Dropped bool
}

func newCallLog() *callLog {
	return &callLog{
		client: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256, IdleConnTimeout: 30 * time.Second,
			DisableCompression: true}},
		inflight: map[string]int{},
		changed:  make(chan struct{}),
	}
}

// url starts a listener for worker and returns its base URL; calls through
// it are forwarded to upstream (the mock). It fits options.ProviderURL.
func (l *callLog) url(upstream, worker string) (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("storm: proxy for %s: %w", worker, err)
	}
	srv := &http.Server{Handler: l.handler(worker), ReadHeaderTimeout: 10 * time.Second,
		ErrorLog: log.New(io.Discard, "", 0)} // dropped and aborted calls would log noise
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		_ = ln.Close()
		return "", errors.New("storm: proxy closed")
	}
	l.upstream = upstream
	l.servers = append(l.servers, srv)
	l.mu.Unlock()
	go func() { _ = srv.Serve(ln) }() // ends at close
	return "http://" + ln.Addr().String(), nil
}

// close stops every listener and drops their connections.
func (l *callLog) close() {
	l.mu.Lock()
	l.closed = true
	servers := l.servers
	l.mu.Unlock()
	for _, s := range servers {
		_ = s.Close()
	}
	l.client.CloseIdleConnections()
}

func (l *callLog) handler(worker string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			return // the worker went away while sending
		}
		c := &providerCall{Worker: worker, Prompt: promptOf(body), Path: r.URL.Path, Start: time.Now()}
		l.begin(c)
		var status int
		var aborted, dropped bool
		defer func() { l.end(c, status, aborted, dropped) }()

		if n := l.dropEvery.Load(); n > 0 && l.seq.Add(1)%n == 0 {
			dropped = true
			panic(http.ErrAbortHandler) // net/http closes the connection without an answer
		}
		l.mu.Lock()
		upstream := l.upstream
		l.mu.Unlock()
		req, err := http.NewRequestWithContext(r.Context(), r.Method, upstream+r.URL.RequestURI(), bytes.NewReader(body))
		if err != nil {
			panic(http.ErrAbortHandler)
		}
		req.Header = r.Header.Clone()
		req.Header.Del("Connection")
		resp, err := l.client.Do(req)
		if err != nil {
			aborted = r.Context().Err() != nil
			panic(http.ErrAbortHandler) // a connection error for the worker, as the mock's would be
		}
		defer resp.Body.Close()
		answer, err := io.ReadAll(resp.Body)
		if err != nil {
			aborted = r.Context().Err() != nil
			panic(http.ErrAbortHandler)
		}
		for k, v := range resp.Header {
			switch k {
			case "Connection", "Content-Length", "Transfer-Encoding":
				continue
			}
			w.Header()[k] = v
		}
		w.WriteHeader(resp.StatusCode)
		if _, err := w.Write(answer); err != nil || r.Context().Err() != nil {
			aborted = true
			return
		}
		status = resp.StatusCode
	})
}

func (l *callLog) begin(c *providerCall) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.calls = append(l.calls, c)
	l.inflight[c.Worker]++
	close(l.changed)
	l.changed = make(chan struct{})
}

func (l *callLog) end(c *providerCall, status int, aborted, dropped bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	c.End, c.Status, c.Aborted, c.Dropped = time.Now(), status, aborted, dropped
	l.inflight[c.Worker]--
}

// inFlight returns the calls worker has in flight now.
func (l *callLog) inFlight(worker string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.inflight[worker]
}

// awaitMidCall returns the first of workers (in order) that has a provider
// call in flight, waiting for one to start a call if none has; it fails
// when ctx ends first.
func (l *callLog) awaitMidCall(ctx context.Context, workers []string) (string, error) {
	for {
		l.mu.Lock()
		changed := l.changed
		for _, w := range workers {
			if l.inflight[w] > 0 {
				l.mu.Unlock()
				return w, nil
			}
		}
		l.mu.Unlock()
		select {
		case <-ctx.Done():
			return "", context.Cause(ctx)
		case <-changed:
		}
	}
}

// snapshot returns a copy of every call so far.
func (l *callLog) snapshot() []providerCall {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]providerCall, len(l.calls))
	for i, c := range l.calls {
		out[i] = *c
	}
	return out
}

// promptOf returns the text of the last user message of an OpenAI or
// Anthropic request body ("" when there is none): a string content, or
// the text blocks of a block content.
func promptOf(body []byte) string {
	var req struct {
		Messages []struct {
			Role    string          `json:"role"`
			Content json.RawMessage `json:"content"`
		} `json:"messages"`
	}
	if json.Unmarshal(body, &req) != nil {
		return ""
	}
	for i := len(req.Messages) - 1; i >= 0; i-- {
		m := req.Messages[i]
		if m.Role != "user" {
			continue
		}
		var s string
		if json.Unmarshal(m.Content, &s) == nil {
			return s
		}
		var blocks []struct {
			Type string `json:"type"`
			Text string `json:"text"`
		}
		if json.Unmarshal(m.Content, &blocks) != nil {
			return ""
		}
		var b strings.Builder
		for _, bl := range blocks {
			if bl.Type == "text" {
				b.WriteString(bl.Text)
			}
		}
		return b.String()
	}
	return ""
}

// repeat is a provider call of a prompt that began after an earlier call
// of the same prompt had been answered (200 written to its worker).
type repeat struct {
	Answered, Again providerCall
}

// repeats finds, for every prompt, the calls that began after its first
// answered call ended. Calls without a prompt (embeddings) are skipped.
func repeats(calls []providerCall) []repeat {
	answered := map[string]providerCall{} // prompt → its first answered call
	for _, c := range calls {
		if c.Prompt == "" || c.Status != http.StatusOK || c.End.IsZero() {
			continue
		}
		if a, ok := answered[c.Prompt]; !ok || c.End.Before(a.End) {
			answered[c.Prompt] = c
		}
	}
	var out []repeat
	for _, c := range calls {
		if a, ok := answered[c.Prompt]; ok && c.Start.After(a.End) {
			out = append(out, repeat{Answered: a, Again: c})
		}
	}
	slices.SortFunc(out, func(a, b repeat) int { return a.Again.Start.Compare(b.Again.Start) })
	return out
}
