// Command mockprovider serves the mock LLM provider (pkg/testkit/mockprovider) that
// `make run`, tests and benchmarks talk to instead of Anthropic and OpenAI.
//
//	go run ./scripts/mockprovider -addr 127.0.0.1:8090 -rpm 600 -tpm 200000 -window 1s -latency 300ms
//
// Each flag but -refund-openai falls back to an environment variable:
// BULWARK_MOCK_ADDR, BULWARK_MOCK_RPM, BULWARK_MOCK_TPM, BULWARK_MOCK_ITPM,
// BULWARK_MOCK_OTPM, BULWARK_MOCK_WINDOW,
// BULWARK_MOCK_LATENCY, BULWARK_MOCK_JITTER, BULWARK_MOCK_STREAM_FIRST_TOKEN,
// BULWARK_MOCK_STREAM_CHUNK_INTERVAL, BULWARK_MOCK_STREAM_CHUNK_TOKENS.
// -window is the enforcement window of the limits
// (mockprovider.Config.Window): with the default 1s a 600-RPM key takes 10
// calls at once, as the real providers quantize; 1m gives whole-minute
// buckets. The -stream-* flags pace streamed answers (stream=true): time to
// first token (0 follows -latency), gap between chunks, tokens per chunk.
// It stops on SIGINT or SIGTERM.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"bulwark/pkg/testkit/mockprovider"
)

// shutdownTimeout bounds the drain of in-flight answers at stop.
const shutdownTimeout = 10 * time.Second

func main() {
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	if err := run(log); err != nil {
		log.Error("mock provider failed", "err", err)
		os.Exit(1)
	}
}

func run(log *slog.Logger) error {
	var cfg mockprovider.Config
	addr := flag.String("addr", envString("BULWARK_MOCK_ADDR", "127.0.0.1:8090"), "listen address (env BULWARK_MOCK_ADDR)")
	flag.IntVar(&cfg.DefaultLimits.RPM, "rpm", envInt("BULWARK_MOCK_RPM", 600), "requests per minute per key, 0 = unlimited (env BULWARK_MOCK_RPM)")
	flag.IntVar(&cfg.DefaultLimits.TPM, "tpm", envInt("BULWARK_MOCK_TPM", 200000), "tokens per minute per key, 0 = unlimited (env BULWARK_MOCK_TPM)")
	flag.IntVar(&cfg.DefaultLimits.ITPM, "itpm", envInt("BULWARK_MOCK_ITPM", 0),
		"Anthropic input tokens per minute per key, 0 = none (env BULWARK_MOCK_ITPM)")
	flag.IntVar(&cfg.DefaultLimits.OTPM, "otpm", envInt("BULWARK_MOCK_OTPM", 0),
		"Anthropic output tokens per minute per key, max_tokens charged at admission, 0 = none (env BULWARK_MOCK_OTPM)")
	flag.BoolVar(&cfg.RefundOpenAI, "refund-openai", false,
		"give the unused max_tokens back after an OpenAI/Azure answer (OpenAI documents no refund; default off)")
	flag.DurationVar(&cfg.Window, "window", envDuration("BULWARK_MOCK_WINDOW", mockprovider.WindowDefault),
		"enforcement window of the limits, at most 1m: buckets hold rpm×window/1m (env BULWARK_MOCK_WINDOW)")
	flag.DurationVar(&cfg.Latency, "latency", envDuration("BULWARK_MOCK_LATENCY", 300*time.Millisecond), "latency before each answer (env BULWARK_MOCK_LATENCY)")
	flag.DurationVar(&cfg.LatencyJitter, "jitter", envDuration("BULWARK_MOCK_JITTER", 0), "latency spread ± (env BULWARK_MOCK_JITTER)")
	flag.DurationVar(&cfg.StreamFirstToken, "stream-first-token", envDuration("BULWARK_MOCK_STREAM_FIRST_TOKEN", 0),
		"streamed answers: admission to first content chunk, 0 = the latency, negative = none (env BULWARK_MOCK_STREAM_FIRST_TOKEN)")
	flag.DurationVar(&cfg.StreamChunkInterval, "stream-chunk-interval",
		envDuration("BULWARK_MOCK_STREAM_CHUNK_INTERVAL", mockprovider.StreamChunkIntervalDefault),
		"streamed answers: gap between content chunks, negative = none (env BULWARK_MOCK_STREAM_CHUNK_INTERVAL)")
	flag.IntVar(&cfg.StreamChunkTokens, "stream-chunk-tokens", envInt("BULWARK_MOCK_STREAM_CHUNK_TOKENS", mockprovider.StreamChunkTokensDefault),
		"streamed answers: tokens (4 bytes each) per content chunk (env BULWARK_MOCK_STREAM_CHUNK_TOKENS)")
	flag.Parse()
	cfg.Logger = log

	mock, err := mockprovider.New(cfg)
	if err != nil {
		return fmt.Errorf("configuring the mock provider: %w", err)
	}
	srv := &http.Server{Addr: *addr, Handler: mock, ReadHeaderTimeout: 10 * time.Second, ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	errc := make(chan error, 1)
	go func() { errc <- srv.ListenAndServe() }()
	log.Info("mock provider listening", "addr", *addr, "rpm", cfg.DefaultLimits.RPM, "tpm", cfg.DefaultLimits.TPM,
		"itpm", cfg.DefaultLimits.ITPM, "otpm", cfg.DefaultLimits.OTPM, "refund_openai", cfg.RefundOpenAI,
		"window", cfg.Window, "latency", cfg.Latency, "jitter", cfg.LatencyJitter, "stream_first_token", cfg.StreamFirstToken,
		"stream_chunk_interval", cfg.StreamChunkInterval, "stream_chunk_tokens", cfg.StreamChunkTokens)

	select {
	case err := <-errc:
		return fmt.Errorf("listen on %s: %w", *addr, err)
	case <-ctx.Done():
	}
	// Shutdown order: release requests hanging on a timeout fault (they
	// would hold Shutdown until its deadline), then stop intake and drain.
	log.Info("mock provider stopping")
	mock.Close()
	sctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		return fmt.Errorf("shutdown: %w", err)
	}
	if err := <-errc; !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serve: %w", err)
	}
	return nil
}

func envString(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// envInt and envDuration exit on a malformed value rather than silently
// using the default.
func envInt(name string, def int) int {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s=%q: want an integer\n", name, v)
		os.Exit(2)
	}
	return n
}

func envDuration(name string, def time.Duration) time.Duration {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s=%q: want a duration such as 300ms\n", name, v)
		os.Exit(2)
	}
	return d
}
