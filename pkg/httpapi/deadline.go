package httpapi

import (
	"bufio"
	"net"
	"net/http"
	"time"

	"github.com/gin-gonic/gin"
)

// writeDeadlines gives every write of every response Config.WriteTimeout
// to go out: a client that stops reading makes the write fail, the
// handler returns (releasing what it holds: a tenant's sync-wait or
// stream slot, its hub subscription) and net/http closes the connection.
//
// The http.Server has no WriteTimeout of its own, on purpose: it bounds
// the whole response from the end of the request headers, and a compat
// call waits minutes before its first byte, an event stream up to
// StreamMaxLifetime. The deadline is instead moved forward before each
// write, so it measures a stalled write, not a long wait. It is also set
// when the request arrives (a "100 Continue" net/http writes when the
// body is first read; a deadline left over from the connection's previous
// request must not fail it) and once the handler has returned, for the
// buffered rest net/http sends after it.
func (s *Server) writeDeadlines(c *gin.Context) {
	w := &deadlineWriter{ResponseWriter: c.Writer, rc: http.NewResponseController(c.Writer), timeout: s.cfg.WriteTimeout}
	w.arm()
	c.Writer = w
	c.Next()
	if !w.hijacked {
		w.arm()
	}
}

// deadlineWriter is a gin.ResponseWriter that moves the connection's write
// deadline to now + timeout before each write or flush. Owned by the
// request's goroutine.
type deadlineWriter struct {
	gin.ResponseWriter
	rc       *http.ResponseController
	timeout  time.Duration
	hijacked bool // the connection is no longer the server's: leave its deadline alone
}

// arm moves the write deadline. A writer without deadlines (a test's
// recorder) answers http.ErrNotSupported, which leaves it unbounded.
func (w *deadlineWriter) arm() { _ = w.rc.SetWriteDeadline(time.Now().Add(w.timeout)) }

func (w *deadlineWriter) Write(b []byte) (int, error) {
	w.arm()
	return w.ResponseWriter.Write(b)
}

func (w *deadlineWriter) WriteString(s string) (int, error) {
	w.arm()
	return w.ResponseWriter.WriteString(s)
}

// WriteHeader arms too: an informational status (1xx) is written at once.
func (w *deadlineWriter) WriteHeader(code int) {
	w.arm()
	w.ResponseWriter.WriteHeader(code)
}

func (w *deadlineWriter) WriteHeaderNow() {
	w.arm()
	w.ResponseWriter.WriteHeaderNow()
}

func (w *deadlineWriter) Flush() {
	w.arm()
	w.ResponseWriter.Flush()
}

func (w *deadlineWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	conn, rw, err := w.ResponseWriter.Hijack()
	if err == nil {
		w.hijacked = true
	}
	return conn, rw, err
}

// Unwrap lets http.NewResponseController reach net/http's writer.
func (w *deadlineWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
