// Command api is Bulwark's HTTP API: it accepts requests, answers from the
// semantic cache, enqueues the rest by priority, and streams progress.
package main

import (
	"context"
	"errors"
	"net/http"
	"sync"

	"bulwark/pkg/service"
)

func main() {
	ctx, stop, b, err := service.Setup("api")
	if err != nil {
		service.Fatal("api", err)
	}
	defer stop()
	defer b.Close()

	handler, hub := b.API()
	srv := b.HTTPServer(b.Cfg.Server.Listen, handler)
	hubCtx, stopHub := context.WithCancel(context.WithoutCancel(ctx))
	var wg sync.WaitGroup
	wg.Go(func() { _ = hub.Run(hubCtx) })
	if b.Cache != nil {
		_ = b.Cache.Start(hubCtx)
	}

	errc := make(chan error, 1)
	go func() { errc <- srv.ListenAndServe() }()
	b.Logger.Info("listening", "addr", b.Cfg.Server.Listen)
	select {
	case err = <-errc:
	case <-ctx.Done():
	}
	// Shutdown order: stop accepting, let handlers finish (streams end with
	// the hub), then close the clients (deferred Close).
	shutCtx, cancel := context.WithTimeout(context.Background(), b.Cfg.Server.ShutdownTimeout)
	defer cancel()
	stopHub()
	_ = srv.Shutdown(shutCtx)
	wg.Wait()
	if err != nil && !errors.Is(err, http.ErrServerClosed) {
		service.Fatal("api", err)
	}
}
