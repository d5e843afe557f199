// Package httpapi is Bulwark's HTTP surface (gin): the async request API
// with Server-Sent-Event progress, the OpenAI- and Anthropic-compatible
// endpoints, health, metrics and the admin endpoints. Handlers only
// translate HTTP: the work is in pkg/intake (accepting), pkg/job (state),
// pkg/progress (streams) and the layer packages.
package httpapi

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"runtime/debug"
	"time"

	"github.com/gin-gonic/gin"

	"bulwark/pkg/breaker"
	"bulwark/pkg/history"
	"bulwark/pkg/intake"
	"bulwark/pkg/job"
	"bulwark/pkg/keypool"
	"bulwark/pkg/llm"
	"bulwark/pkg/progress"
	"bulwark/pkg/queue"
	"bulwark/pkg/recent"
	"bulwark/pkg/secret"
)

// Jobs is the live request store.
type Jobs interface {
	Get(ctx context.Context, id string) (*job.Record, error)
	StatusOf(ctx context.Context, id string) (job.Status, error)
	Apply(ctx context.Context, id string, c job.Change) (string, error)
	Events(ctx context.Context, id, after string) ([]job.Event, error)
	// Unjoin ends request id's hold on a compat call's join key once its
	// answer was delivered (job.Store.Unjoin).
	Unjoin(ctx context.Context, key, id string) error
}

// Queue is what the API needs of the queues.
type Queue interface {
	SpotOf(ctx context.Context, id string) (queue.Spot, error)
}

// History reads requests whose live record expired.
type History interface {
	Get(ctx context.Context, id string) (*history.Row, error)
}

// KeyAdmin is the admin side of the key pool.
type KeyAdmin interface {
	Snapshot(ctx context.Context) ([]keypool.KeyState, error)
	Enable(ctx context.Context, keyID string) error
	Disable(ctx context.Context, keyID, reason string) error
}

// BreakerAdmin is the admin side of the breakers.
type BreakerAdmin interface {
	List(ctx context.Context) ([]breaker.Status, error)
	Reset(ctx context.Context, name string) error
}

// CacheAdmin invalidates cache entries.
type CacheAdmin interface {
	InvalidateCase(ctx context.Context, tenant, caseID string) (int64, error)
	InvalidateNamespace(ctx context.Context, tenant, layer string) (int64, error)
}

// Reporter builds the daily report on demand.
type Reporter interface {
	ReportJSON(ctx context.Context, from, to time.Time) (any, error)
}

// Pinger checks a dependency for /readyz.
type Pinger func(ctx context.Context) error

// Models resolves a compat endpoint's model name to a route.
type Models interface {
	Resolve(model string) (llm.Route, bool)
	// List returns every name Resolve accepts, sorted by ID (GET
	// /v1/models); the caller does not change it.
	List() []llm.Model
}

// Config configures the API.
type Config struct {
	// AdminApart serves the admin endpoints on a handler of their own
	// (server.admin_listen) instead of beside the tenants' ones.
	AdminApart bool
	// Tenants by the hex SHA-256 of their token.
	Tenants    map[string]intake.Tenant
	AdminToken secret.String
	// MaxBodyBytes bounds a request body (413 beyond). Default
	// MaxBodyBytesDefault (1 MiB).
	MaxBodyBytes int64
	// MaxWait is the longest a request waits to start before it fails
	// (queue_max_wait): it bounds a still_queued Retry-After, and is
	// SyncTimeout's default. Default queue.MaxWaitDefault (300s).
	MaxWait time.Duration
	// SyncTimeout is how long the compat endpoints wait for an answer
	// before a 429 still_queued. Default MaxWait: a request that will
	// still be answered is not turned into a 429 while it waits its turn
	// (pkg/config adds the longest provider call to it).
	SyncTimeout time.Duration
	// KeepAlive of SSE streams (comment lines). Default KeepAliveDefault
	// (15s).
	KeepAlive time.Duration
	// WriteTimeout bounds each write of every response (a JSON body, a
	// compat answer, an SSE event or keep-alive): a client that stops
	// reading is dropped after it and its slots freed (writeDeadlines).
	// Waiting before the first byte is not bounded by it. Default
	// WriteTimeoutDefault (30s).
	WriteTimeout time.Duration
	// StreamMaxLifetime ends an SSE stream after this long (the client
	// reconnects with Last-Event-ID). Default StreamMaxLifetimeDefault
	// (15m).
	StreamMaxLifetime time.Duration
}

// Defaults of Config.
const (
	MaxBodyBytesDefault      = 1 << 20
	KeepAliveDefault         = 15 * time.Second
	WriteTimeoutDefault      = 30 * time.Second
	StreamMaxLifetimeDefault = 15 * time.Minute
)

// WithDefaults returns c with its zero fields set to their defaults.
func (c Config) WithDefaults() Config {
	if c.MaxBodyBytes == 0 {
		c.MaxBodyBytes = MaxBodyBytesDefault
	}
	if c.MaxWait == 0 {
		c.MaxWait = queue.MaxWaitDefault
	}
	if c.SyncTimeout == 0 {
		c.SyncTimeout = c.MaxWait
	}
	if c.KeepAlive == 0 {
		c.KeepAlive = KeepAliveDefault
	}
	if c.WriteTimeout == 0 {
		c.WriteTimeout = WriteTimeoutDefault
	}
	if c.StreamMaxLifetime == 0 {
		c.StreamMaxLifetime = StreamMaxLifetimeDefault
	}
	return c
}

// Validate reports the first field of c (defaults applied) out of range.
func (c Config) Validate() error {
	for _, f := range []struct {
		name string
		v    int64
	}{{"MaxBodyBytes", c.MaxBodyBytes}, {"MaxWait", int64(c.MaxWait)}, {"SyncTimeout", int64(c.SyncTimeout)}, {"KeepAlive", int64(c.KeepAlive)},
		{"WriteTimeout", int64(c.WriteTimeout)}, {"StreamMaxLifetime", int64(c.StreamMaxLifetime)}} {
		if f.v <= 0 {
			return fmt.Errorf("httpapi: Config.%s must be positive", f.name)
		}
	}
	return nil
}

// Deps are the server's collaborators. Optional ones may be nil.
type Deps struct {
	Intake   *intake.Intake
	Jobs     Jobs
	Queue    Queue
	Hub      *progress.Hub
	History  History      // optional
	Keys     KeyAdmin     // optional
	Breakers BreakerAdmin // optional
	Cache    CacheAdmin   // optional
	Reporter Reporter     // optional
	Models   Models       // optional: compat endpoints off without it
	Metrics  http.Handler // optional: /metrics, behind the admin token, on the admin listener when apart
	Queues   http.Handler // optional: asynqmon under /admin/queues
	// Profiles, optional, serves net/http/pprof under /debug/pprof/; it
	// is mounted at /admin/debug/pprof/, behind the admin token.
	Profiles http.Handler
	// Ready are the dependencies without which the API cannot serve:
	// /readyz answers 503 while one is down. They are checked at most once
	// a second, however many probes come (readyMaxAge).
	Ready map[string]Pinger
	// Degradable are those it serves without (PostgreSQL: cache and
	// history are bypassed): /readyz stays 200 and, to the admin token,
	// names them in "degraded", so that a load balancer keeps the API in
	// rotation.
	Degradable map[string]Pinger
	Logger     *slog.Logger
}

// Server is the HTTP API.
type Server struct {
	cfg Config
	d   Deps
	// streams and waits count each tenant's open event streams and
	// synchronous compat waits (intake.Tenant.MaxStreams, MaxSyncWaits).
	streams, waits *gate
	reads          *readLimits // intake.Tenant.MaxReadsPerSecond
	// readiness is /readyz's cached check, shared by both listeners.
	readiness *recent.Value[readiness]
}

// New returns the API's handlers: the tenants' one, with the admin
// endpoints too unless Config.AdminApart, and then the admin one (nil
// otherwise). Both serve the health endpoints.
func New(cfg Config, d Deps) (api, admin http.Handler) {
	cfg = cfg.WithDefaults()
	s := &Server{cfg: cfg, d: d, streams: newGate(), waits: newGate(), reads: newReadLimits(),
		readiness: newReadiness(d.Ready, d.Degradable)}

	r := s.engine()
	s.publicRoutes(r)
	if !cfg.AdminApart {
		s.adminRoutes(r)
		return r, nil
	}
	// The tenants' listener keeps no trace of /admin or /metrics: 404 like
	// any path.
	a := s.engine()
	s.adminRoutes(a)
	return r, a
}

// engine is a router with the recovery, the request log, JSON 404/405
// answers and the health endpoints: /healthz and /readyz answer without a
// token (load balancers send none); /readyz's details want the admin
// token.
func (s *Server) engine() *gin.Engine {
	r := gin.New()
	// Route breakers are named "provider/tier": an escaped slash
	// (claude%2Fsonnet) must reach :name whole, not split the path.
	r.UseRawPath = true
	r.Use(s.writeDeadlines, gin.CustomRecoveryWithWriter(io.Discard, s.recovered), s.logRequests)
	r.HandleMethodNotAllowed = true
	r.NoRoute(func(c *gin.Context) { apiError(c, http.StatusNotFound, "not_found", "", "no such endpoint") })
	r.NoMethod(func(c *gin.Context) {
		apiError(c, http.StatusMethodNotAllowed, "method_not_allowed", "", "method not allowed")
	})
	r.GET("/healthz", healthz)
	r.GET("/readyz", s.ready)
	return r
}

// publicRoutes are the tenants' endpoints.
func (s *Server) publicRoutes(r *gin.Engine) {
	r.GET("/openapi.json", serveOpenAPI)
	v1 := r.Group("/v1", s.limitBody, s.auth)
	v1.POST("/requests", s.submit)
	v1.GET("/requests/:id", s.readLimit, s.get)
	v1.GET("/requests/:id/events", s.readLimit, s.events)
	v1.DELETE("/requests/:id", s.cancel)
	if s.d.Models != nil {
		v1.POST("/chat/completions", s.openAIChat)
		v1.POST("/responses", s.openAIResponses)
		v1.POST("/messages", s.anthropicMessages)
		v1.POST("/messages/count_tokens", s.readLimit, s.countTokens)
		v1.GET("/models", s.readLimit, s.listModels)
		v1.GET("/models/:id", s.readLimit, s.getModel)
	}
}

// adminRoutes are the operators' endpoints, all behind the admin token,
// on whichever listener they are served: /metrics (its scrape reads every
// tenant's queue, the keys and the breakers from Redis; Prometheus sends
// the token as a bearer token) and /admin. An admin endpoint exists only
// when its part is configured; otherwise it answers 404 like any unknown
// path.
func (s *Server) adminRoutes(r *gin.Engine) {
	d := s.d
	if d.Metrics != nil {
		r.GET("/metrics", s.adminAuth, gin.WrapH(d.Metrics))
	}
	admin := r.Group("/admin", s.limitBody, s.adminAuth, sameSite)
	if d.Keys != nil {
		admin.GET("/keys", s.adminKeys)
		admin.POST("/keys/:id/enable", jsonOnly, s.adminEnableKey)
		admin.POST("/keys/:id/disable", jsonOnly, s.adminDisableKey)
	}
	if d.Breakers != nil {
		admin.GET("/breakers", s.adminBreakers)
		admin.POST("/breakers/:name/reset", jsonOnly, s.adminResetBreaker)
	}
	if d.Cache != nil {
		admin.POST("/cache/invalidate", jsonOnly, s.adminInvalidate)
	}
	if d.Reporter != nil {
		admin.GET("/report", s.adminReport)
	}
	if d.Queues != nil {
		admin.Any("/queues/*path", gin.WrapH(d.Queues))
		admin.GET("/queues", gin.WrapH(d.Queues))
	}
	if d.Profiles != nil {
		admin.GET("/debug/pprof/*path", gin.WrapH(http.StripPrefix("/admin", d.Profiles)))
	}
}

func (s *Server) logRequests(c *gin.Context) {
	start := time.Now()
	c.Next()
	attrs := []any{"method", c.Request.Method, "path", c.FullPath(), "status", c.Writer.Status(),
		"duration_ms", time.Since(start).Milliseconds()}
	if id, ok := c.Get(ctxRequestID); ok {
		attrs = append(attrs, "request_id", id)
	}
	if t, ok := c.Get(ctxTenant); ok {
		attrs = append(attrs, "tenant", t.(intake.Tenant).Name)
	}
	s.d.Logger.Info("http", attrs...)
}

// recovered answers a handler's panic with a 500 and logs it through the
// JSON logger. gin's own recovery writes a dump of the request to stderr,
// which masks Authorization but not the x-api-key header the Anthropic SDK
// sends its token in, and is not a JSON line.
func (s *Server) recovered(c *gin.Context, err any) {
	s.d.Logger.Error("http: handler panicked", "method", c.Request.Method, "path", c.FullPath(),
		"panic", fmt.Sprint(err), "stack", string(debug.Stack()))
	routeError(c, http.StatusInternalServerError, "internal_error", "internal error")
}

const (
	ctxTenant    = "bulwark.tenant"
	ctxRequestID = "bulwark.request_id"
)

// readLimit holds a tenant to its reads per second on this process
// (intake.Tenant.MaxReadsPerSecond): 429 with Retry-After past it.
func (s *Server) readLimit(c *gin.Context) {
	t := tenantOf(c)
	if s.reads.allow(t.Name, t.MaxReadsPerSecond) {
		c.Next()
		return
	}
	setRetryAfter(c, time.Second)
	routeError(c, http.StatusTooManyRequests, "tenant_read_rate_limited",
		fmt.Sprintf("this tenant reads more than %d times a second on this server; poll less often, or follow the request's event stream", t.MaxReadsPerSecond))
}

// limitBody caps request bodies; reading past the cap fails with
// *http.MaxBytesError, answered 413.
func (s *Server) limitBody(c *gin.Context) {
	if c.Request.ContentLength > s.cfg.MaxBodyBytes {
		routeError(c, http.StatusRequestEntityTooLarge, "body_too_large",
			fmt.Sprintf("request body exceeds the limit of %d bytes", s.cfg.MaxBodyBytes))
		return
	}
	c.Request.Body = http.MaxBytesReader(c.Writer, c.Request.Body, s.cfg.MaxBodyBytes)
	c.Next()
}

// routeError answers in the error format of the endpoint the request was
// routed to: a compat endpoint's SDK only understands its own format, even
// for errors found before the handler runs (body limit, auth).
func routeError(c *gin.Context, status int, code, msg string) {
	switch c.FullPath() {
	case "/v1/chat/completions", "/v1/responses":
		openAIError(c, status, code, msg)
	case "/v1/messages", "/v1/messages/count_tokens":
		anthropicError(c, status, code, msg)
	case "/v1/models", "/v1/models/:id":
		modelsError(c, status, code, msg)
	default:
		apiError(c, status, code, "", msg)
	}
}

// errorBody is the JSON error of the async API.
type errorBody struct {
	Error struct {
		Type    string `json:"type"`
		Message string `json:"message"`
		Field   string `json:"field,omitempty"`
	} `json:"error"`
}

func apiError(c *gin.Context, status int, typ, field, msg string) {
	var b errorBody
	b.Error.Type, b.Error.Field, b.Error.Message = typ, field, msg
	c.AbortWithStatusJSON(status, b)
}

// isBodyTooLarge reports whether err came from the body limit.
func isBodyTooLarge(err error) bool {
	var mb *http.MaxBytesError
	return errors.As(err, &mb)
}
