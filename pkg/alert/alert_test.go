package alert

import (
	"bytes"
	"context"
	"crypto/hmac"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/redis/go-redis/v9"

	"bulwark/pkg/secret"
	"bulwark/pkg/testkit/testenv"
)

// request is one request a receiver got.
type request struct {
	query url.Values
	body  []byte
}

// receiver is a local webhook endpoint. reply decides the answer; by default
// the robots' {"errcode":0,"errmsg":"ok"}.
type receiver struct {
	srv  *httptest.Server
	got  chan request
	mu   sync.Mutex
	n    int
	hook func(w http.ResponseWriter, r *http.Request) bool // true: handled
}

func newReceiver(t *testing.T, hook func(w http.ResponseWriter, r *http.Request) bool) *receiver {
	t.Helper()
	rc := &receiver{got: make(chan request, 100), hook: hook}
	rc.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		rc.mu.Lock()
		rc.n++
		rc.mu.Unlock()
		rc.got <- request{query: r.URL.Query(), body: b}
		if rc.hook != nil && rc.hook(w, r) {
			return
		}
		io.WriteString(w, `{"errcode":0,"errmsg":"ok"}`)
	}))
	t.Cleanup(rc.srv.Close)
	return rc
}

func (rc *receiver) count() int {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return rc.n
}

// url returns the receiver's address with a token in the query, as robots
// have.
func (rc *receiver) url(token string) secret.String {
	return secret.New(rc.srv.URL + "/cgi-bin/webhook/send?key=" + token)
}

func (rc *receiver) next(t *testing.T) request {
	t.Helper()
	select {
	case r := <-rc.got:
		return r
	case <-time.After(5 * time.Second):
		t.Fatal("receiver got nothing")
		return request{}
	}
}

func newNotifier(t *testing.T, rdb Redis, cfg Config) *Notifier {
	t.Helper()
	n, err := New(rdb, cfg, nil, nil)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return n
}

var at = time.Date(2026, 3, 1, 8, 30, 0, 0, time.UTC)

func breakerOpen(subject string) Event {
	return Event{Kind: KindBreakerOpen, Subject: subject, Summary: "3 consecutive 429s", Details: map[string]string{"open_for": "60s"}, At: at}
}

func TestWeComBody(t *testing.T) {
	t.Parallel()
	rc := newReceiver(t, nil)
	n := newNotifier(t, nil, Config{WeCom: []Webhook{{URL: rc.url("tok")}}, Throttle: -1})
	if err := n.Notify(context.Background(), breakerOpen("claude/sonnet")); err != nil {
		t.Fatalf("Notify: %v", err)
	}
	var body struct {
		MsgType  string `json:"msgtype"`
		Markdown struct {
			Content string `json:"content"`
		} `json:"markdown"`
	}
	r := rc.next(t)
	if err := json.Unmarshal(r.body, &body); err != nil {
		t.Fatalf("body %s: %v", r.body, err)
	}
	if body.MsgType != "markdown" {
		t.Errorf("msgtype = %q, want markdown", body.MsgType)
	}
	for _, want := range []string{"熔断器打开", "严重", "claude/sonnet", "3 consecutive 429s", "- open_for: 60s", "2026-03-01 08:30:00 UTC"} {
		if !strings.Contains(body.Markdown.Content, want) {
			t.Errorf("content lacks %q:\n%s", want, body.Markdown.Content)
		}
	}
	if got := r.query["key"]; len(got) != 1 || got[0] != "tok" {
		t.Errorf("query key = %v, want the URL's own token", got)
	}
}

func TestDingTalkBodyAndSignature(t *testing.T) {
	t.Parallel()
	const sec = "SEC0123456789abcdef"
	signed := newReceiver(t, nil)
	plain := newReceiver(t, nil)
	n := newNotifier(t, nil, Config{
		DingTalk: []Webhook{
			{URL: secret.New(signed.srv.URL + "/robot/send?access_token=tok1"), Secret: secret.New(sec)},
			{URL: secret.New(plain.srv.URL + "/robot/send?access_token=tok2")},
		},
		Throttle: -1,
		Language: "en",
	})
	before := time.Now()
	if err := n.Notify(context.Background(), Event{Kind: KindTierExhausted, Subject: "openai/gpt4o", Summary: "all 3 keys cooling", At: at}); err != nil {
		t.Fatalf("Notify: %v", err)
	}

	r := signed.next(t)
	if got := r.query["access_token"]; len(got) != 1 || got[0] != "tok1" {
		t.Errorf("access_token = %v, want tok1 kept", got)
	}
	ts := r.query.Get("timestamp")
	ms, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		t.Fatalf("timestamp %q: %v", ts, err)
	}
	if d := time.UnixMilli(ms).Sub(before); d < -time.Second || d > 10*time.Second {
		t.Errorf("timestamp %s is %s from now", ts, d)
	}
	// Recompute per DingTalk's documentation.
	m := hmac.New(sha256New, []byte(sec))
	m.Write([]byte(ts + "\n" + sec))
	want := base64.StdEncoding.EncodeToString(m.Sum(nil))
	if got := r.query.Get("sign"); got != want {
		t.Errorf("sign = %q, want %q", got, want)
	}

	var body struct {
		MsgType  string `json:"msgtype"`
		Markdown struct {
			Title string `json:"title"`
			Text  string `json:"text"`
		} `json:"markdown"`
	}
	if err := json.Unmarshal(r.body, &body); err != nil {
		t.Fatalf("body %s: %v", r.body, err)
	}
	if body.MsgType != "markdown" {
		t.Errorf("msgtype = %q", body.MsgType)
	}
	if want := "[🔴 CRITICAL] Every key of the tier is cooling openai/gpt4o"; body.Markdown.Title != want {
		t.Errorf("title = %q, want %q", body.Markdown.Title, want)
	}
	if !strings.Contains(body.Markdown.Text, "all 3 keys cooling") || !strings.Contains(body.Markdown.Text, "openai/gpt4o") {
		t.Errorf("text lacks the facts:\n%s", body.Markdown.Text)
	}

	r = plain.next(t)
	if r.query.Has("sign") || r.query.Has("timestamp") {
		t.Errorf("unsigned robot got sign/timestamp: %v", r.query)
	}
}

func TestGenericBody(t *testing.T) {
	t.Parallel()
	rc := newReceiver(t, func(w http.ResponseWriter, r *http.Request) bool {
		w.WriteHeader(http.StatusNoContent) // any 2xx, no robot reply
		return true
	})
	n := newNotifier(t, nil, Config{Generic: []Webhook{{URL: rc.url("x")}}, Throttle: -1})
	e := Event{Kind: KindKeyQuotaExhausted, Subject: "openai-key-2", Summary: "insufficient_quota", Details: map[string]string{"provider": "openai"}, At: at}
	if err := n.Notify(context.Background(), e); err != nil {
		t.Fatalf("Notify: %v", err)
	}
	var got GenericPayload
	if err := json.Unmarshal(rc.next(t).body, &got); err != nil {
		t.Fatal(err)
	}
	want := e
	want.Severity = SeverityWarning // the kind's default, filled in
	if diff := cmp.Diff(want, got.Event); diff != "" {
		t.Errorf("event (-want +got):\n%s", diff)
	}
	if !strings.Contains(got.Text, "Key 额度耗尽") {
		t.Errorf("text = %q", got.Text)
	}
}

// TestThrottle runs two Notifiers with their own Redis clients, as two
// worker processes would.
func TestThrottle(t *testing.T) {
	t.Parallel()
	opt := testenv.RedisOptions(t)
	r1, r2 := redis.NewClient(opt), redis.NewClient(opt)
	t.Cleanup(func() { r1.Close(); r2.Close() })
	rc := newReceiver(t, nil)
	cfg := Config{WeCom: []Webhook{{URL: rc.url("t")}}, Prefix: "test:"}
	n1, n2 := newNotifier(t, r1, cfg), newNotifier(t, r2, cfg)
	ctx := context.Background()

	steps := []struct {
		name  string
		n     *Notifier
		e     Event
		total int // receiver count after the step
	}{
		{"first alert is sent", n1, breakerOpen("claude/sonnet"), 1},
		{"same alert from another process is throttled", n2, breakerOpen("claude/sonnet"), 1},
		{"same alert again from the first", n1, breakerOpen("claude/sonnet"), 1},
		{"other subject is sent", n2, breakerOpen("openai/gpt4o"), 2},
		{"recovery is not throttled by its failure", n2, Event{Kind: KindBreakerClosed, Subject: "claude/sonnet"}, 3},
		{"recovery is throttled on its own", n1, Event{Kind: KindBreakerClosed, Subject: "claude/sonnet"}, 3},
		{"failure after recovery within the window stays throttled", n1, breakerOpen("claude/sonnet"), 3},
		{"daily report is never throttled", n1, Event{Kind: KindDailyReport, Subject: "2026-03-01", Summary: "# r"}, 4},
		{"daily report again", n2, Event{Kind: KindDailyReport, Subject: "2026-03-01", Summary: "# r"}, 5},
	}
	for _, s := range steps {
		if err := s.n.Notify(ctx, s.e); err != nil {
			t.Fatalf("%s: Notify: %v", s.name, err)
		}
		// Notify returns after its sends finished: the count is final.
		if got := rc.count(); got != s.total {
			t.Fatalf("%s: receiver has %d, want %d", s.name, got, s.total)
		}
	}
	ttl, err := r1.PTTL(ctx, throttleKey("test:", KindBreakerOpen, "claude/sonnet")).Result()
	if err != nil || ttl <= ThrottleDefault-time.Minute || ttl > ThrottleDefault {
		t.Fatalf("throttle key TTL = %s, %v; want about %s", ttl, err, ThrottleDefault)
	}
}

// TestThrottleWindowEnds uses a short Throttle and waits for its key to
// expire (an event Redis reports), not a sleep of a guessed length.
func TestThrottleWindowEnds(t *testing.T) {
	t.Parallel()
	rdb := testenv.Redis(t)
	rc := newReceiver(t, nil)
	n := newNotifier(t, rdb, Config{WeCom: []Webhook{{URL: rc.url("t")}}, Throttle: 50 * time.Millisecond})
	ctx := context.Background()
	if err := n.Notify(ctx, breakerOpen("b")); err != nil {
		t.Fatal(err)
	}
	key := throttleKey(PrefixDefault, KindBreakerOpen, "b")
	for deadline := time.Now().Add(5 * time.Second); ; {
		if rdb.Exists(ctx, key).Val() == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("throttle key never expired")
		}
		time.Sleep(10 * time.Millisecond) // polling Redis for the expiry
	}
	if err := n.Notify(ctx, breakerOpen("b")); err != nil {
		t.Fatal(err)
	}
	if got := rc.count(); got != 2 {
		t.Fatalf("receiver has %d, want 2 after the window", got)
	}
}

func TestAllSinksFailReleasesThrottle(t *testing.T) {
	t.Parallel()
	rdb := testenv.Redis(t)
	var mu sync.Mutex
	fail := true
	rc := newReceiver(t, func(w http.ResponseWriter, r *http.Request) bool {
		mu.Lock()
		defer mu.Unlock()
		if fail {
			w.WriteHeader(http.StatusBadGateway)
			return true
		}
		return false
	})
	n := newNotifier(t, rdb, Config{WeCom: []Webhook{{URL: rc.url("t")}}})
	ctx := context.Background()
	if err := n.Notify(ctx, breakerOpen("b")); err == nil || !strings.Contains(err.Error(), "HTTP 502") {
		t.Fatalf("Notify = %v, want HTTP 502", err)
	}
	mu.Lock()
	fail = false
	mu.Unlock()
	if err := n.Notify(ctx, breakerOpen("b")); err != nil {
		t.Fatalf("retry: %v", err)
	}
	if err := n.Notify(ctx, breakerOpen("b")); err != nil {
		t.Fatal(err)
	}
	if got := rc.count(); got != 2 {
		t.Fatalf("receiver has %d, want 2 (failed, retried; then throttled)", got)
	}
}

func TestFailingSinkDoesNotBlockOthers(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	var once sync.Once
	unblock := func() { once.Do(func() { close(release) }) }
	hang := newReceiver(t, func(w http.ResponseWriter, r *http.Request) bool {
		<-release
		w.WriteHeader(http.StatusServiceUnavailable)
		return true
	})
	t.Cleanup(unblock) // runs before hang's server closes (cleanups are LIFO)
	broken := newReceiver(t, func(w http.ResponseWriter, r *http.Request) bool {
		io.WriteString(w, `{"errcode":45009,"errmsg":"api freq out of limit"}`)
		return true
	})
	good := newReceiver(t, nil)
	n := newNotifier(t, testenv.Redis(t), Config{
		WeCom:   []Webhook{{Name: "hang", URL: hang.url("a")}, {Name: "broken", URL: broken.url("b")}},
		Generic: []Webhook{{Name: "good", URL: good.url("c")}},
		Timeout: time.Minute,
	})
	done := make(chan error, 1)
	go func() { done <- n.Notify(context.Background(), breakerOpen("b")) }()
	// The others are served while the first sink still holds its request:
	// the sinks run concurrently.
	hang.next(t)
	good.next(t)
	broken.next(t)
	select {
	case err := <-done:
		t.Fatalf("Notify returned before the hanging sink ended: %v", err)
	default:
	}
	unblock()
	err := <-done
	if err == nil {
		t.Fatal("Notify = nil, want the failing sinks' errors")
	}
	for _, want := range []string{"sink hang: HTTP 503", "sink broken: errcode 45009: api freq out of limit"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q: %v", want, err)
		}
	}
	if strings.Contains(err.Error(), "sink good") {
		t.Errorf("good sink reported failing: %v", err)
	}
}

func TestCallerCancel(t *testing.T) {
	t.Parallel()
	hang := newReceiver(t, func(w http.ResponseWriter, r *http.Request) bool {
		<-r.Context().Done()
		return true
	})
	n := newNotifier(t, nil, Config{Generic: []Webhook{{Name: "hang", URL: hang.url("a")}}, Throttle: -1, Timeout: time.Minute})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- n.Notify(ctx, breakerOpen("b")) }()
	hang.next(t)
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "sink hang") {
		t.Fatalf("Notify = %v, want context.Canceled from sink hang", err)
	}
}

func TestSinkTimeout(t *testing.T) {
	t.Parallel()
	hang := newReceiver(t, func(w http.ResponseWriter, r *http.Request) bool {
		<-r.Context().Done()
		return true
	})
	good := newReceiver(t, nil)
	n := newNotifier(t, nil, Config{
		DingTalk: []Webhook{{URL: hang.url("a")}, {URL: good.url("b")}},
		Throttle: -1,
		Timeout:  100 * time.Millisecond,
	})
	start := time.Now()
	err := n.Notify(context.Background(), breakerOpen("b"))
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Notify = %v, want a deadline error", err)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("Notify took %s with a 100ms sink timeout", d)
	}
	if good.count() != 1 {
		t.Errorf("good sink got %d requests, want 1", good.count())
	}
}

func TestSecretsNeverInErrorsOrLogs(t *testing.T) {
	t.Parallel()
	const token = "tok-5f2c9a1e7b3d4c8a"
	const signSecret = "SECd4e5f6a7b8c9d0e1f2a3b4"

	// A port nobody listens on: connection refused.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := "http://" + l.Addr().String()
	l.Close()

	echoURL := newReceiver(t, func(w http.ResponseWriter, r *http.Request) bool {
		w.WriteHeader(http.StatusBadRequest)
		io.WriteString(w, "bad request to "+r.URL.String()) // echoes token, sign, timestamp
		return true
	})
	echoErrmsg := newReceiver(t, func(w http.ResponseWriter, r *http.Request) bool {
		io.WriteString(w, `{"errcode":93000,"errmsg":"invalid webhook url, key=`+r.URL.Query().Get("key")+`"}`)
		return true
	})
	hang := newReceiver(t, func(w http.ResponseWriter, r *http.Request) bool {
		<-r.Context().Done()
		return true
	})

	cases := []struct {
		name string
		cfg  Config
	}{
		{"connection refused", Config{WeCom: []Webhook{{URL: secret.New(dead + "/send?key=" + token)}}}},
		{"timeout", Config{Generic: []Webhook{{URL: secret.New(hang.srv.URL + "/hook/" + token)}}, Timeout: 50 * time.Millisecond}},
		{"server echoes the URL", Config{DingTalk: []Webhook{{URL: secret.New(echoURL.srv.URL + "/robot/send?access_token=" + token), Secret: secret.New(signSecret)}}}},
		{"robot echoes the key", Config{WeCom: []Webhook{{URL: secret.New(echoErrmsg.srv.URL + "/send?key=" + token)}}}},
		{"generic path token echoed", Config{Generic: []Webhook{{URL: secret.New(echoURL.srv.URL + "/hooks/" + token)}}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			var logs bytes.Buffer
			c.cfg.Throttle = -1
			n, err := New(nil, c.cfg, nil, slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})))
			if err != nil {
				t.Fatal(err)
			}
			err = n.Notify(context.Background(), breakerOpen("b"))
			if err == nil {
				t.Fatal("Notify = nil, want an error")
			}
			for _, s := range []string{token, signSecret} {
				if strings.Contains(err.Error(), s) {
					t.Errorf("error leaks %q: %v", s, err)
				}
				if strings.Contains(logs.String(), s) {
					t.Errorf("log leaks %q: %s", s, logs.String())
				}
			}
			if logs.Len() == 0 {
				t.Error("the failure was not logged")
			}
		})
	}

	t.Run("invalid URL in config", func(t *testing.T) {
		t.Parallel()
		_, err := New(nil, Config{WeCom: []Webhook{{URL: secret.New("qyapi.weixin.qq.com/send?key=" + token + "%zz")}}, Throttle: -1}, nil, nil)
		if err == nil || strings.Contains(err.Error(), token) || !strings.Contains(err.Error(), "WeCom[0].URL") {
			t.Fatalf("New = %v, want a WeCom[0].URL error without the token", err)
		}
	})
}

// TestRedisDownSendsAnyway: an alert path must not go silent because Redis
// is unreachable.
func TestRedisDownSendsAnyway(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	rdb := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialTimeout: 200 * time.Millisecond})
	t.Cleanup(func() { rdb.Close() })
	rc := newReceiver(t, nil)
	n := newNotifier(t, rdb, Config{WeCom: []Webhook{{URL: rc.url("t")}}})
	if err := n.Notify(context.Background(), breakerOpen("b")); err != nil {
		t.Fatalf("Notify: %v", err)
	}
	if rc.count() != 1 {
		t.Fatalf("receiver has %d, want 1", rc.count())
	}
}

func TestInvalidEvent(t *testing.T) {
	t.Parallel()
	n := newNotifier(t, nil, Config{Throttle: -1})
	for _, e := range []Event{{Subject: "x"}, {Kind: KindGeneric, Severity: "fatal"}} {
		if err := n.Notify(context.Background(), e); !errors.Is(err, ErrInvalidEvent) {
			t.Errorf("Notify(%+v) = %v, want ErrInvalidEvent", e, err)
		}
	}
	// No sinks: a valid event is a no-op.
	if err := n.Notify(context.Background(), breakerOpen("b")); err != nil {
		t.Errorf("Notify without sinks = %v", err)
	}
}

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	ok := secret.New("https://qyapi.weixin.qq.com/cgi-bin/webhook/send?key=k")
	cases := []struct {
		name string
		rdb  bool
		cfg  Config
		want string // substring of the error; "" = valid
	}{
		{"defaults", true, Config{}, ""},
		{"no redis without throttle", false, Config{Throttle: -1}, ""},
		{"no redis with throttle", false, Config{}, "Redis client is required"},
		{"negative timeout", true, Config{Timeout: -time.Second}, "Timeout"},
		{"unknown language", true, Config{Language: "fr"}, "Language"},
		{"relative URL", true, Config{DingTalk: []Webhook{{URL: secret.New("/robot/send")}}}, "DingTalk[0].URL"},
		{"ftp URL", true, Config{Generic: []Webhook{{URL: ok}, {URL: secret.New("ftp://h/x")}}}, "Generic[1].URL"},
		{"secret on wecom", true, Config{WeCom: []Webhook{{URL: ok, Secret: secret.New("SECx")}}}, "WeCom[0].Secret"},
		{"secret on dingtalk", true, Config{DingTalk: []Webhook{{URL: ok, Secret: secret.New("SECx")}}, Language: "en-US"}, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			var rdb Redis
			if c.rdb {
				c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}) // never dialled by New
				t.Cleanup(func() { c.Close() })
				rdb = c
			}
			_, err := New(rdb, c.cfg, nil, nil)
			switch {
			case c.want == "" && err != nil:
				t.Fatalf("New = %v, want nil", err)
			case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
				t.Fatalf("New = %v, want an error containing %q", err, c.want)
			}
		})
	}
}
