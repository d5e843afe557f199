package storm

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"time"

	"bulwark/pkg/breaker"
)

// breakerPollInterval is how often the watcher reads GET /admin/breakers.
const breakerPollInterval = 500 * time.Millisecond

// breakerWatch counts breaker openings by polling the admin API.
type breakerWatch struct {
	client *http.Client
	url    string

	mu       sync.Mutex
	openings map[string]map[time.Time]bool // name → distinct opened_at seen
	unnamed  map[string]bool               // seen open or half-open without opened_at
	errors   int                           // failed polls
}

func newBreakerWatch(client *http.Client, apiURL string) *breakerWatch {
	return &breakerWatch{client: client, url: apiURL + "/admin/breakers",
		openings: map[string]map[time.Time]bool{}, unnamed: map[string]bool{}}
}

// run polls until ctx ends.
func (w *breakerWatch) run(ctx context.Context) {
	t := time.NewTicker(breakerPollInterval)
	defer t.Stop()
	for {
		w.poll(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// poll reads the breakers once and records every opening it can see: an
// opened_at not seen before (the breaker opened since the last poll, even
// if it has closed again), or a breaker not closed that has none.
func (w *breakerWatch) poll(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	list, err := w.fetch(ctx)
	w.mu.Lock()
	defer w.mu.Unlock()
	if err != nil {
		if ctx.Err() == nil || errors.Is(ctx.Err(), context.DeadlineExceeded) {
			w.errors++ // not merely the watch being stopped
		}
		return
	}
	for _, b := range list {
		switch {
		case !b.OpenedAt.IsZero():
			if w.openings[b.Name] == nil {
				w.openings[b.Name] = map[time.Time]bool{}
			}
			w.openings[b.Name][b.OpenedAt] = true
		case b.State != breaker.StateClosed:
			w.unnamed[b.Name] = true
		}
	}
}

func (w *breakerWatch) fetch(ctx context.Context) ([]breaker.Status, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, w.url, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+adminToken)
	resp, err := w.client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("storm: GET /admin/breakers: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("storm: GET /admin/breakers: status %d", resp.StatusCode)
	}
	var out struct {
		Breakers []breaker.Status `json:"breakers"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return nil, fmt.Errorf("storm: GET /admin/breakers: %w", err)
	}
	return out.Breakers, nil
}

// result returns the number of openings, the breakers that opened (sorted)
// and the number of failed polls.
func (w *breakerWatch) result() (openings int, names []string, byName map[string]int, failedPolls int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	byName = map[string]int{}
	for name, at := range w.openings {
		if len(at) > 0 {
			byName[name] += len(at)
		}
	}
	for name := range w.unnamed {
		if len(w.openings[name]) == 0 {
			byName[name]++
		}
	}
	for name, n := range byName {
		openings += n
		names = append(names, name)
	}
	slices.Sort(names)
	return openings, names, byName, w.errors
}
