package service

import (
	"net/http"
	"net/http/pprof"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

func promHandler(reg *prometheus.Registry) http.Handler {
	return promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg})
}

// profilesPrefix is where net/http/pprof expects its pages (its Index
// reads the profile's name after this exact prefix).
const profilesPrefix = "/debug/pprof/"

// profiles serves Go's runtime profiles (net/http/pprof) under
// /debug/pprof/: CPU, heap, block, mutex and goroutine profiles of a
// running process, for `go tool pprof`. Block and mutex profiles are
// empty unless profiling.block_rate / mutex_fraction are set.
func profiles() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc(profilesPrefix, pprof.Index)
	mux.HandleFunc(profilesPrefix+"cmdline", pprof.Cmdline)
	mux.HandleFunc(profilesPrefix+"profile", pprof.Profile)
	mux.HandleFunc(profilesPrefix+"symbol", pprof.Symbol)
	mux.HandleFunc(profilesPrefix+"trace", pprof.Trace)
	return mux
}
