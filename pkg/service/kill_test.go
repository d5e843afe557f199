package service_test

import (
	"bufio"
	"context"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"bulwark/pkg/testkit/mockprovider"
)

// A worker process killed with SIGKILL in the middle of a provider call
// loses nothing: once its task's lease has expired (asynq: 30 s) and the
// recoverer's 30 s grace for clock skew has passed, another worker takes
// the request over and completes it. About 65 s, in parallel with the rest.
func TestWorkerKilledMidCallLosesNothing(t *testing.T) {
	if testing.Short() {
		t.Skip("waits out asynq's 30 s task lease")
	}
	t.Parallel()
	s := newSystem(t, opts{extraYML: "cache: {enabled: false}", mock: mockprovider.Config{Latency: time.Minute}})
	api := s.startAPI()
	proc := startWorkerProcess(t, s)

	id := api.submit(t, ask("survive a dead worker"))
	ch, _ := stream(t, api.ts.URL+"/v1/requests/"+id+"/events", devToken, "")
	next(t, ch, 30*time.Second, "started") // the provider call now hangs for a minute
	if err := proc.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = proc.Wait()
	s.mock.SetLatency(0)

	// Wait until asynq's recoverer will treat the lease as expired: its
	// score (a Unix time) plus 30 s of grace for clock skew.
	rdb := redis.NewClient(s.redis)
	defer rdb.Close()
	waitFor(t, 75*time.Second, "the dead worker's task lease to expire", func() bool {
		score, err := rdb.ZScore(context.Background(), "asynq:{normal}:lease", id).Result()
		return err == nil && int64(score) < time.Now().Add(-30*time.Second).Unix()
	})
	s.startWorker() // recovers expired leases as it starts
	ev := next(t, ch, 15*time.Second, "completed", "failed")
	if ev.Type != "completed" || ev.Data["result"].(map[string]any)["content"] != mockprovider.Reply("survive a dead worker") {
		t.Fatalf("after the worker died: %s %v", ev.Type, ev.Data)
	}
	out := api.waitStatus(t, id, time.Second, "completed")
	if n := int(out["attempts"].(float64)); n < 2 {
		t.Fatalf("attempts %s, want the second worker's attempt counted", strconv.Itoa(n))
	}
}

// A worker process killed with SIGKILL while it streams an answer: the
// caller keeps what it got, and once another worker takes the task over it
// ends the request as stream_interrupted instead of calling again (a
// second answer would not continue the first): the caller's stream ends
// with the dialect's error, the provider was called once. About 65 s, in
// parallel with the rest (asynq's lease, as above).
func TestWorkerKilledMidStream(t *testing.T) {
	if testing.Short() {
		t.Skip("waits out asynq's 30 s task lease")
	}
	t.Parallel()
	s := newSystem(t, opts{extraYML: "cache: {enabled: false}", mock: mockprovider.Config{
		StreamFirstToken: 50 * time.Millisecond, StreamChunkInterval: 2 * time.Second, StreamChunkTokens: 1}})
	s.cfg.Server.SyncTimeout = 3 * time.Minute
	s.cfg.Server.StreamKeepAlive = time.Second
	api := s.startAPI()
	proc := startWorkerProcess(t, s)

	body := `{"model":"gpt-4o","stream":true,"messages":[{"role":"user","content":"a stream cut by a dead worker"}]}`
	req, err := http.NewRequest("POST", api.ts.URL+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+devToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	id := resp.Header.Get("X-Bulwark-Request-Id")
	lines := bufio.NewScanner(resp.Body)
	var got strings.Builder
	for lines.Scan() && !strings.Contains(lines.Text(), `"content":"m`) { // the answer's first token
		got.WriteString(lines.Text() + "\n")
	}
	if err := proc.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = proc.Wait()

	rdb := redis.NewClient(s.redis)
	defer rdb.Close()
	waitFor(t, 75*time.Second, "the dead worker's task lease to expire", func() bool {
		score, err := rdb.ZScore(context.Background(), "asynq:{normal}:lease", id).Result()
		return err == nil && int64(score) < time.Now().Add(-30*time.Second).Unix()
	})
	s.startWorker()
	var rest strings.Builder
	for lines.Scan() {
		rest.WriteString(lines.Text() + "\n")
	}
	if !strings.Contains(rest.String(), `"code":"stream_interrupted"`) || strings.Contains(rest.String(), "[DONE]") {
		t.Fatalf("after the first token (%s), the stream went on:\n%s", got.String(), rest.String())
	}
	out := api.waitStatus(t, id, 10*time.Second, "failed")
	if e, _ := out["error"].(string); !strings.HasPrefix(e, "stream_interrupted: ") {
		t.Fatalf("record %v", out)
	}
	if n := s.mock.Stats().Providers["openai"].Requests; n != 1 {
		t.Fatalf("the provider was called %d times, want once", n)
	}
}

// startWorkerProcess runs the worker program on s's configuration as an
// OS process, killed at cleanup.
func startWorkerProcess(t *testing.T, s *system) *exec.Cmd {
	t.Helper()
	dir := t.TempDir()
	bin := filepath.Join(dir, "worker")
	if out, err := exec.Command("go", "build", "-o", bin, "bulwark/worker").CombinedOutput(); err != nil {
		t.Fatalf("build worker: %v\n%s", err, out)
	}
	cfgFile := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(cfgFile, []byte(s.doc), 0o600); err != nil {
		t.Fatal(err)
	}
	proc := exec.Command(bin)
	proc.Env = append(os.Environ(), "BULWARK_CONFIG="+cfgFile)
	if err := proc.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = proc.Process.Kill(); _ = proc.Wait() })
	return proc
}
