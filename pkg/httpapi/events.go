package httpapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/gin-gonic/gin"

	"bulwark/pkg/job"
	"bulwark/pkg/progress"
)

// events streams a request's events as Server-Sent Events. Stored events
// carry their stream id as the SSE id, so a client that reconnects with
// Last-Event-ID gets exactly what it missed; position updates carry no id.
// The stream ends after the terminal event (a finished request's stream
// sends it at once), after StreamMaxLifetime (the client reconnects), or
// when a write to a client that stopped reading passes WriteTimeout
// (writeDeadlines).
func (s *Server) events(c *gin.Context) {
	last := c.GetHeader("Last-Event-ID")
	if last == "" {
		last = c.Query("last_event_id")
	}
	if last != "" && !job.ValidEventID(last, time.Now()) {
		apiError(c, http.StatusBadRequest, "invalid_last_event_id", "Last-Event-ID",
			"Last-Event-ID must be an event id this stream sent (\"<ms>-<seq>\", not in the future)")
		return
	}
	own, rec, ok := s.lookup(c)
	if c.IsAborted() {
		return
	}
	if !ok {
		apiError(c, http.StatusNotFound, "not_found", "id", "no request "+c.Param("id"))
		return
	}
	t := tenantOf(c)
	if !s.streams.enter(t.Name, t.MaxStreams) {
		c.Header("Retry-After", "5")
		apiError(c, http.StatusTooManyRequests, "too_many_streams", "", fmt.Sprintf(
			"this tenant already has %d event streams open on this API process; close one or poll GET /v1/requests/%s",
			t.MaxStreams, c.Param("id")))
		return
	}
	defer s.streams.leave(t.Name)
	ctx, cancel := context.WithTimeout(c.Request.Context(), s.cfg.StreamMaxLifetime)
	defer cancel()
	lang := progress.Lang(c.GetHeader("Accept-Language"))
	follow := rec.Job.ID // the request whose events we stream (the leader, if coalesced)
	sub := s.d.Hub.Subscribe(follow, lang)
	defer sub.Close()
	var ownC <-chan job.Event // a coalesced follower's own cancellation
	if own != rec {
		os := s.d.Hub.Subscribe(own.Job.ID, lang)
		defer os.Close()
		ownC = os.C
	}

	w := c.Writer
	startSSE(w)

	detached := false // the leader ended for a reason of its own: follow our own events
	write := func(ev job.Event) bool {
		if own != rec && !detached && progress.Ends(ev.Type) && ev.RequestID != own.Job.ID && !ev.SharedEnding() {
			detached = true
			return false
		}
		ev.RequestID = own.Job.ID
		if err := writeSSE(w, ev); err != nil {
			return true
		}
		if ev.ID != "" {
			last = ev.ID
		}
		return progress.Ends(ev.Type)
	}
	replay := func() bool {
		evs, err := s.d.Jobs.Events(ctx, follow, last)
		if err != nil {
			s.d.Logger.Warn("events: replay", "request_id", own.Job.ID, "err", err)
			return false
		}
		for _, ev := range evs {
			if write(ev) {
				return true
			}
		}
		return false
	}
	if own.Status == job.StatusCancelled {
		write(job.Event{Type: job.EventCancelled, Status: job.StatusCancelled, At: time.Now()})
		return
	}
	if replay() {
		return
	}
	if !detached {
		// A request that has already ended, whose terminal event the
		// client saw before reconnecting: say so again and close, rather
		// than sending keep-alives forever.
		if end, ok := s.ended(ctx, own, rec); ok {
			write(end)
			return
		}
	}
	if rec.Status == job.StatusQueued {
		if sp, err := s.d.Queue.SpotOf(ctx, follow); err == nil && sp.Position > 0 {
			write(progress.QueuedEvent(own.Job.ID, sp.Position, sp.ETA, lang))
		}
	}
	keep := time.NewTicker(s.cfg.KeepAlive)
	defer keep.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case ev := <-ownC:
			if (detached || progress.Ends(ev.Type)) && write(ev) {
				return
			}
		case ev := <-sub.C:
			if detached {
				continue
			}
			if ev.Type == "resync" || sub.Lagged() {
				if replay() {
					return
				}
				continue
			}
			if ev.ID != "" && last != "" && job.CompareIDs(ev.ID, last) <= 0 {
				continue // already sent by the replay
			}
			if write(ev) {
				return
			}
		case <-keep.C:
			if !detached {
				if end, ok := s.vanished(ctx, follow); ok {
					write(end)
					return
				}
			}
			if _, err := fmt.Fprint(w, ": keepalive\n\n"); err != nil {
				return
			}
			w.Flush()
		}
	}
}

// ended returns the terminal event of a request that has ended: own's
// (cancelled) or the effective record's (the leader's shared ending).
func (s *Server) ended(ctx context.Context, own, rec *job.Record) (job.Event, bool) {
	r, err := s.d.Jobs.Get(ctx, rec.Job.ID)
	if err != nil || !r.Status.Terminal() || (own != rec && !r.SharedEnding()) {
		return job.Event{}, false
	}
	ev := job.Event{Status: r.Status, At: time.Now(), Code: r.Code, Error: r.Reason}
	switch r.Status {
	case job.StatusCompleted:
		ev.Type, ev.Result, ev.Error = job.EventCompleted, job.ResultOf(r.State), ""
	case job.StatusCancelled:
		ev.Type = job.EventCancelled
	default:
		ev.Type = job.EventFailed
	}
	return ev, true
}

// vanished checks, at each keep-alive, that the followed request still
// exists: a record lost with a Redis master (stored on it after a
// failover's promotion, answered 503 "not confirmed") would otherwise
// hold its followers' streams open with nothing ever to come. It returns
// the failed event to end the stream with; any other answer, Redis
// failing included, keeps the stream.
func (s *Server) vanished(ctx context.Context, id string) (job.Event, bool) {
	if _, err := s.d.Jobs.StatusOf(ctx, id); !errors.Is(err, job.ErrNotFound) {
		return job.Event{}, false
	}
	return job.Event{Type: job.EventFailed, Status: job.StatusFailed, Code: job.CodeLost, Error: job.LostReason, At: time.Now()}, true
}

// startSSE sends the headers of an event stream: no caching, and no
// buffering by a proxy (nginx's X-Accel-Buffering), so each event goes out
// as written.
func startSSE(w gin.ResponseWriter) {
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("Connection", "keep-alive")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
}

func writeSSE(w gin.ResponseWriter, ev job.Event) error {
	data, err := json.Marshal(ev)
	if err != nil {
		return err
	}
	if ev.ID != "" {
		if _, err := fmt.Fprintf(w, "id: %s\n", ev.ID); err != nil {
			return err
		}
	}
	if _, err := fmt.Fprintf(w, "event: %s\ndata: %s\n\n", ev.Type, data); err != nil {
		return err
	}
	w.Flush()
	return nil
}
