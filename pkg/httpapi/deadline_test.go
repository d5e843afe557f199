//go:build unix

package httpapi_test

import (
	"net"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// A client that sends its request and never reads is dropped once a
// write of its response has waited WriteTimeout, whatever the response,
// and the tenant's slot its handler held is free again. Loopback buffers
// would swallow a whole answer, so the server's connections get a small
// send buffer, the stalled client a small receive window, and each
// response is larger than both (the OpenAPI description, 75 KB, is).
func TestStalledReaderIsDropped(t *testing.T) {
	t.Parallel()
	big := strings.Repeat("all work and no play ", 50_000) // 1 MB
	for _, tc := range []struct {
		name string
		// stall sends the stalled request and returns its connection's
		// closing; then, if set, freed shows the slot it held is free.
		stall func(t *testing.T, s *server, st *stalls) <-chan struct{}
		freed func(t *testing.T, s *server)
	}{
		{name: "json", stall: func(t *testing.T, s *server, st *stalls) <-chan struct{} {
			id := s.submit(t, tokAcme, "q")
			s.jobs.complete(t, id, big)
			return st.stall(t, s, "GET", "/v1/requests/"+id, tokAcme, "")
		}},
		{name: "openapi", stall: func(t *testing.T, s *server, st *stalls) <-chan struct{} {
			return st.stall(t, s, "GET", "/openapi.json", "", "")
		}},
		{name: "event stream", stall: func(t *testing.T, s *server, st *stalls) <-chan struct{} {
			id := s.submit(t, tokLimited, "q")
			s.jobs.complete(t, id, big) // the stream replays the answer
			return st.stall(t, s, "GET", "/v1/requests/"+id+"/events", tokLimited, "")
		}, freed: func(t *testing.T, s *server) { // MaxStreams 1
			id := s.submit(t, tokLimited, "another")
			s.jobs.complete(t, id, "small")
			if r := s.do(t, "GET", "/v1/requests/"+id+"/events", tokLimited, ""); r.code != http.StatusOK {
				t.Fatalf("second stream: %d %s", r.code, r.body)
			}
		}},
		{name: "compat answer", stall: func(t *testing.T, s *server, st *stalls) <-chan struct{} {
			closed := st.stall(t, s, "POST", "/v1/chat/completions", tokLimited,
				`{"model":"gpt-4o","messages":[{"role":"user","content":"q"}]}`)
			s.jobs.complete(t, s.enqueuedID(t), big)
			return closed
		}, freed: secondCompatCall},
		{name: "compat stream", stall: func(t *testing.T, s *server, st *stalls) <-chan struct{} {
			closed := st.stall(t, s, "POST", "/v1/messages", tokLimited,
				`{"model":"claude-sonnet","max_tokens":64,"stream":true,"messages":[{"role":"user","content":"q"}]}`)
			s.jobs.complete(t, s.enqueuedID(t), big)
			return closed
		}, freed: secondCompatCall},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			st := &stalls{closed: map[string]chan struct{}{}}
			s := newServer(t, func(su *setup) {
				su.cfg.WriteTimeout = 200 * time.Millisecond
				su.listen = st.listen
			})
			closed := tc.stall(t, s, st)
			select {
			case <-closed:
			case <-time.After(10 * time.Second):
				t.Fatal("the server still holds the connection of a client that stopped reading")
			}
			if tc.freed != nil {
				tc.freed(t, s)
			}
		})
	}
}

// secondCompatCall shows that tokLimited's one sync wait is free: a call
// is accepted and answered.
func secondCompatCall(t *testing.T, s *server) {
	t.Helper()
	pending := s.start("POST", "/v1/chat/completions", tokLimited,
		`{"model":"gpt-4o","messages":[{"role":"user","content":"another"}]}`)
	select {
	case r := <-pending:
		t.Fatalf("second call answered before its request ended: %d %s", r.code, r.body)
	case id := <-s.queue.enqueued:
		s.jobs.complete(t, id, "small")
	case <-time.After(10 * time.Second):
		t.Fatal("the second call was neither refused nor enqueued")
	}
	if r := wait(t, pending); r.code != http.StatusOK {
		t.Fatalf("second call: %d %s", r.code, r.body)
	}
}

// stalls makes the server's accepted connections small-buffered and
// reports when the server closes each, by the client's address.
type stalls struct {
	mu     sync.Mutex
	closed map[string]chan struct{}
}

// closing returns the channel closed when the server closes the
// connection of the client at addr.
func (st *stalls) closing(addr string) chan struct{} {
	st.mu.Lock()
	defer st.mu.Unlock()
	c, ok := st.closed[addr]
	if !ok {
		c = make(chan struct{})
		st.closed[addr] = c
	}
	return c
}

func (st *stalls) listen(l net.Listener) net.Listener { return stallListener{l, st} }

type stallListener struct {
	net.Listener
	st *stalls
}

func (l stallListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	if tc, ok := c.(*net.TCPConn); ok {
		if err := tc.SetWriteBuffer(4096); err != nil {
			_ = c.Close()
			return nil, err
		}
	}
	return &watchedConn{Conn: c, closed: l.st.closing(c.RemoteAddr().String())}, nil
}

// watchedConn is a server connection that reports its Close.
type watchedConn struct {
	net.Conn
	once   sync.Once
	closed chan struct{}
}

func (c *watchedConn) Close() error {
	c.once.Do(func() { close(c.closed) })
	return c.Conn.Close()
}

// stall sends a request from a client with a tiny receive window that
// never reads, and returns the closing of its connection by the server.
func (st *stalls) stall(t *testing.T, s *server, method, path, token, body string) <-chan struct{} {
	t.Helper()
	d := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
		var err error
		if cerr := rc.Control(func(fd uintptr) {
			err = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 1024)
		}); cerr != nil {
			return cerr
		}
		return err
	}}
	conn, err := d.Dial("tcp", strings.TrimPrefix(s.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() }) // before the server's Close, which waits for its handlers
	req, err := http.NewRequest(method, s.url+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if err := req.Write(conn); err != nil {
		t.Fatal(err)
	}
	return st.closing(conn.LocalAddr().String())
}
