// Command api is Bulwark's HTTP API: it accepts requests, answers from the
// semantic cache, enqueues the rest by priority, and streams progress.
package main

import (
	"context"
	"errors"
	"net/http"
	"sync"

	"github.com/gin-gonic/gin"

	"bulwark/pkg/service"
)

func main() {
	// gin's mode is process-wide: set here, by the process, not by a package.
	gin.SetMode(gin.ReleaseMode)
	if err := run(); err != nil {
		service.Fatal("api", err)
	}
}

// run serves until SIGINT or SIGTERM; everything it opens is closed when it
// returns, error or not.
func run() error {
	ctx, stop, b, err := service.Setup("api")
	if err != nil {
		return err
	}
	defer stop()
	defer b.Close()

	handler, admin, hub := b.API()
	srv := b.HTTPServer(b.Cfg.Server.Listen, handler)
	servers := []*http.Server{srv}
	if admin != nil {
		servers = append(servers, b.HTTPServer(b.Cfg.Server.AdminListen, admin))
	}
	hubCtx, stopHub := context.WithCancel(context.WithoutCancel(ctx))
	var wg sync.WaitGroup
	wg.Go(func() { _ = hub.Run(hubCtx) })
	if b.Cache != nil {
		_ = b.Cache.Start(hubCtx)
	}

	errc := make(chan error, len(servers))
	for _, s := range servers {
		go func() { errc <- s.ListenAndServe() }()
		b.Logger.Info("listening", "addr", s.Addr)
	}
	select {
	case err = <-errc:
	case <-ctx.Done():
	}
	// Shutdown order: stop accepting, let handlers finish (streams end with
	// the hub), then close the clients (deferred Close).
	shutCtx, cancel := context.WithTimeout(context.Background(), b.Cfg.Server.ShutdownTimeout)
	defer cancel()
	stopHub()
	for _, s := range servers {
		_ = s.Shutdown(shutCtx)
	}
	wg.Wait()
	if err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
