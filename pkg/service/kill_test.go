package service_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
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
