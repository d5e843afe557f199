package storm

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"bulwark/pkg/job"
)

// The api's test-only failpoint (service.FailpointEnv, named here rather
// than imported: the processes are driven through their environment, as
// an operator would): with failpointStoreEnqueue the api process exits
// with failpointExitCode right after it stored a request and before it
// enqueued its task.
const (
	failpointEnv          = "BULWARK_FAILPOINT"
	failpointStoreEnqueue = "intake-after-store"
	failpointExitCode     = 3
)

// storeCrash is one api process dying between storing a request and
// enqueueing it.
type storeCrash struct {
	req      int       // the request's index
	at       time.Time // when its connection dropped
	storedID string    // the id its idempotency key names in Redis
	problems []string  // how the crash itself went wrong
}

// TestFaultStoreEnqueueCrash: five times, an api process started with the
// failpoint BULWARK_FAILPOINT=intake-after-store takes one request (with
// an Idempotency-Key) and exits after storing it and before enqueueing
// its task, the client's connection dropping. The client sends it again,
// with the same key, to the api that stays up, and four other requests
// follow. The retry must get the stored request back (same id), and the
// workers' orphan sweep (every 5 s, for records 10 s old) must enqueue
// it: it completes with its own prompt's answer within 30 s of the crash,
// its prompt called once. Recovery: from the crash to the request's end.
func TestFaultStoreEnqueueCrash(t *testing.T) {
	t.Parallel()
	const crashes, normalPer, recoverWithin = 5, 4, 30 * time.Second
	sc := faultScenario("F-store-enqueue-crash", crashes*(1+normalPer), 300*time.Millisecond, 100*time.Millisecond)
	f := setupFault(t, sc, options{Workers: 2}, 0)
	ctx := t.Context()
	rdb := redis.NewClient(&redis.Options{Addr: f.sys.redisAddr})
	defer func() { _ = rdb.Close() }()

	f.begin(ctx, 120*time.Second)
	var done []storeCrash
	for k := range crashes {
		i := k * (1 + normalPer)
		c := f.crashAPI(ctx, rdb, k+1, i)
		done = append(done, c)
		// The client resubmits what it got no answer to, as it would
		// after any dropped connection.
		f.launch(i, func(ctx context.Context, i int) {
			f.async(ctx, i)
			f.markEnd(i)
		})
		for j := 1; j <= normalPer; j++ {
			f.launch(i+j, f.one)
		}
	}
	f.launched()
	cut := f.wait(ctx)
	f.verify(verifyCtx(t))

	res, problems := f.result(t.Name(), nil)
	res.RecoveryWhat = "crash→its request ended"
	calls := map[string]int{}
	for _, c := range f.calls.snapshot() {
		calls[c.Prompt]++
	}
	sameID, swept := 0, 0
	var perPrompt []string
	for n, c := range done {
		r := &f.reqs[c.req]
		problems = append(problems, c.problems...)
		prompt := f.d.prompts[c.req]
		perPrompt = append(perPrompt, fmt.Sprint(calls[prompt]))
		switch {
		case c.storedID == "":
		case r.id != c.storedID:
			problems = append(problems, fmt.Sprintf("crash %d: the retry with the same Idempotency-Key got request %q, "+
				"not the stored %s", n+1, r.id, c.storedID))
		default:
			sameID++
		}
		if calls[prompt] != 1 {
			problems = append(problems, fmt.Sprintf("crash %d: request %s's prompt reached the provider %d times, want once",
				n+1, r.id, calls[prompt]))
		}
		if r.id != "" && f.sweptLogged(r.id) {
			swept++
		}
		rec := r.endAt.Sub(c.at)
		switch {
		case r.endAt.IsZero():
			problems = append(problems, fmt.Sprintf("crash %d: request %s never ended", n+1, r.id))
		case r.final.Status != job.StatusCompleted:
			problems = append(problems, fmt.Sprintf("crash %d: request %s ended %s (%s), want completed", n+1, r.id,
				r.final.Status, r.final.Error))
		case rec > recoverWithin:
			problems = append(problems, fmt.Sprintf("crash %d: request %s completed %.1fs after the crash, want within %s",
				n+1, r.id, rec.Seconds(), recoverWithin))
			res.Recovery = append(res.Recovery, rec)
		default:
			res.Recovery = append(res.Recovery, rec)
		}
		ended := "never ended"
		if !r.endAt.IsZero() {
			ended = fmt.Sprintf("ended %.1fs after the crash (%s)", rec.Seconds(), r.final.Status)
		}
		t.Logf("crash %d: request %d %s at +%.1fs, stored as %s, %s, its prompt called %d times",
			n+1, c.req, r.id, c.at.Sub(f.began).Seconds(), c.storedID, ended, calls[prompt])
	}
	res.Notes = fmt.Sprintf("crashes=%d same_id_on_retry=%d/%d calls_per_crashed_prompt=%s sweep_logged=%d/%d",
		len(done), sameID, len(done), strings.Join(perPrompt, ","), swept, len(done))
	if len(done) < crashes {
		problems = append(problems, fmt.Sprintf("only %d of %d crashes", len(done), crashes))
	}
	if cut != nil {
		problems = append(problems, fmt.Sprintf("the load was cut: %v", cut))
	}
	finish(t, f, res, problems)
}

// crashAPI starts api process n with the failpoint, sends it request i
// and waits for it to exit, then reads which request the idempotency key
// names in Redis.
func (f *faultRun) crashAPI(ctx context.Context, rdb *redis.Client, n, i int) storeCrash {
	c := storeCrash{req: i}
	fail := func(format string, args ...any) storeCrash {
		c.problems = append(c.problems, fmt.Sprintf("crash %d: ", n)+fmt.Sprintf(format, args...))
		return c
	}
	p, url, err := f.sys.startAPI(fmt.Sprintf("api-failpoint-%d", n), []string{failpointEnv + "=" + failpointStoreEnqueue}, nil)
	if err != nil {
		return fail("%v", err)
	}
	defer p.stop() // only if it did not exit as it should
	rctx, cancel := context.WithTimeout(ctx, readyTimeout)
	err = waitReady(rctx, p, "GET /readyz", httpOK(f.client, url+"/readyz"))
	cancel()
	if err != nil {
		return fail("%v", err)
	}

	r := &f.reqs[i]
	r.o = outcome{sent: true, sentAt: time.Now()}
	r.submits++
	d := *f.d
	d.apiURL = url
	body := map[string]any{"provider": "openai", "model_tier": "gpt4o-mini", "priority": "normal",
		"max_tokens": MaxTokens, "messages": messages(d.prompts[i])}
	code, _, raw, err := d.send(ctx, http.MethodPost, "/v1/requests", body,
		map[string]string{"Accept-Language": "en", "Idempotency-Key": f.idempotencyKey(i)})
	c.at = time.Now()
	if err == nil {
		return fail("the failpoint api answered HTTP %d %s instead of exiting", code, strings.TrimSpace(string(raw)))
	}

	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		return fail("the failpoint api's connection dropped (%v) but the process did not exit", err)
	}
	var exit *exec.ExitError
	if !errors.As(p.exitErr, &exit) || exit.ExitCode() != failpointExitCode {
		return fail("the failpoint api exited with %v, want status %d", p.exitErr, failpointExitCode)
	}
	key := "bulwark:{job}:idem:storm:" + f.idempotencyKey(i) // pkg/job: <prefix>{job}:idem:<tenant>:<key>
	c.storedID, err = rdb.Get(ctx, key).Result()
	if err != nil {
		return fail("the failpoint api exited, but its idempotency key %s is not in Redis: %v (nothing was stored?)", key, err)
	}
	return c
}

// sweptLogged reports whether a worker logged re-enqueueing id as a
// request without a task (pkg/maintenance).
func (f *faultRun) sweptLogged(id string) bool {
	for _, l := range f.logLines(id, 50) {
		if strings.HasPrefix(l, "worker-") && strings.Contains(l, "had no task") {
			return true
		}
	}
	return false
}
