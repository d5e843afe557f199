package storm

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"bulwark/pkg/testkit/mockprovider"
)

// S3-mixed: one storm across every provider kind at once. Its keys are
// few and small on purpose, so that every route runs at its limit:
//
//   - claude/sonnet (Anthropic, kind anthropic): one key of MixedClaudeRPM,
//     its fallback chain [bedrock/sonnet, azure/gpt4o] carrying the rest;
//   - bedrock/sonnet (Claude on Bedrock, SigV4): two regions of one
//     account, two keys of MixedBedrockRPM, which the mock meters as
//     BedrockKey(access key id, region);
//   - azure/gpt4o (Azure OpenAI): a provisioned (PTU) deployment's key of
//     MixedAzurePTURPM, preferred while it has room, and a standard one of
//     MixedAzureStdRPM;
//   - local/qwen (an OpenAI-compatible local server): one key with
//     max_in_flight MixedLocalInFlight and no rate, the mock refusing a
//     call beyond that many at once with Ollama's 503 "server busy"
//     (mockprovider.Limits.MaxConcurrent).
//
// A third of the requests ask claude/sonnet, a third ask it from the
// router layer (the routing rule sends them to local/qwen first, the
// claude/sonnet chain behind it: four kinds in one request's route
// order), a third ask azure/gpt4o. The claude/sonnet chain's first two
// hops (3 requests/s) cannot carry its third, so its last hop shares
// azure/gpt4o with the direct third; the local route takes most of its
// third. In all the load stays within the cloud keys' 9 requests/s plus
// the local route's few per second: 400 requests take about 30 s. The mock is served from the storm's own
// process (mockprovider.New): the mockprovider command has no per-key
// limits, and each key here has its own.
const (
	MixedClaudeRPM     = 60
	MixedBedrockRPM    = 60
	MixedAzurePTURPM   = 240
	MixedAzureStdRPM   = 120
	MixedLocalInFlight = 2
)

// The route a local key serves, the model ids of the mixed configuration
// and the AWS access key id the api and worker processes sign with.
const (
	mixedLocalRoute    = "local/qwen"
	mixedPTUDeployment = "gpt4o-ptu"
	mixedAWSAccessKey  = "AKIDBULWARKSTORM"
)

// mixedKey is one key of S3-mixed, in the pool and at the mock.
type mixedKey struct {
	id, provider, tier string
	// fields are the key's own YAML fields (credential, region, …).
	fields string
	// mockKey is what the mock meters the key by: its API key, or
	// BedrockKey(access key id, region).
	mockKey string
	// rpm is the key's requests per minute (TPM is MockTPM); inFlight, for
	// the local key instead, its concurrent calls.
	rpm, inFlight int
}

func (k mixedKey) route() string { return k.provider + "/" + k.tier }

// mixedKeys are S3-mixed's keys, in the order of the configuration.
var mixedKeys = []mixedKey{
	{id: "claude-sonnet-1", provider: "claude", tier: "sonnet", fields: `api_key: "storm-claude-sonnet-key"`,
		mockKey: "storm-claude-sonnet-key", rpm: MixedClaudeRPM},
	{id: "br-use1", provider: "bedrock", tier: "sonnet", fields: "region: us-east-1",
		mockKey: mockprovider.BedrockKey(mixedAWSAccessKey, "us-east-1"), rpm: MixedBedrockRPM},
	{id: "br-euw1", provider: "bedrock", tier: "sonnet", fields: "region: eu-west-1",
		mockKey: mockprovider.BedrockKey(mixedAWSAccessKey, "eu-west-1"), rpm: MixedBedrockRPM},
	{id: "az-ptu", provider: "azure", tier: "gpt4o", fields: `api_key: "storm-azure-ptu-key", deployment: ` + mixedPTUDeployment + `, ptu: true`,
		mockKey: "storm-azure-ptu-key", rpm: MixedAzurePTURPM},
	{id: "az-std", provider: "azure", tier: "gpt4o", fields: `api_key: "storm-azure-std-key"`,
		mockKey: "storm-azure-std-key", rpm: MixedAzureStdRPM},
	{id: "qwen-1", provider: "local", tier: "qwen", fields: `api_key: "storm-local-key"`,
		mockKey: "storm-local-key", inFlight: MixedLocalInFlight},
}

// mixedRoutes are the routes S3-mixed must see serve (Targets.MustServe).
var mixedRoutes = []string{"claude/sonnet", "bedrock/sonnet", "azure/gpt4o", mixedLocalRoute}

// MixedCloudCapacity is what S3-mixed's rate-limited (cloud) keys can
// serve, in requests per second; the local key adds what its
// concurrency allows at the mock's latency, which no rate bounds.
func MixedCloudCapacity() float64 {
	rpm := 0
	for _, k := range mixedKeys {
		rpm += k.rpm
	}
	return float64(rpm) / 60
}

// MixedAutoLimit is AutoLimit for S3-mixed: the cloud keys' time for n
// requests at capacity (the local route's answers are a bonus), plus 12 s.
func MixedAutoLimit(n int) time.Duration {
	return time.Duration(float64(n)/MixedCloudCapacity()*float64(time.Second)) + 12*time.Second
}

// ask returns the model request i asks for on /v1/chat/completions and
// its cache layer ("": none).
func (s Scenario) ask(i int) (model, layer string) {
	if !s.Mixed {
		return "gpt-4o-mini", ""
	}
	switch i % 3 {
	case 0:
		return "claude/sonnet", ""
	case 1:
		return "claude/sonnet", "router" // local/qwen first, then the claude/sonnet chain
	}
	return "azure/gpt4o", ""
}

// mixedKeysYAML is the keys section of S3-mixed.
func mixedKeysYAML() string {
	var b strings.Builder
	for _, k := range mixedKeys {
		limits := fmt.Sprintf("rpm_limit: %d, tpm_limit: %d", k.rpm, MockTPM)
		if k.inFlight > 0 {
			limits = fmt.Sprintf("max_in_flight: %d", k.inFlight) // unmetered, bounded by concurrency
		}
		fmt.Fprintf(&b, "  - {id: %s, provider: %s, model_tier: %s, %s, %s}\n", k.id, k.provider, k.tier, k.fields, limits)
	}
	return b.String()
}

// mixedProvidersYAML is the providers, fallback and routing sections of
// S3-mixed, every provider on the mock.
func mixedProvidersYAML(mockURL string) string {
	return fmt.Sprintf(`providers:
  claude: {base_url: %q, timeout: 30s, tiers: {sonnet: claude-sonnet-4-5}}
  bedrock: {kind: bedrock, base_url: %q, timeout: 30s, tiers: {sonnet: "anthropic.claude-sonnet-4-5-20250929-v1:0"}}
  azure: {kind: azure, base_url: %q, api_version: "2024-10-21", timeout: 30s, tiers: {gpt4o: gpt4o-standard}}
  local: {kind: local, base_url: %q, timeout: 30s, tiers: {qwen: "qwen2.5:7b"}}
fallback:
  claude/sonnet: [bedrock/sonnet, azure/gpt4o]
routing:
  - {layer: router, route: %s}
`, mockURL, mockURL, mockURL, mockURL, mixedLocalRoute)
}

// mixedMockConfig is the mock of S3-mixed: each key's own limits, the PTU
// deployment, and the scenario's latency. Keys it does not know get the
// storm's usual limits (and count as stray calls in the result).
func mixedMockConfig(sc Scenario) mockprovider.Config {
	keys := make(map[string]mockprovider.Limits, len(mixedKeys))
	for _, k := range mixedKeys {
		if k.inFlight > 0 {
			keys[k.mockKey] = mockprovider.Limits{MaxConcurrent: k.inFlight}
		} else {
			keys[k.mockKey] = mockprovider.Limits{RPM: k.rpm, TPM: MockTPM}
		}
	}
	return mockprovider.Config{Latency: sc.Latency, LatencyJitter: sc.Jitter, Window: time.Second,
		DefaultLimits: mockprovider.Limits{RPM: KeyRPM, TPM: MockTPM}, Keys: keys,
		AzurePTUDeployments: []string{mixedPTUDeployment}}
}

// mixedEnv is the environment of S3-mixed's api and worker processes:
// base without any AWS_ variable, and the static credentials the Bedrock
// keys sign with (the AWS SDK's default chain reads them from the
// environment; no shared files, no instance metadata).
func mixedEnv(base []string) []string {
	out := make([]string, 0, len(base)+5)
	for _, kv := range base {
		if !strings.HasPrefix(kv, "AWS_") {
			out = append(out, kv)
		}
	}
	return append(out, "AWS_ACCESS_KEY_ID="+mixedAWSAccessKey, "AWS_SECRET_ACCESS_KEY=bulwark-storm-secret",
		"AWS_EC2_METADATA_DISABLED=true", "AWS_CONFIG_FILE="+os.DevNull, "AWS_SHARED_CREDENTIALS_FILE="+os.DevNull)
}

// mixedStats fills the mixed scenario's figures from the mock's stats:
// the busy answers, each key's calls and refusals, the local key's most
// calls at once, and the calls on keys the scenario does not know.
func (r *Result) mixedStats(st mockprovider.Stats) {
	r.KeyCalls, r.KeyRefused = map[string]int64{}, map[string]int64{}
	known := map[string]bool{}
	for _, k := range mixedKeys {
		fp := mockprovider.Fingerprint(k.mockKey)
		known[fp] = true
		c := st.Keys[fp]
		r.KeyCalls[k.id] = c.Requests
		if n := c.RateLimited + c.Busy; n > 0 {
			r.KeyRefused[k.id] = n
		}
		if k.route() == mixedLocalRoute {
			r.LocalMaxInFlight = max(r.LocalMaxInFlight, c.MaxInFlight)
		}
	}
	for fp, c := range st.Keys {
		if !known[fp] {
			r.StrayCalls += c.Requests
		}
	}
}

// inProcMock is a mock provider served by this process on a loopback
// address, logging to a file of the scenario's folder.
type inProcMock struct {
	mock    *mockprovider.Server
	srv     *http.Server
	logPath string
	log     *os.File
	done    chan struct{} // closed when Serve has returned
}

// startInProcMock serves a mock of cfg on addr. onExit is called if it
// stops serving before stop.
func startInProcMock(dir, addr string, cfg mockprovider.Config, onExit func(name string, err error)) (*inProcMock, error) {
	logPath := filepath.Join(dir, "mock.log")
	f, err := os.Create(logPath)
	if err != nil {
		return nil, fmt.Errorf("storm: mock: log file: %w", err)
	}
	log := slog.New(slog.NewTextHandler(f, nil))
	cfg.Logger = log
	m, err := mockprovider.New(cfg)
	if err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("storm: mock: %w", err)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("storm: mock: %w", err)
	}
	p := &inProcMock{mock: m, logPath: logPath, log: f, done: make(chan struct{}),
		srv: &http.Server{Handler: m, ReadHeaderTimeout: 10 * time.Second, ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}}
	log.Info("mock provider listening (in the storm process)", "addr", addr, "keys", len(cfg.Keys),
		"latency", cfg.Latency, "jitter", cfg.LatencyJitter, "window", cfg.Window)
	go func() {
		defer close(p.done)
		if err := p.srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) && onExit != nil {
			onExit("mock", err)
		}
	}()
	return p, nil
}

// stop releases hanging requests, drains the others (at most stopGrace)
// and closes the log. Call it once.
func (p *inProcMock) stop() {
	p.mock.Close()
	ctx, cancel := context.WithTimeout(context.Background(), stopGrace)
	defer cancel()
	if err := p.srv.Shutdown(ctx); err != nil {
		_ = p.srv.Close()
	}
	<-p.done
	_ = p.log.Close()
}

// tail returns the last n lines of the mock's log.
func (p *inProcMock) tail(n int) string { return tailFile(p.logPath, n) }
