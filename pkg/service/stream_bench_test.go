package service_test

import (
	"bufio"
	"bytes"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"bulwark/pkg/job"
	"bulwark/pkg/testkit/mockprovider"
)

// Pace of the provider in BenchmarkStreamTTFB: time to first token and
// the gap between its chunks (one token each).
const (
	benchFirstToken = 200 * time.Millisecond
	benchChunkGap   = 20 * time.Millisecond
)

// BenchmarkStreamTTFB measures what streaming adds to what the provider
// itself takes (issue 27): streaming calls to POST /v1/chat/completions
// over real HTTP, one API and one worker (in this process), real Redis,
// the mock streaming at a fixed pace (first token after 200 ms, a token
// every 20 ms, about 25 tokens), with slots and keys enough that no call
// waits in line: this measures streaming, not queueing. Each case sends n
// calls from c concurrent clients, then the same calls straight to the
// mock, and reports:
//
//	ttfb_over_p50_ms, ttfb_over_p99_ms  time to the first content chunk at
//	                    the caller, less the provider's own (the same
//	                    call's p50 straight to the mock)
//	gap_over_p99_ms     how much longer than the provider's own gap
//	                    (20 ms) the gaps between content chunks are
//	redis_cmds/req, redis_mem_B/req, delta_events/req   what a streamed
//	                    answer costs Redis (the scale model)
//
// It fails when the targets are missed: ttfb overhead ≤ 50 ms (p50) and
// ≤ 150 ms (p99), gaps stretched ≤ 20 ms (p99). Run it with -benchtime 1x.
func BenchmarkStreamTTFB(b *testing.B) {
	for _, tc := range []struct{ clients, n int }{{1, 25}, {32, 640}} {
		b.Run(fmt.Sprintf("c=%d", tc.clients), func(b *testing.B) {
			for range b.N {
				benchStream(b, tc.clients, tc.n)
			}
		})
	}
}

// streamKeys are two openai/gpt4o keys no benchmark load reaches.
const streamKeys = `
keys:
  - {id: openai-gpt4o-1, provider: openai, model_tier: gpt4o, api_key: "mock-openai-key-a", rpm_limit: 1000000, tpm_limit: 1000000000}
  - {id: openai-gpt4o-2, provider: openai, model_tier: gpt4o, api_key: "mock-openai-key-b", rpm_limit: 1000000, tpm_limit: 1000000000}`

// streamTiming is when one streamed call's content chunks arrived,
// relative to its start.
type streamTiming []time.Duration

func benchStream(b *testing.B, clients, n int) {
	b.StopTimer()
	s := newSystem(b, opts{quiet: true, keysYML: streamKeys,
		extraYML: "queue: {queue_max_depth: 20000, max_concurrent_llm_calls: 64}\ncache: {enabled: false}",
		mock:     mockprovider.Config{StreamFirstToken: benchFirstToken, StreamChunkInterval: benchChunkGap, StreamChunkTokens: 1}})
	s.cfg.Worker.Concurrency = 64
	api := s.startAPI()
	s.startWorker()
	cl := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: clients + 4}}
	tag := strconv.FormatInt(time.Now().UnixNano(), 36)
	body := func(i int) string {
		return fmt.Sprintf(`{"model":"gpt-4o","stream":true,"messages":[{"role":"user","content":"stream %d of %s: DTC P0300?"}]}`, i, tag)
	}
	bulwark := func(i int) (*http.Request, error) {
		req, err := http.NewRequest("POST", api.ts.URL+"/v1/chat/completions", strings.NewReader(body(i)))
		req.Header.Set("Authorization", "Bearer "+devToken)
		return req, err
	}
	direct := func(i int) (*http.Request, error) {
		req, err := http.NewRequest("POST", s.mockTS.URL+"/v1/chat/completions",
			strings.NewReader(strings.Replace(body(i), `"model":"gpt-4o"`, `"model":"gpt-4o","max_tokens":100`, 1)))
		req.Header.Set("Authorization", "Bearer mock-openai-key-a")
		return req, err
	}
	streamLoad(b, cl, min(clients, 8), 16, func(i int) (*http.Request, error) { return bulwark(n + i) }) // warm-up

	rdb := redis.NewClient(s.redis)
	defer rdb.Close()
	r0 := redisCost(b, rdb)
	b.StartTimer()
	via := streamLoad(b, cl, clients, n, bulwark)
	b.StopTimer()
	r1 := redisCost(b, rdb)
	own := streamLoad(b, cl, clients, n, direct)

	ownFirst := firsts(own)
	base := ownFirst[len(ownFirst)/2]
	first := firsts(via)
	over50, over99 := first[len(first)/2]-base, first[len(first)*99/100]-base
	gaps := stretches(via)
	gap99 := gaps[len(gaps)*99/100]
	b.ReportMetric(ms(base), "provider_ttft_ms")
	b.ReportMetric(ms(over50), "ttfb_over_p50_ms")
	b.ReportMetric(ms(over99), "ttfb_over_p99_ms")
	b.ReportMetric(ms(gap99), "gap_over_p99_ms")
	b.ReportMetric(float64(r1.commands-r0.commands)/float64(n), "redis_cmds/req")
	b.ReportMetric(float64(r1.mem-r0.mem)/float64(n), "redis_mem_B/req")
	b.ReportMetric(deltaEvents(b, rdb), "delta_events/req")
	if over50 > 50*time.Millisecond || over99 > 150*time.Millisecond || gap99 > 20*time.Millisecond {
		b.Errorf("streaming overhead over target: ttfb +%s p50 (≤ 50ms), +%s p99 (≤ 150ms); gaps +%s p99 (≤ 20ms)",
			over50, over99, gap99)
	}
}

// streamLoad sends n streaming calls from c clients and returns each
// one's content-chunk times.
func streamLoad(b *testing.B, cl *http.Client, c, n int, build func(int) (*http.Request, error)) []streamTiming {
	var mu sync.Mutex
	var out []streamTiming
	work := make(chan int)
	var wg sync.WaitGroup
	for range c {
		wg.Go(func() {
			for i := range work {
				tm, err := streamOnce(cl, build, i)
				if err != nil {
					b.Error(err)
					continue
				}
				mu.Lock()
				out = append(out, tm)
				mu.Unlock()
			}
		})
	}
	for i := range n {
		work <- i
	}
	close(work)
	wg.Wait()
	if len(out) != n {
		b.Fatalf("%d of %d streams answered", len(out), n)
	}
	return out
}

// streamOnce makes one call and times its content chunks.
func streamOnce(cl *http.Client, build func(int) (*http.Request, error), i int) (streamTiming, error) {
	req, err := build(i)
	if err != nil {
		return nil, err
	}
	start := time.Now()
	resp, err := cl.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("stream %d: status %d", i, resp.StatusCode)
	}
	var tm streamTiming
	sc := bufio.NewScanner(resp.Body)
	done := false
	for sc.Scan() {
		line := sc.Bytes()
		switch {
		case bytes.Equal(line, []byte("data: [DONE]")):
			done = true
		case bytes.HasPrefix(line, []byte("data: ")) && bytes.Contains(line, []byte(`"content":"`)) &&
			!bytes.Contains(line, []byte(`"content":""`)):
			tm = append(tm, time.Since(start))
		}
	}
	if !done || len(tm) < 2 {
		return nil, fmt.Errorf("stream %d: %d content chunks, done %v, %v", i, len(tm), done, sc.Err())
	}
	return tm, nil
}

func firsts(ts []streamTiming) []time.Duration {
	out := make([]time.Duration, len(ts))
	for i, t := range ts {
		out[i] = t[0]
	}
	slices.Sort(out)
	return out
}

// stretches are how much longer than the provider's gap each gap between
// two content chunks was.
func stretches(ts []streamTiming) []time.Duration {
	var out []time.Duration
	for _, t := range ts {
		for i := 1; i < len(t); i++ {
			out = append(out, t[i]-t[i-1]-benchChunkGap)
		}
	}
	slices.Sort(out)
	return out
}

// deltaEvents is the mean number of delta events of the requests still
// in Redis, read from their event streams.
func deltaEvents(b *testing.B, rdb *redis.Client) float64 {
	ctx := b.Context()
	keys, err := rdb.Keys(ctx, "*ev:*").Result()
	if err != nil || len(keys) == 0 {
		b.Fatalf("event streams: %v (%d)", err, len(keys))
	}
	total := 0
	for _, k := range keys {
		msgs, err := rdb.XRange(ctx, k, "-", "+").Result()
		if err != nil {
			b.Fatal(err)
		}
		for _, m := range msgs {
			if e, _ := m.Values["e"].(string); strings.Contains(e, `"type":"`+string(job.EventDelta)+`"`) {
				total++
			}
		}
	}
	return float64(total) / float64(len(keys))
}
