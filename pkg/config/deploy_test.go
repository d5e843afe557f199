package config_test

import (
	"bufio"
	"maps"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"bulwark/pkg/config"
)

// The deployment examples live at the repository root; tests run in the
// package folder.
var (
	repoRoot    = filepath.Join("..", "..")
	composeFile = filepath.Join(repoRoot, "deploy", "compose.yaml")
	composeEnv  = filepath.Join(repoRoot, "deploy", "compose.env.example")
	dockerfile  = filepath.Join(repoRoot, "deploy", "Dockerfile")
	systemdDir  = filepath.Join(repoRoot, "deploy", "systemd")
	systemdEnv  = filepath.Join(systemdDir, "bulwark.env.example")
	repoConfig  = filepath.Join(repoRoot, "config.yaml")
)

// bulwarkBinDir is where both examples install the binaries of `make
// build` (the Procfile's bin/).
const bulwarkBinDir = "/opt/bulwark/bin/"

// composeService is the part of a Compose service the test reads.
type composeService struct {
	Image       string            `yaml:"image"`
	Command     []string          `yaml:"command"`
	Environment map[string]string `yaml:"environment"`
	Volumes     []string          `yaml:"volumes"`
	Ports       []string          `yaml:"ports"`
	Healthcheck struct {
		Test []string `yaml:"test"`
	} `yaml:"healthcheck"`
	StopGracePeriod string `yaml:"stop_grace_period"`
	Deploy          struct {
		Replicas *int `yaml:"replicas"`
	} `yaml:"deploy"`
}

// The Compose example (deploy/compose.yaml) cannot be run here (no Docker
// host), so it is held to what can be checked without one: each Bulwark
// service runs a binary the Dockerfile builds from a main package of this
// repository; config.yaml, mounted as the file BULWARK_CONFIG names,
// loads and validates with the environment the service sets, which sets
// every variable config.yaml needs without a default; every variable
// Compose fills in is in compose.env.example; the health checks probe the
// listeners that configuration opens, on all interfaces; the worker's
// metrics listener (its /metrics has no token) publishes no port, so it
// stays on the private compose network; the stop grace
// periods outlast the shutdown timeouts; one scheduler; Redis keeps an
// append-only file, is bounded (maxmemory) and never evicts, and
// PostgreSQL has pgvector.
func TestComposeExample(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile(composeFile)
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Services map[string]composeService `yaml:"services"`
	}
	if err := yaml.Unmarshal(raw, &doc); err != nil {
		t.Fatalf("%s: %v", composeFile, err)
	}
	built := dockerBinaries(t)
	example := envFile(t, composeEnv)
	var root yaml.Node
	if err := yaml.Unmarshal(raw, &root); err != nil {
		t.Fatalf("%s: %v", composeFile, err)
	}
	for _, v := range scalars(&root) {
		for _, m := range composeVar.FindAllStringSubmatch(v, -1) {
			if _, ok := example[m[1]]; !ok {
				t.Errorf("compose.yaml needs %s; compose.env.example does not name it", m[1])
			}
		}
	}
	for _, name := range []string{"api", "worker", "scheduler"} {
		svc, ok := doc.Services[name]
		if !ok {
			t.Errorf("compose: no service %s", name)
			continue
		}
		if len(svc.Command) != 1 || svc.Command[0] != bulwarkBinDir+name || !built[name] {
			t.Errorf("compose: %s runs %v; want %s%s, built by the Dockerfile (it builds %v)", name, svc.Command, bulwarkBinDir, name, built)
		}
		if want := "../config.yaml:" + svc.Environment["BULWARK_CONFIG"] + ":ro"; !slices.Contains(svc.Volumes, want) {
			t.Errorf("compose: %s mounts %v; want %s", name, svc.Volumes, want)
		}
		env := map[string]string{} // as Compose fills it in from a .env like the example
		for k, v := range svc.Environment {
			env[k] = composeVar.ReplaceAllStringFunc(v, func(ref string) string {
				return example[composeVar.FindStringSubmatch(ref)[1]]
			})
		}
		cfg := loadWith(t, "compose "+name, env)
		if cfg == nil {
			continue
		}
		switch name {
		case "api":
			checkProbe(t, "compose api", svc.Healthcheck.Test, "/readyz", cfg.Server.Listen)
			checkGrace(t, "compose api", svc.StopGracePeriod, cfg.Server.ShutdownTimeout)
		case "worker":
			checkProbe(t, "compose worker", svc.Healthcheck.Test, "/metrics", cfg.Worker.MetricsListen)
			if len(svc.Ports) > 0 {
				t.Errorf("compose worker publishes %v: its metrics listener must stay on the compose network", svc.Ports)
			}
			checkGrace(t, "compose worker", svc.StopGracePeriod, cfg.Worker.ShutdownTimeout)
		}
	}
	if svc := doc.Services["scheduler"]; svc.Deploy.Replicas == nil || *svc.Deploy.Replicas != 1 {
		t.Error("compose: want exactly one scheduler")
	}
	if img := doc.Services["postgres"].Image; !strings.Contains(img, "pgvector") {
		t.Errorf("compose: postgres image %q has no pgvector", img)
	}
	if cmd := strings.Join(doc.Services["redis"].Command, " "); !strings.Contains(cmd, "--maxmemory-policy noeviction") ||
		!strings.Contains(cmd, "--maxmemory ") {
		t.Errorf("compose: redis runs %q; want a maxmemory and --maxmemory-policy noeviction", cmd)
	}
	if cmd := strings.Join(doc.Services["redis"].Command, " "); !strings.Contains(cmd, "--appendonly yes") {
		t.Errorf("compose: redis runs %q, without its append-only file", cmd)
	}
}

// The systemd units (deploy/systemd) are checked the same way:
// `systemd-analyze verify` accepts them (checked by hand: it needs the
// binaries at their ExecStart paths), and here each runs a binary of
// `make build` from a main package of this repository; config.yaml loads
// with the unit's Environment= and bulwark.env.example; the api listens on
// all interfaces; the worker listens for its metrics on 909<instance>
// (instance 1 here) on loopback or a private address, never all
// interfaces (its /metrics has no token); the stop timeouts outlast the
// shutdown timeouts.
func TestSystemdExample(t *testing.T) {
	t.Parallel()
	example := envFile(t, systemdEnv)
	for _, tt := range []struct{ unit, binary string }{
		{"bulwark-api.service", "api"},
		{"bulwark-worker@.service", "worker"},
		{"bulwark-scheduler.service", "scheduler"},
	} {
		svc := unitService(t, filepath.Join(systemdDir, tt.unit))
		if got := svc["ExecStart"]; len(got) != 1 || got[0] != bulwarkBinDir+tt.binary || !isMain(t, tt.binary) {
			t.Errorf("%s runs %v; want %s%s", tt.unit, got, bulwarkBinDir, tt.binary)
		}
		// bulwark.env, and at most optional ("-") files after it (a worker
		// instance's own overrides).
		if got := svc["EnvironmentFile"]; len(got) < 1 || got[0] != "/etc/bulwark/bulwark.env" ||
			slices.ContainsFunc(got[1:], func(f string) bool { return !strings.HasPrefix(f, "-") }) {
			t.Errorf("%s reads %v; want /etc/bulwark/bulwark.env, then only optional files", tt.unit, got)
		}
		env := maps.Clone(example)
		for _, kv := range svc["Environment"] {
			k, v, _ := strings.Cut(strings.ReplaceAll(kv, "%i", "1"), "=")
			env[k] = v
		}
		cfg := loadWith(t, tt.unit, env)
		if cfg == nil {
			continue
		}
		stop := svc["TimeoutStopSec"]
		switch tt.binary {
		case "api":
			checkListen(t, tt.unit, cfg.Server.Listen, "")
			checkGrace(t, tt.unit, strings.Join(stop, "")+"s", cfg.Server.ShutdownTimeout)
		case "worker":
			checkPrivateListen(t, tt.unit, cfg.Worker.MetricsListen, "9091")
			checkGrace(t, tt.unit, strings.Join(stop, "")+"s", cfg.Worker.ShutdownTimeout)
		}
	}
}

// composeVar is a variable Compose fills in: ${NAME}, ${NAME:?message},
// ${NAME:-default}.
var composeVar = regexp.MustCompile(`\$\{([A-Za-z_][A-Za-z0-9_]*)[^}]*\}`)

// scalars returns every scalar value under n (keys included, comments
// not).
func scalars(n *yaml.Node) []string {
	if n.Kind == yaml.ScalarNode {
		return []string{n.Value}
	}
	var out []string
	for _, c := range n.Content {
		out = append(out, scalars(c)...)
	}
	return out
}

// loadWith loads config.yaml with env as the environment; on failure it
// fails the test and returns nil.
func loadWith(t *testing.T, what string, env map[string]string) *config.Config {
	t.Helper()
	raw, err := os.ReadFile(repoConfig)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Parse(raw, func(k string) (string, bool) { v, ok := env[k]; return v, ok })
	if err != nil {
		t.Errorf("%s: config.yaml does not load with its environment: %v", what, err)
		return nil
	}
	return cfg
}

// checkProbe checks that a Compose health check is curl on path of the
// port listen opens, and that listen takes connections on all interfaces.
func checkProbe(t *testing.T, what string, test []string, path, listen string) {
	t.Helper()
	if len(test) < 2 || test[0] != "CMD" || test[1] != "curl" {
		t.Errorf("%s: health check %v; want [CMD curl … URL]", what, test)
		return
	}
	u, err := url.Parse(test[len(test)-1])
	if err != nil || u.Path != path {
		t.Errorf("%s: health check URL %q; want path %s", what, test[len(test)-1], path)
		return
	}
	checkListen(t, what, listen, u.Port())
}

// checkListen checks that listen is on all interfaces (reachable from a
// load balancer or Prometheus on another host) and, when port is not "",
// on that port.
func checkListen(t *testing.T, what, listen, port string) {
	t.Helper()
	host, p, err := net.SplitHostPort(listen)
	if err != nil {
		t.Errorf("%s: listen address %q: %v", what, listen, err)
		return
	}
	if ip := net.ParseIP(host); host == "localhost" || (ip != nil && ip.IsLoopback()) {
		t.Errorf("%s: listens on %s, loopback: unreachable from other hosts", what, listen)
	}
	if port != "" && p != port {
		t.Errorf("%s: listens on %s; its health check probes port %s", what, listen, port)
	}
}

// checkPrivateListen checks that listen is on loopback or a private
// address (RFC 1918, RFC 4193), not on all interfaces, and on port.
func checkPrivateListen(t *testing.T, what, listen, port string) {
	t.Helper()
	host, p, err := net.SplitHostPort(listen)
	if err != nil {
		t.Errorf("%s: listen address %q: %v", what, listen, err)
		return
	}
	if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !(ip.IsLoopback() || ip.IsPrivate())) {
		t.Errorf("%s: listens on %s; want loopback or a private address", what, listen)
	}
	if p != port {
		t.Errorf("%s: listens on %s; want port %s", what, listen, port)
	}
}

// checkGrace checks that the time between SIGTERM and SIGKILL (grace, a
// Go duration) outlasts the process's own shutdown timeout.
func checkGrace(t *testing.T, what, grace string, shutdown time.Duration) {
	t.Helper()
	d, err := time.ParseDuration(grace)
	if err != nil || d <= shutdown {
		t.Errorf("%s: %q between SIGTERM and SIGKILL; the shutdown timeout is %s", what, grace, shutdown)
	}
}

// dockerBinaries returns the binaries the Dockerfile's go build makes,
// each from a main package of this repository.
func dockerBinaries(t *testing.T) map[string]bool {
	t.Helper()
	raw, err := os.ReadFile(dockerfile)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for line := range strings.Lines(string(raw)) {
		if !strings.Contains(line, "go build") || !strings.Contains(line, "-o /out/") {
			continue
		}
		for _, f := range strings.Fields(line) {
			if pkg, ok := strings.CutPrefix(f, "./"); ok {
				out[filepath.Base(pkg)] = isMain(t, pkg)
			}
		}
	}
	return out
}

// isMain reports whether the folder pkg of the repository holds a main
// package.
func isMain(t *testing.T, pkg string) bool {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(repoRoot, pkg, "main.go"))
	return err == nil && regexp.MustCompile(`(?m)^package main$`).Match(raw)
}

// envFile reads KEY=VALUE lines, skipping blank lines and comments.
func envFile(t *testing.T, path string) map[string]string {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for line := range strings.Lines(string(raw)) {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			t.Fatalf("%s: %q is not KEY=VALUE", path, line)
		}
		if v == "" {
			v = "placeholder" // a key left for the operator to fill in
		}
		out[k] = v
	}
	return out
}

// unitService returns the [Service] settings of a systemd unit, each
// key's values in order; ExecStart split into words.
func unitService(t *testing.T, path string) map[string][]string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[string][]string{}
	section := ""
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "" || strings.HasPrefix(line, "#"):
		case strings.HasPrefix(line, "["):
			section = line
		case section == "[Service]":
			k, v, _ := strings.Cut(line, "=")
			if k == "ExecStart" {
				out[k] = strings.Fields(v)
				continue
			}
			out[k] = append(out[k], v)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}
