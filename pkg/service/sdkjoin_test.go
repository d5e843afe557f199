package service_test

import (
	"context"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	aoption "github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/openai/openai-go/v3"
	ooption "github.com/openai/openai-go/v3/option"

	"bulwark/pkg/testkit/mockprovider"
)

// attempts records what each HTTP attempt of an SDK call got back: an SDK
// middleware sees every retry.
type attempts struct {
	mu     sync.Mutex
	status []int    // -1: no answer (the SDK's own timeout cut it)
	ids    []string // X-Bulwark-Request-Id
}

func (a *attempts) middleware(req *http.Request, next func(*http.Request) (*http.Response, error)) (*http.Response, error) {
	resp, err := next(req)
	a.mu.Lock()
	defer a.mu.Unlock()
	if err != nil || resp == nil {
		a.status, a.ids = append(a.status, -1), append(a.ids, "")
		return resp, err
	}
	a.status, a.ids = append(a.status, resp.StatusCode), append(a.ids, resp.Header.Get("X-Bulwark-Request-Id"))
	return resp, err
}

func (a *attempts) get() ([]int, []string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]int(nil), a.status...), append([]string(nil), a.ids...)
}

// The official SDKs at their default retry settings (two retries): a call
// whose first attempt is cut short — Bulwark's 429 still_queued past
// sync_timeout, or the SDK's own per-request timeout — is retried, and the
// retry joins the first request, whatever the cache settings: the SDK gets
// the answer, the provider is called once, and history holds one request.
func TestSDKRetriesJoinTheirRequest(t *testing.T) {
	t.Parallel()
	const latency = 2 * time.Second // the provider's; the first attempt gives up before it
	for _, tc := range []struct {
		name   string
		sdk    string
		bypass bool
		// sdkTimeout cuts the first attempt with the SDK's own per-request
		// timeout (anthropic-sdk-go retries it; openai-go does not);
		// otherwise Bulwark's sync_timeout does, with a 429 still_queued.
		sdkTimeout bool
	}{
		{"openai cache on", "openai", false, false},
		{"openai cache bypassed", "openai", true, false},
		{"anthropic cache on", "anthropic", false, false},
		{"anthropic cache bypassed", "anthropic", true, false},
		{"anthropic own timeout cache bypassed", "anthropic", true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := newSystem(t, opts{mock: mockprovider.Config{Latency: latency}})
			if !tc.sdkTimeout {
				s.cfg.Server.SyncTimeout = 1500 * time.Millisecond
			}
			api := s.startAPI()
			s.startWorker()
			prompt := "why did OTA batch 42 fail? (" + tc.name + ")"
			var hdr []string
			if tc.bypass {
				hdr = []string{"X-Bulwark-Cache", "bypass"}
			}
			rec := &attempts{}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()

			var got string
			var err error
			switch tc.sdk {
			case "openai":
				opts := []ooption.RequestOption{ooption.WithAPIKey(devToken), ooption.WithBaseURL(api.ts.URL + "/v1/"),
					ooption.WithMiddleware(rec.middleware)}
				for i := 0; i+1 < len(hdr); i += 2 {
					opts = append(opts, ooption.WithHeader(hdr[i], hdr[i+1]))
				}
				c := openai.NewClient(opts...) // default retries
				var resp *openai.ChatCompletion
				resp, err = c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "gpt-4o",
					Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage(prompt)}})
				if err == nil {
					got = resp.Choices[0].Message.Content
				}
			case "anthropic":
				opts := []aoption.RequestOption{aoption.WithAPIKey(devToken), aoption.WithBaseURL(api.ts.URL),
					aoption.WithMiddleware(rec.middleware)}
				for i := 0; i+1 < len(hdr); i += 2 {
					opts = append(opts, aoption.WithHeader(hdr[i], hdr[i+1]))
				}
				c := anthropic.NewClient(opts...) // default retries
				var call []aoption.RequestOption
				if tc.sdkTimeout {
					call = append(call, aoption.WithRequestTimeout(1500*time.Millisecond))
				}
				var msg *anthropic.Message
				msg, err = c.Messages.New(ctx, anthropic.MessageNewParams{Model: "claude-sonnet", MaxTokens: 300,
					Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock(prompt))}}, call...)
				if err == nil {
					got = msg.Content[0].Text
				}
			}
			status, ids := rec.get()
			if err != nil || got != mockprovider.Reply(prompt) {
				t.Fatalf("SDK call: %v, answer %q; attempts %v %v", err, got, status, ids)
			}
			first := 429
			if tc.sdkTimeout {
				first = -1
			}
			if len(status) < 2 || status[0] != first || status[len(status)-1] != http.StatusOK {
				t.Fatalf("attempts %v, want a first one cut short (%d), retried to a 200", status, first)
			}
			id := ids[len(ids)-1]
			for i, other := range ids {
				if other != "" && other != id {
					t.Fatalf("attempt %d was request %s, the answer request %s: the retry did not join (%v)", i, other, id, ids)
				}
			}
			if st := s.mock.Stats().Total(); st.OK-st.Embeddings != 1 {
				t.Fatalf("%d provider calls for one SDK call, want 1", st.OK-st.Embeddings)
			}
			waitFor(t, 10*time.Second, "the history row to be final", func() bool {
				var status string
				err := api.base.PG.QueryRow(ctx, "SELECT status FROM requests WHERE id = $1", id).Scan(&status)
				return err == nil && status == "completed"
			})
			var rows int
			if err := api.base.PG.QueryRow(ctx, "SELECT count(*) FROM requests").Scan(&rows); err != nil || rows != 1 {
				t.Fatalf("history holds %d requests (%v), want 1", rows, err)
			}
		})
	}
}

// A full queue's Retry-After is the measured wait until there is room: a
// slow provider behind one worker slot drains a request every 3 s, and the
// refusal says seconds, not the 1 s the keys' capacity suggested (which an
// SDK honouring it spent its retries on). Retry-After-Ms carries the same
// wait unrounded.
func TestQueueFullRetryAfterIsMeasured(t *testing.T) {
	t.Parallel()
	s := newSystem(t, opts{extraYML: "cache: {enabled: false}\nqueue: {queue_max_depth: 20}",
		mock: mockprovider.Config{Latency: 3 * time.Second}})
	s.cfg.Worker.Concurrency = 1 // one call at a time: a drain of one request per 3 s
	api := s.startAPI()
	s.startWorker()
	// Three requests in turn: the third starts once two calls have ended,
	// and the queue has measured three starts over about 6 s.
	var ids []string
	for i := range 3 {
		ids = append(ids, api.submit(t, ask("warm "+strconv.Itoa(i))))
	}
	api.waitStatus(t, ids[2], 20*time.Second, "running")
	api.submitMany(t, 20, "fill", nil) // the queue holds its 20
	for _, path := range []string{"/v1/requests", "/v1/chat/completions"} {
		body := any(ask("one too many"))
		if path != "/v1/requests" {
			body = map[string]any{"model": "gpt-4o", "messages": []map[string]any{{"role": "user", "content": "one too many"}}}
		}
		code, out, hdr := call(t, "POST", api.ts.URL+path, devToken, body)
		if code != http.StatusTooManyRequests {
			t.Fatalf("%s: status %d, want 429 queue_full: %v", path, code, out)
		}
		secs, err1 := strconv.Atoi(hdr.Get("Retry-After"))
		ms, err2 := strconv.Atoi(hdr.Get("Retry-After-Ms"))
		// Room for a tenth of the queue (2 requests) comes in about 6 s; the
		// model of the measured drain says 3–5 s.
		if err1 != nil || err2 != nil || ms < 2500 || ms > 20_000 || secs != (ms+999)/1000 {
			t.Fatalf("%s: Retry-After %q, Retry-After-Ms %q: want the measured wait, seconds", path,
				hdr.Get("Retry-After"), hdr.Get("Retry-After-Ms"))
		}
	}
}
