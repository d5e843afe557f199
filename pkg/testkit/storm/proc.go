package storm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"bulwark/pkg/testkit/ports"
)

// stopGrace is how long a process has between SIGTERM and SIGKILL.
const stopGrace = 10 * time.Second

// process is one child process whose output goes to a log file.
type process struct {
	name    string
	logPath string
	cmd     *exec.Cmd
	log     *os.File

	done     chan struct{} // closed when the process has exited
	exitErr  error         // valid once done is closed
	stopping atomic.Bool   // set before a deliberate stop
	stopOnce sync.Once
}

// startProcess starts path with args in dir, output to dir/name.log.
// onExit is called (in its own goroutine) if the process exits before
// stop was called.
func startProcess(name, dir, path string, args, env []string, onExit func(name string, err error)) (*process, error) {
	return startProcessAttr(name, dir, path, args, env, sysProcAttr(), onExit)
}

// startProcessAttr is startProcess with the child's attributes given: the
// PostgreSQL programs run as user postgres when the tests run as root.
func startProcessAttr(name, dir, path string, args, env []string, attr *syscall.SysProcAttr,
	onExit func(name string, err error)) (*process, error) {
	logPath := filepath.Join(dir, name+".log")
	f, err := os.Create(logPath)
	if err != nil {
		return nil, fmt.Errorf("storm: %s: log file: %w", name, err)
	}
	cmd := exec.Command(path, args...)
	cmd.Dir = dir
	cmd.Env = env
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = attr
	if err := cmd.Start(); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("storm: start %s: %w", name, err)
	}
	p := &process{name: name, logPath: logPath, cmd: cmd, log: f, done: make(chan struct{})}
	go func() {
		p.exitErr = cmd.Wait()
		_ = f.Close()
		close(p.done)
		if !p.stopping.Load() && onExit != nil {
			onExit(name, p.exitErr)
		}
	}()
	return p, nil
}

// exited reports whether the process has exited, and how.
func (p *process) exited() (bool, error) {
	select {
	case <-p.done:
		return true, p.exitErr
	default:
		return false, nil
	}
}

// stop sends SIGTERM, waits up to stopGrace, then SIGKILLs and waits. Safe
// to call more than once and from several goroutines.
func (p *process) stop() {
	p.stopOnce.Do(func() {
		p.stopping.Store(true)
		if done, _ := p.exited(); done {
			return
		}
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
			return
		case <-time.After(stopGrace):
		}
		_ = p.cmd.Process.Kill()
		<-p.done
	})
	<-p.done
}

// kill sends SIGKILL at once, as a crash would, and waits for the exit. It
// counts as a deliberate stop: onExit is not called, and a later stop
// returns at once.
func (p *process) kill() {
	p.stopping.Store(true)
	_ = p.cmd.Process.Kill()
	<-p.done
}

// pid is the process id.
func (p *process) pid() int { return p.cmd.Process.Pid }

// tail returns the last n lines of the process's log.
func (p *process) tail(n int) string { return tailFile(p.logPath, n) }

// tailFile returns the last n lines of the file at path.
func tailFile(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(log unreadable: %v)", err)
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// freePort returns a TCP port on 127.0.0.1 that was free a moment ago,
// outside the ephemeral range (pkg/testkit/ports says why).
func freePort() (int, error) {
	p, err := ports.One()
	if err != nil {
		return 0, fmt.Errorf("storm: free port: %w", err)
	}
	return p, nil
}

// errExited is the cause when a process exits while being waited for.
var errExited = errors.New("process exited")

// waitReady polls check every 50 ms until it succeeds, p exits, or ctx
// ends.
func waitReady(ctx context.Context, p *process, what string, check func(ctx context.Context) error) error {
	var last error
	for {
		if done, err := p.exited(); done {
			return fmt.Errorf("storm: %s exited before it was ready (%v): %w", p.name, err, errExited)
		}
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		last = check(cctx)
		cancel()
		if last == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("storm: %s not ready (%s): %w (last: %v)", p.name, what, context.Cause(ctx), last)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// httpOK checks that GET url answers 200.
func httpOK(client *http.Client, url string) func(ctx context.Context) error {
	return func(ctx context.Context) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("GET %s: %d %s", url, resp.StatusCode, bytes.TrimSpace(body))
		}
		return nil
	}
}

// redisPing checks that a Redis server answers PING on addr.
func redisPing(addr string) func(ctx context.Context) error {
	return func(ctx context.Context) error {
		c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
		defer func() { _ = c.Close() }()
		return c.Ping(ctx).Err()
	}
}

// redisLoaded checks that the Redis server on addr has loaded its dataset:
// it answers PING while still loading its append-only file, but refuses
// every data command with LOADING until INFO says loading:0.
func redisLoaded(addr string) func(ctx context.Context) error {
	return func(ctx context.Context) error {
		c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
		defer func() { _ = c.Close() }()
		info, err := c.Info(ctx, "persistence").Result()
		if err != nil {
			return err
		}
		if !strings.Contains(info, "loading:0") {
			return errors.New("redis is still loading its dataset")
		}
		return nil
	}
}
