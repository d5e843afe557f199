package storm

import (
	"bufio"
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"bulwark/pkg/metrics"
)

// PGAdminDSNDefault is the `make test` PostgreSQL server's maintenance
// database, used when BULWARK_TEST_PG is unset.
const PGAdminDSNDefault = "postgres://postgres@127.0.0.1:15433/postgres?sslmode=disable"

// PGAdminDSN returns $BULWARK_TEST_PG or PGAdminDSNDefault.
func PGAdminDSN() string {
	if d := os.Getenv("BULWARK_TEST_PG"); d != "" {
		return d
	}
	return PGAdminDSNDefault
}

// The tokens of the generated configuration.
const (
	tenantToken = "storm-tenant-token"
	adminToken  = "storm-admin-token"
)

// readyTimeout bounds the start-up of each process (migrations included).
const readyTimeout = 60 * time.Second

// Env is what every scenario needs from outside.
type Env struct {
	Bins Binaries
	// PGAdminDSN is a superuser DSN of the PostgreSQL server on which each
	// scenario creates and drops its database. Default PGAdminDSN().
	PGAdminDSN string
	// RedisServer is the redis-server binary. Default: found on PATH.
	RedisServer string
	// KeepDir keeps each scenario's temporary folder (config, logs) and
	// reports it in Result.Dir.
	KeepDir bool
	// EstimatesDir, when set, receives each async scenario's queue
	// estimates as <scenario>-estimates.csv (writeEstimates).
	EstimatesDir string
}

// system is one scenario's set of processes, Redis and database.
type system struct {
	dir     string
	keepDir bool
	// apiURL is the first api process's; apiURLs every api process's, in
	// start order (apiURLs[0] == apiURL).
	apiURL   string
	apiURLs  []string
	mockURL  string
	pgAdmin  string
	database string // created on the PostgreSQL server; "" until then
	// pg is the system's own PostgreSQL cluster (options.OwnPostgres);
	// nil when the database is on the shared server.
	pg *pgCluster

	// What starting another worker or Redis again needs (startWorker,
	// restartRedis); set by startSystemWith, read-only after.
	env       Env
	opts      options
	redisBin  string
	redisArgs []string
	redisAddr string
	baseEnv   []string // the environment of the api and worker processes
	onExit    func(name string, err error)

	mu       sync.Mutex
	procs    []*process // in start order; guarded by mu
	redis    *process   // the running redis-server; guarded by mu
	postgres *process   // the own PostgreSQL server while it runs; guarded by mu
	workers  int        // worker processes started so far; guarded by mu
	// metricsURLs are the /metrics URLs of the workers started, by
	// process name; guarded by mu.
	metricsURLs map[string]string
	// ha is the replica and sentinels of options.Sentinel (sentinel.go);
	// set by startSystemWith, nil without.
	ha *sentinelSet
	// inMock is the mock served by this process (S3-mixed), nil when the
	// mock is a process of procs; set by startSystemWith before anything
	// else runs, then guarded by mu (close stops it and clears it).
	inMock *inProcMock

	// failed is cancelled with the cause when a process exits on its own.
	failed context.CancelCauseFunc
	ctx    context.Context
}

// options changes what startSystemWith starts; the zero value is the
// storm benchmark's system.
type options struct {
	// APIs is the number of api processes, each on a port of its own
	// (api, api-2, …). Default 1.
	APIs int
	// Workers is the number of worker processes. Default 2.
	Workers int
	// AppendOnly runs Redis with appendonly yes and appendfsync everysec,
	// so that a restart (restartRedis) keeps what Redis acknowledged.
	AppendOnly bool
	// ProviderURL, when set, returns the provider base URL a worker
	// process calls, given the mock's URL and the worker's name (a
	// recording proxy in front of the mock, see callLog); the api process
	// calls the mock directly.
	ProviderURL func(mockURL, worker string) (string, error)
	// OwnPostgres gives the system a PostgreSQL server of its own (see
	// postgres.go) instead of a database on Env.PGAdminDSN's, so that a
	// test can stop and start it (stopPostgres, startPostgres).
	OwnPostgres bool
	// PostgresDown stops that server once the database exists, before
	// the api and worker processes start: they must start without it.
	// Only with OwnPostgres.
	PostgresDown bool
	// Sentinel makes that Redis the master of a Sentinel setup with one
	// replica and three sentinels, reached through them (sentinel.go).
	Sentinel bool
}

// providerURLVar carries a worker's own provider base URL into the shared
// configuration (options.ProviderURL).
const providerURLVar = "BULWARK_STORM_PROVIDER_URL"

// apiListenVar gives an api process other than the first a listen address
// of its own (startAPI); the first listens on the configured one.
const apiListenVar = "BULWARK_STORM_API_LISTEN"

// startSystemWith starts Redis, the database, the mock, the api processes
// and the workers for sc, with o's changes (one api and two workers unless
// o says otherwise), and waits until all are ready. On error everything
// started is stopped again; the error carries the logs' last lines.
func startSystemWith(ctx context.Context, env Env, sc Scenario, client *http.Client, o options) (s *system, err error) {
	if o.APIs == 0 {
		o.APIs = 1
	}
	if o.Workers == 0 {
		o.Workers = 2
	}
	dir, err := os.MkdirTemp("", "bulwark-storm-*")
	if err != nil {
		return nil, fmt.Errorf("storm: temp dir: %w", err)
	}
	s = &system{dir: dir, keepDir: env.KeepDir, pgAdmin: env.PGAdminDSN, env: env, opts: o}
	if s.pgAdmin == "" {
		s.pgAdmin = PGAdminDSN()
	}
	s.ctx, s.failed = context.WithCancelCause(context.Background())
	defer func() {
		if err != nil {
			tails := s.tails(40)
			err = fmt.Errorf("%w\n%s", errors.Join(err, s.close()), tails)
		}
	}()
	s.onExit = func(name string, perr error) {
		s.failed(fmt.Errorf("storm: %s exited during the scenario (%v): %w", name, perr, errExited))
	}
	onExit := s.onExit
	rctx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()

	ports := make([]int, 3) // redis, mock, api
	for i := range ports {
		if ports[i], err = freePort(); err != nil {
			return s, err
		}
	}
	redisAddr := "127.0.0.1:" + strconv.Itoa(ports[0])
	s.redisAddr = redisAddr
	s.mockURL = "http://127.0.0.1:" + strconv.Itoa(ports[1])
	s.apiURL = "http://127.0.0.1:" + strconv.Itoa(ports[2])

	redisBin := env.RedisServer
	if redisBin == "" {
		if redisBin, err = exec.LookPath("redis-server"); err != nil {
			return s, fmt.Errorf("storm: redis-server not on PATH (scripts/deps.sh installs it): %w", err)
		}
	}
	s.redisBin = redisBin
	s.redisArgs = []string{"--port", strconv.Itoa(ports[0]), "--bind", "127.0.0.1", "--save", "", "--dir", dir}
	if o.AppendOnly {
		s.redisArgs = append(s.redisArgs, "--appendonly", "yes", "--appendfsync", "everysec")
	} else {
		s.redisArgs = append(s.redisArgs, "--appendonly", "no")
	}
	rp, err := startProcess("redis", dir, redisBin, s.redisArgs, os.Environ(), onExit)
	if err != nil {
		return s, err
	}
	s.addProc(rp)
	s.mu.Lock()
	s.redis = rp
	s.mu.Unlock()

	if o.Sentinel {
		if err := s.startSentinel(rctx); err != nil {
			return s, err
		}
	}
	if o.OwnPostgres {
		if err := s.ownPostgres(rctx); err != nil {
			return s, err
		}
	}
	if err := s.createDatabase(rctx); err != nil {
		return s, err
	}
	if o.OwnPostgres && o.PostgresDown {
		if err := s.stopPostgres(); err != nil {
			return s, err
		}
	}

	// The mock: the mockprovider process with every key at the storm's
	// limits, or, for S3-mixed, whose keys each have their own, a mock
	// served by this process (mixed.go).
	var mp *process
	if sc.Mixed {
		if s.inMock, err = startInProcMock(dir, "127.0.0.1:"+strconv.Itoa(ports[1]), mixedMockConfig(sc), onExit); err != nil {
			return s, err
		}
	} else {
		mockArgs := []string{"-addr", "127.0.0.1:" + strconv.Itoa(ports[1]), "-rpm", strconv.Itoa(sc.keyRPM()),
			"-tpm", strconv.Itoa(sc.keyTPM()), "-latency", sc.Latency.String(), "-jitter", sc.Jitter.String()}
		if env.Bins.MockWindow {
			mockArgs = append(mockArgs, "-window", cmp.Or(sc.MockWindow, time.Second).String())
		}
		if mp, err = startProcess("mock", dir, env.Bins.Mock, mockArgs, os.Environ(), onExit); err != nil {
			return s, err
		}
		s.addProc(mp)
	}

	cfgPath := filepath.Join(dir, "config.yaml")
	providerURL := s.mockURL
	if o.ProviderURL != nil {
		providerURL = "${" + providerURLVar + ":-" + s.mockURL + "}"
	}
	redisSection := serverYAML(redisAddr)
	if s.ha != nil {
		redisSection = s.ha.yaml()
	}
	doc := configYAML(sc, ports[2], redisSection, s.databaseDSN(), providerURL)
	if err := os.WriteFile(cfgPath, []byte(doc), 0o600); err != nil {
		return s, fmt.Errorf("storm: write config: %w", err)
	}
	base := os.Environ()
	if sc.Mixed {
		base = mixedEnv(base) // the Bedrock keys' AWS credentials
	}
	s.baseEnv = append(base, "BULWARK_CONFIG="+cfgPath)
	ap, err := startProcess("api", dir, env.Bins.API, nil, s.baseEnv, onExit)
	if err != nil {
		return s, err
	}
	s.addProc(ap)
	s.apiURLs = []string{s.apiURL}
	type started struct {
		p   *process
		url string
	}
	apis := []started{{ap, s.apiURL}}
	for i := 2; i <= o.APIs; i++ {
		p, u, err := s.startAPI(fmt.Sprintf("api-%d", i), nil, onExit)
		if err != nil {
			return s, err
		}
		apis = append(apis, started{p, u})
		s.apiURLs = append(s.apiURLs, u)
	}
	var workers []started
	for range o.Workers {
		wp, u, err := s.startWorker()
		if err != nil {
			return s, err
		}
		workers = append(workers, started{wp, u})
	}

	if err := waitReady(rctx, rp, "PING "+redisAddr, redisPing(redisAddr)); err != nil {
		return s, err
	}
	if mp != nil { // an in-process mock serves once it listens
		if err := waitReady(rctx, mp, "GET /mock/stats", httpOK(client, s.mockURL+"/mock/stats")); err != nil {
			return s, err
		}
	}
	for _, a := range apis {
		if err := waitReady(rctx, a.p, "GET /readyz", httpOK(client, a.url+"/readyz")); err != nil {
			return s, err
		}
	}
	for _, w := range workers {
		if err := waitReady(rctx, w.p, "GET "+w.url, httpOK(client, w.url)); err != nil {
			return s, err
		}
	}
	return s, nil
}

// ownPostgres creates and starts the system's own PostgreSQL server and
// makes it the one the database is created on.
func (s *system) ownPostgres(ctx context.Context) error {
	c, err := initCluster(ctx, s.dir)
	if err != nil {
		return err
	}
	s.pg, s.pgAdmin = c, c.adminDSN()
	return s.startPostgres(ctx)
}

// startAPI starts another api process, name, on a port of its own with
// the system's configuration and extra environment, and returns it with
// its base URL; it does not wait. onExit (may be nil) replaces the
// system's: an extra api that is meant to exit (a failpoint) must not end
// the scenario.
func (s *system) startAPI(name string, extraEnv []string, onExit func(name string, err error)) (*process, string, error) {
	port, err := freePort()
	if err != nil {
		return nil, "", err
	}
	addr := "127.0.0.1:" + strconv.Itoa(port)
	env := append(append(slices.Clone(s.baseEnv), apiListenVar+"="+addr), extraEnv...)
	p, err := startProcess(name, s.dir, s.env.Bins.API, nil, env, onExit)
	if err != nil {
		return nil, "", err
	}
	s.addProc(p)
	return p, "http://" + addr, nil
}

// addProc records a started process, so that close stops it.
func (s *system) addProc(p *process) {
	s.mu.Lock()
	s.procs = append(s.procs, p)
	s.mu.Unlock()
}

// startWorker starts the next worker process (worker-1, worker-2, …) with
// a metrics address of its own, and returns it with its metrics URL,
// which answers once it is ready. It does not wait.
func (s *system) startWorker() (*process, string, error) {
	port, err := freePort()
	if err != nil {
		return nil, "", err
	}
	s.mu.Lock()
	s.workers++
	name := fmt.Sprintf("worker-%d", s.workers)
	s.mu.Unlock()
	we := append(append([]string{}, s.baseEnv...), "BULWARK_STORM_METRICS_LISTEN=127.0.0.1:"+strconv.Itoa(port))
	if s.opts.ProviderURL != nil {
		u, err := s.opts.ProviderURL(s.mockURL, name)
		if err != nil {
			return nil, "", fmt.Errorf("storm: provider URL of %s: %w", name, err)
		}
		we = append(we, providerURLVar+"="+u)
	}
	wp, err := startProcess(name, s.dir, s.env.Bins.Worker, nil, we, s.onExit)
	if err != nil {
		return nil, "", err
	}
	s.addProc(wp)
	u := "http://127.0.0.1:" + strconv.Itoa(port) + "/metrics"
	s.mu.Lock()
	if s.metricsURLs == nil {
		s.metricsURLs = map[string]string{}
	}
	s.metricsURLs[name] = u
	s.mu.Unlock()
	return wp, u, nil
}

// workerCalls reads every worker's bulwark_provider_calls_total, summed
// over its labels, by process name: which workers did the calls.
func (s *system) workerCalls(ctx context.Context, client *http.Client) (map[string]int64, error) {
	s.mu.Lock()
	urls := maps.Clone(s.metricsURLs)
	s.mu.Unlock()
	out := make(map[string]int64, len(urls))
	for name, u := range urls {
		n, err := counterSum(ctx, client, u, metrics.NameProviderCalls)
		if err != nil {
			return out, fmt.Errorf("storm: %s: %w", name, err)
		}
		out[name] = n
	}
	return out, nil
}

// counterSum reads the Prometheus text at url and sums every sample of
// the counter family name.
func counterSum(ctx context.Context, client *http.Client, url, name string) (int64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, fmt.Errorf("GET %s: %w", url, err)
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, fmt.Errorf("GET %s: %w", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("GET %s: status %d", url, resp.StatusCode)
	}
	var sum float64
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		rest, ok := strings.CutPrefix(line, name)
		if !ok || (rest != "" && rest[0] != '{' && rest[0] != ' ') {
			continue // another family, or a longer name sharing the prefix
		}
		if strings.HasPrefix(rest, "{") {
			rest = rest[strings.LastIndexByte(rest, '}')+1:]
		}
		fields := strings.Fields(rest)
		if len(fields) == 0 {
			continue
		}
		v, err := strconv.ParseFloat(fields[0], 64)
		if err != nil {
			return 0, fmt.Errorf("GET %s: sample %q: %w", url, line, err)
		}
		sum += v
	}
	if err := sc.Err(); err != nil {
		return 0, fmt.Errorf("GET %s: %w", url, err)
	}
	return int64(sum), nil
}

// restartRedis stops redis-server gracefully (SIGTERM: with appendonly it
// flushes its append-only file and exits) and starts it again on the same
// port and folder, under a new log name (redis-2, redis-3, …). It returns
// when the new server has loaded its data, with how long Redis was away.
func (s *system) restartRedis(ctx context.Context) (time.Duration, error) {
	s.mu.Lock()
	old := s.redis
	n := 1
	for _, p := range s.procs {
		if isRedis(p.name) {
			n++
		}
	}
	s.mu.Unlock()
	began := time.Now()
	old.stop()
	if _, err := old.exited(); err != nil {
		return 0, fmt.Errorf("storm: redis-server did not shut down cleanly on SIGTERM: %w", err)
	}
	rp, err := startProcess(fmt.Sprintf("redis-%d", n), s.dir, s.redisBin, s.redisArgs, os.Environ(), s.onExit)
	if err != nil {
		return 0, err
	}
	s.addProc(rp)
	s.mu.Lock()
	s.redis = rp
	s.mu.Unlock()
	rctx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	if err := waitReady(rctx, rp, "INFO persistence "+s.redisAddr, redisLoaded(s.redisAddr)); err != nil {
		return 0, err
	}
	return time.Since(began), nil
}

// isRedis reports whether a process name is one of the redis-servers.
func isRedis(name string) bool { return name == "redis" || strings.HasPrefix(name, "redis-") }

// serverYAML is the configuration's redis section for the one
// redis-server at addr (sentinelSet.yaml is the one for a Sentinel setup).
func serverYAML(addr string) string { return fmt.Sprintf("redis: {addr: %q}", addr) }

// configYAML is the configuration every api and worker process of a
// scenario loads, with redisSection as its redis section (serverYAML or
// sentinelSet.yaml). Each worker's metrics address comes from its own
// environment (the api leaves it off), and so does the listen address of
// an api process other than the first (startAPI).
func configYAML(sc Scenario, apiPort int, redisSection, dsn, mockURL string) string {
	if sc.Mixed {
		return mixedConfigYAML(sc, apiPort, redisSection, dsn, mockURL)
	}
	var keys strings.Builder
	for i := range sc.keys() {
		fmt.Fprintf(&keys, "  - {id: %s, provider: openai, model_tier: gpt4o-mini, api_key: %q, rpm_limit: %d, tpm_limit: %d}\n",
			stormKeyID(i), stormKey(i), sc.keyRPM(), sc.keyTPM())
	}
	if sc.FailPrimary || sc.FallbackKeys {
		for i := range sc.keys() {
			fmt.Fprintf(&keys, "  - {id: claude-haiku-%d, provider: claude, model_tier: haiku, api_key: \"storm-claude-key-%d\", rpm_limit: %d, tpm_limit: %d}\n",
				i+1, i+1, sc.keyRPM(), sc.keyTPM())
		}
	}
	workerExtra := "" // the configuration's default concurrency
	if sc.WorkerConcurrency > 0 {
		workerExtra = fmt.Sprintf(", concurrency: %d", sc.WorkerConcurrency)
	}
	cache := "cache: {enabled: false}"
	if sc.Cache {
		cache = "cache: {enabled: true}"
	}
	// Shutdown timeouts below the 10 s between SIGTERM and SIGKILL, so a
	// scenario cut at its limit still stops cleanly.
	return fmt.Sprintf(`# Generated by pkg/testkit/storm for scenario %s.
server: {listen: "${`+apiListenVar+`:-127.0.0.1:%d}", admin_token: %q, shutdown_timeout: 3s}
%s
postgres: {dsn: %q, max_conns: 8}
worker: {metrics_listen: "${BULWARK_STORM_METRICS_LISTEN:-off}", shutdown_timeout: 5s%s}
log: {format: json, level: info}
providers:
  claude: {base_url: %q, timeout: 30s, tiers: {haiku: claude-haiku-4-5, sonnet: claude-sonnet-4-5}}
  openai: {base_url: %q, timeout: 30s, tiers: {gpt4o-mini: gpt-4o-mini, gpt4o: gpt-4o}}
# The fallback routes exist; Claude keys back them only in S1-fallback,
# where OpenAI refuses every call, and in the fault tests that ask for them.
fallback:
  claude/haiku: openai/gpt4o-mini
  claude/sonnet: openai/gpt4o
  openai/gpt4o-mini: claude/haiku
  openai/gpt4o: claude/sonnet
models: {gpt-4o-mini: openai/gpt4o-mini}
keys:
%s%s
tenants:
  - {name: storm, token: %q, max_priority: critical, max_streams: -1, max_sync_waits: -1, max_reads_per_second: -1}
`, sc.Name, apiPort, adminToken, redisSection, dsn, workerExtra, mockURL, mockURL, keys.String(), cache, tenantToken)
}

// mixedConfigYAML is configYAML for S3-mixed: the same processes and
// tenant, the providers, keys, fallback chain and routing rule of every
// kind (mixed.go), no cache.
func mixedConfigYAML(sc Scenario, apiPort int, redisSection, dsn, mockURL string) string {
	return fmt.Sprintf(`# Generated by pkg/testkit/storm for scenario %s.
server: {listen: "${`+apiListenVar+`:-127.0.0.1:%d}", admin_token: %q, shutdown_timeout: 3s}
%s
postgres: {dsn: %q, max_conns: 8}
worker: {metrics_listen: "${BULWARK_STORM_METRICS_LISTEN:-off}", shutdown_timeout: 5s}
log: {format: json, level: info}
%skeys:
%scache: {enabled: false}
tenants:
  - {name: storm, token: %q, max_priority: critical, max_streams: -1, max_sync_waits: -1, max_reads_per_second: -1}
`, sc.Name, apiPort, adminToken, redisSection, dsn, mixedProvidersYAML(mockURL), mixedKeysYAML(), tenantToken)
}

// createDatabase creates storm_<random> on the PostgreSQL server (the
// shared one, or the system's own).
func (s *system) createDatabase(ctx context.Context) error {
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := "storm_" + hex.EncodeToString(b[:])
	conn, err := pgx.Connect(ctx, s.pgAdmin)
	if err != nil {
		return fmt.Errorf("storm: connect to PostgreSQL (BULWARK_TEST_PG; `make test` or scripts/test.sh starts it): %w", err)
	}
	defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		return fmt.Errorf("storm: create database %s: %w", name, err)
	}
	s.database = name
	// Nothing else: the processes must start on an empty database, as a
	// new operator's would (the migrations create the pgvector extension).
	return nil
}

// databaseDSN is the admin DSN pointed at the scenario's database.
func (s *system) databaseDSN() string {
	u, err := url.Parse(s.pgAdmin)
	if err != nil {
		return s.pgAdmin // checked by createDatabase already
	}
	u.Path = "/" + s.database
	return u.String()
}

// dropDatabase drops the scenario's database, whoever is still connected.
func (s *system) dropDatabase() error {
	if s.database == "" || s.pg != nil { // an own server goes with the folder
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, s.pgAdmin)
	if err != nil {
		return fmt.Errorf("storm: drop database %s: %w", s.database, err)
	}
	defer func() { _ = conn.Close(ctx) }()
	if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+s.database+" WITH (FORCE)"); err != nil {
		return fmt.Errorf("storm: drop database %s: %w", s.database, err)
	}
	s.database = ""
	return nil
}

// close stops every process — the api and workers together (the load is
// over), then the own PostgreSQL server (fast shutdown), then the mock,
// then Redis — drops the database and removes the temporary folder unless
// it is kept. Safe to call twice.
func (s *system) close() error {
	var apps, infra []*process
	s.mu.Lock()
	procs := slices.Clone(s.procs)
	s.mu.Unlock()
	for _, p := range procs {
		if isRedis(p.name) || isPostgres(p.name) || p.name == "mock" {
			infra = append(infra, p)
		} else {
			apps = append(apps, p)
		}
	}
	var wg sync.WaitGroup
	for _, p := range apps {
		wg.Go(p.stop)
	}
	wg.Wait()
	// SIGTERM would be a smart shutdown, waiting for every client.
	pgErr := s.stopPostgres()
	s.mu.Lock()
	inMock := s.inMock
	s.inMock = nil
	s.mu.Unlock()
	if inMock != nil {
		inMock.stop()
	}
	for i := len(infra) - 1; i >= 0; i-- {
		infra[i].stop()
	}
	s.failed(errors.New("storm: system closed"))
	err := errors.Join(pgErr, s.dropDatabase())
	if !s.keepDir {
		_ = os.RemoveAll(s.dir)
	}
	return err
}

// tails returns the last n lines of every process's log, headed by its
// name.
func (s *system) tails(n int) string {
	var b strings.Builder
	s.mu.Lock()
	procs := slices.Clone(s.procs)
	inMock := s.inMock
	s.mu.Unlock()
	for _, p := range procs {
		fmt.Fprintf(&b, "----- %s (%s), last %d lines -----\n%s\n", p.name, p.logPath, n, p.tail(n))
	}
	if inMock != nil {
		fmt.Fprintf(&b, "----- mock, in this process (%s), last %d lines -----\n%s\n", inMock.logPath, n, inMock.tail(n))
	}
	return b.String()
}
