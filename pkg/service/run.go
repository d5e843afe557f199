package service

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"runtime"
	"syscall"

	"github.com/redis/go-redis/v9"

	"bulwark/pkg/config"
	"bulwark/pkg/redisconn"
)

// Setup loads the configuration named by BULWARK_CONFIG (or config.yaml),
// builds the logger and opens the shared components. It returns a context
// cancelled on SIGINT or SIGTERM.
func Setup(process string) (context.Context, context.CancelFunc, *Base, error) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	cfg, err := config.Load(config.File())
	if err != nil {
		stop()
		return nil, nil, nil, err
	}
	logger := NewLogger(cfg.Log).With("process", process)
	runtime.SetBlockProfileRate(cfg.Profiling.BlockRate)
	runtime.SetMutexProfileFraction(cfg.Profiling.MutexFraction)
	redis.SetLogger(redisconn.NewLogger(logger)) // process-wide too: its pools' dial failures
	b, err := Open(ctx, cfg, logger)
	if err != nil {
		stop()
		return nil, nil, nil, fmt.Errorf("%s: %w", process, err)
	}
	logger.Info("started", "config", config.File())
	return ctx, stop, b, nil
}

// Fatal logs err and exits 1. os.Exit runs no deferred call: a main calls
// it only after the function that opened things (its run) has returned and
// closed them.
func Fatal(process string, err error) {
	slog.Error(process+" failed", "err", err)
	os.Exit(1)
}
