package service_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"bulwark/pkg/config"
	"bulwark/pkg/job"
	"bulwark/pkg/secret"
	"bulwark/pkg/testkit/mockprovider"
	"bulwark/pkg/testkit/testenv"
)

// 50 identical requests arrive at once on two API processes: one provider
// call, and every caller gets that answer.
func TestCoalescingAcrossAPIProcesses(t *testing.T) {
	t.Parallel()
	s := newSystem(t, opts{mock: mockprovider.Config{Latency: 500 * time.Millisecond}})
	apis := []*apiProc{s.startAPI(), s.startAPI()}
	s.startWorker()
	const prompt = "Fleet alert: 40 cars report U0100 after OTA 3.2.1. Root cause?"
	ids := make([]string, 50)
	var wg sync.WaitGroup
	for i := range ids {
		wg.Go(func() {
			ids[i] = apis[i%2].submit(t, ask(prompt))
		})
	}
	wg.Wait()
	for i, id := range ids {
		out := apis[i%2].waitStatus(t, id, 20*time.Second, "completed", "failed")
		res, _ := out["result"].(map[string]any)
		if out["status"] != "completed" || res["content"] != mockprovider.Reply(prompt) {
			t.Fatalf("caller %d: %v", i, out)
		}
	}
	if st := s.mock.Stats().Total(); st.OK != 1 {
		t.Fatalf("the provider was called %d times for 50 identical requests", st.OK)
	}
	// A coalesced caller's stream ends with the shared answer too.
	ch, _ := stream(t, apis[1].ts.URL+"/v1/requests/"+ids[1]+"/events", devToken, "")
	ev := next(t, ch, 5*time.Second, "completed")
	if ev.Data["request_id"] != ids[1] {
		t.Fatalf("follower's stream speaks for %v", ev.Data["request_id"])
	}
}

// With PostgreSQL unreachable, requests are still served (cache bypassed,
// counted, logged); when it returns, caching resumes.
func TestCacheFailsOpenWhenPostgresIsDown(t *testing.T) {
	t.Parallel()
	s := newSystem(t, opts{})
	api := s.startAPI()
	s.startWorker()
	db := dbName(t, s.pgDSN)
	admin, err := pgx.Connect(context.Background(), testenv.PGAdminDSN())
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(context.Background())
	setDown := func(down bool) {
		if _, err := admin.Exec(context.Background(), fmt.Sprintf("ALTER DATABASE %s ALLOW_CONNECTIONS %v", db, !down)); err != nil {
			t.Fatal(err)
		}
		if down {
			if _, err := admin.Exec(context.Background(), "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1", db); err != nil {
				t.Fatal(err)
			}
		}
	}
	setDown(true)
	defer setDown(false)

	for i := range 3 {
		prompt := fmt.Sprintf("served while PostgreSQL is down %d", i)
		id := api.submit(t, ask(prompt))
		out := api.waitStatus(t, id, 20*time.Second, "completed", "failed")
		if res, _ := out["result"].(map[string]any); out["status"] != "completed" || res["content"] != mockprovider.Reply(prompt) {
			t.Fatalf("request during the outage: %v", out)
		}
	}
	_, metricsText, _ := call(t, "GET", api.ts.URL+"/metrics", adminToken, nil)
	if m := metricsText["_raw"].(string); !strings.Contains(m, "bulwark_cache_unavailable_total") || strings.Contains(m, "bulwark_cache_unavailable_total 0\n") {
		t.Fatal("the outage was not counted in bulwark_cache_unavailable_total")
	}
	if !strings.Contains(s.logs.String(), "unavailable") {
		t.Fatal("the outage was not logged")
	}

	setDown(false)
	const prompt = "cached again after the outage"
	waitFor(t, 30*time.Second, "caching to resume", func() bool {
		id := api.submit(t, ask(prompt))
		out := api.waitStatus(t, id, 20*time.Second, "completed", "failed")
		res, _ := out["result"].(map[string]any)
		return res["cached"] == "exact"
	})
}

// waitCacheRows waits until the cache holds n entries: the finisher
// stores an answer just after the request completes.
func waitCacheRows(t *testing.T, api *apiProc, n int) {
	t.Helper()
	waitFor(t, 10*time.Second, fmt.Sprintf("%d cached answers", n), func() bool {
		var got int
		err := api.base.PG.QueryRow(t.Context(), "SELECT count(*) FROM semantic_cache").Scan(&got)
		return err == nil && got >= n
	})
}

func dbName(t *testing.T, dsn string) string {
	t.Helper()
	i := strings.LastIndex(dsn, "/")
	name := dsn[i+1:]
	if j := strings.Index(name, "?"); j >= 0 {
		name = name[:j]
	}
	return name
}

// Through the API: a near-duplicate (another VIN and timestamp) is a
// semantic hit, its answer quoting the asked VIN; a different DTC is not; unrelated questions under one
// long shared system prompt are not; the bypass flags skip the cache.
func TestSemanticCacheThroughAPI(t *testing.T) {
	t.Parallel()
	s := newSystem(t, opts{})
	api := s.startAPI()
	s.startWorker()
	system := strings.Repeat("You are the diagnosis assistant of a vehicle platform; answer with root cause and fix. ", 18)
	askSys := func(q string) map[string]any {
		b := ask(q)
		b["system"] = system
		return b
	}
	result := func(body map[string]any) map[string]any {
		id := api.submit(t, body)
		out := api.waitStatus(t, id, 20*time.Second, "completed")
		return out["result"].(map[string]any)
	}
	base := "Car VIN LSVAU2180N2183456 reported DTC P0A80 at 2026-11-30 08:15:22 after OTA 3.2.1; battery pack fault?"
	if r := result(askSys(base)); r["cached"] != "none" {
		t.Fatalf("first ask: %v", r)
	}
	waitCacheRows(t, api, 1) // stored once the caller has the answer
	near := "Car VIN LSVAU2180N2199999 reported DTC P0A80 at 2026-11-30 09:41:07 after OTA 3.2.1; battery pack fault?"
	r := result(askSys(near))
	// Served for the asked car: the stored answer quotes base's VIN, and
	// it comes back with near's (its timestamp is cut short, so it stays).
	want := strings.Replace(mockprovider.Reply(base), "LSVAU2180N2183456", "LSVAU2180N2199999", 1)
	if r["cached"] != "semantic" || r["content"] != want || r["similarity"].(float64) < 0.95 {
		t.Fatalf("near-duplicate: %v", r)
	}
	otherDTC := strings.Replace(near, "P0A80", "P0A7F", 1)
	if r := result(askSys(otherDTC)); r["cached"] != "none" || r["content"] != mockprovider.Reply(otherDTC) {
		t.Fatalf("another DTC got a cached answer: %v", r)
	}
	unrelated := "How do I reset the infotainment head unit language to English?"
	if r := result(askSys(unrelated)); r["cached"] != "none" || r["content"] != mockprovider.Reply(unrelated) {
		t.Fatalf("an unrelated question under the same system prompt hit: %v", r)
	}
	calls := s.mock.Stats().Total().OK
	bypass := askSys(base)
	bypass["cache_read"] = false
	if r := result(bypass); r["cached"] != "none" {
		t.Fatalf("cache_read=false still read the cache: %v", r)
	}
	if got := s.mock.Stats().Total().OK; got != calls+1 {
		t.Fatalf("bypass made %d provider calls", got-calls)
	}
}

// Prompts that differ only in a number are different questions, however
// alike their words: the lexical embedder scores these two 0.95.
func TestNumbersAreProtected(t *testing.T) {
	t.Parallel()
	s := newSystem(t, opts{})
	api := s.startAPI()
	s.startWorker()
	for _, q := range []string{"throughput request 7: why did the OTA update fail?", "throughput request 367: why did the OTA update fail?"} {
		id := api.submit(t, ask(q))
		out := api.waitStatus(t, id, 20*time.Second, "completed")
		if res := out["result"].(map[string]any); res["cached"] != "none" || res["content"] != mockprovider.Reply(q) {
			t.Fatalf("%q: %v", q, res)
		}
	}
}

// cache.embedder kind openai sends embeddings to any OpenAI-compatible
// endpoint — here the mock provider's — and the cache works the same.
func TestOpenAICompatibleEmbedder(t *testing.T) {
	t.Parallel()
	s := newSystem(t, opts{})
	s.cfg.Cache.Embedder = config.Embedder{Kind: "openai", BaseURL: s.mockTS.URL + "/v1", Model: "text-embedding-3-small",
		Dims: 256, APIKey: secret.New("mock-embedding-key")}
	api := s.startAPI()
	s.startWorker()
	q := "Car VIN LSVAU2180N2183456 reported U0100 at 2026-11-30 08:15:22: lost communication with the ECM?"
	id := api.submit(t, ask(q))
	api.waitStatus(t, id, 20*time.Second, "completed")
	// Embedded once for the lookup and the write together.
	if n := s.mock.Stats().Total().Embeddings; n != 1 {
		t.Fatalf("%d embedding calls for one request", n)
	}
	waitCacheRows(t, api, 1) // stored once the caller has the answer
	// An exact hit needs no embedding at all.
	out := api.waitStatus(t, api.submit(t, ask(q)), 20*time.Second, "completed")
	if res := out["result"].(map[string]any); res["cached"] != "exact" || s.mock.Stats().Total().Embeddings != 1 {
		t.Fatalf("exact repeat: %v, %d embedding calls", res["cached"], s.mock.Stats().Total().Embeddings)
	}
	near := strings.Replace(strings.Replace(q, "2183456", "2999999", 1), "08:15:22", "10:01:02", 1)
	out = api.waitStatus(t, api.submit(t, ask(near)), 20*time.Second, "completed")
	want := strings.Replace(mockprovider.Reply(q), "LSVAU2180N2183456", "LSVAU2180N2999999", 1) // the asked car's VIN
	if res := out["result"].(map[string]any); res["cached"] != "semantic" || res["content"] != want {
		t.Fatalf("near-duplicate with the OpenAI-compatible embedder: %v", res)
	}
	if st := s.mock.Stats().Total(); st.Embeddings != 2 {
		t.Fatalf("the embeddings endpoint was called %d times", st.Embeddings)
	}
	var embedder string
	if err := api.base.PG.QueryRow(context.Background(), "SELECT DISTINCT embedder FROM semantic_cache").Scan(&embedder); err != nil || !strings.HasPrefix(embedder, "openai-") {
		t.Fatalf("rows stored by embedder %q (%v)", embedder, err)
	}
}

// A cache hit answered to a compat call without an Idempotency-Key keeps
// no live record in Redis: the caller has the answer, and its id is found
// in history. With a key the hit is stored, so the key finds it again. A
// miss's record, once answered, is kept job.EndedEventsTTL without a key,
// server.result_ttl with one.
func TestCompatRecordLifetimes(t *testing.T) {
	t.Parallel()
	s := newSystem(t, opts{})
	api := s.startAPI()
	s.startWorker()
	chat := func(hdr ...string) (string, string, string) {
		t.Helper()
		code, out, h := call(t, "POST", api.ts.URL+"/v1/chat/completions", devToken,
			map[string]any{"model": "gpt-4o", "messages": []map[string]any{{"role": "user", "content": "what does DTC P0300 mean?"}}}, hdr...)
		if code != http.StatusOK {
			t.Fatalf("status %d: %v", code, out)
		}
		msg := out["choices"].([]any)[0].(map[string]any)["message"].(map[string]any)
		return h.Get("X-Bulwark-Request-Id"), h.Get("X-Bulwark-Cache"), msg["content"].(string)
	}
	want := mockprovider.Reply("what does DTC P0300 mean?")
	missID, cached, text := chat()
	if cached != "none" || text != want {
		t.Fatalf("first call: cache %q, %q", cached, text)
	}
	recordKey := func(id string) string { return s.cfg.Redis.Keyspace().Jobs() + "job:" + id }
	if ttl := api.base.Redis.TTL(t.Context(), recordKey(missID)).Val(); ttl <= 0 || ttl > job.EndedEventsTTL {
		t.Fatalf("the answered miss's record is kept %s, want at most %s", ttl, job.EndedEventsTTL)
	}
	waitCacheRows(t, api, 1) // stored once the caller has the answer
	id, cached, text := chat()
	if cached != "exact" || text != want {
		t.Fatalf("second call: cache %q, %q", cached, text)
	}
	if _, err := api.base.Jobs.StatusOf(t.Context(), id); !errors.Is(err, job.ErrNotFound) {
		t.Fatalf("the hit %s has a live record (%v)", id, err)
	}
	res := api.waitStatus(t, id, 10*time.Second, "completed") // from history, once its row is written
	if r := res["result"].(map[string]any); r["content"] != want || r["cached"] != "exact" {
		t.Fatalf("GET of the hit: %v", res)
	}

	keyed, cached, _ := chat("Idempotency-Key", "hit-key")
	if cached != "exact" {
		t.Fatalf("keyed call: cache %q", cached)
	}
	if st, err := api.base.Jobs.StatusOf(t.Context(), keyed); err != nil || st != job.StatusCompleted {
		t.Fatalf("the keyed hit's live record: %q %v", st, err)
	}
	if again, _, _ := chat("Idempotency-Key", "hit-key"); again != keyed {
		t.Fatalf("the same key answered request %s, then %s", keyed, again)
	}
	// A keyed miss keeps its record the result TTL, for its key.
	code, out, h := call(t, "POST", api.ts.URL+"/v1/chat/completions", devToken,
		map[string]any{"model": "gpt-4o", "messages": []map[string]any{{"role": "user", "content": "a keyed miss"}}},
		"Idempotency-Key", "miss-key")
	if code != http.StatusOK || h.Get("X-Bulwark-Cache") != "none" {
		t.Fatalf("keyed miss: %d %v", code, out)
	}
	if ttl := api.base.Redis.TTL(t.Context(), recordKey(h.Get("X-Bulwark-Request-Id"))).Val(); ttl <= job.EndedEventsTTL {
		t.Fatalf("the keyed miss's record is kept %s, want the result TTL (%s)", ttl, s.cfg.Server.ResultTTL)
	}
}
