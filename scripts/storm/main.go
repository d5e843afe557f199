// Command storm runs Bulwark's storm benchmark (pkg/testkit/storm): the built api,
// two workers and the mock provider as separate processes, with a
// redis-server of their own and a fresh database on the test PostgreSQL
// server ($BULWARK_TEST_PG), driven over HTTP.
//
//	go run ./scripts/storm [-scenarios S1,S1-slow,S1-slow-async,S2,S1-fallback,S3-mixed,F1-fleet-async,F1-fleet-compat] [-n 400] [-clients 50]
//
// It prints one line per scenario, then the targets missed, and exits 1 if
// any was. `make bench` runs the same code through TestStormBench with the
// test services started. Ctrl-C stops every process it started.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"bulwark/pkg/testkit/storm"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := storm.Main(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
