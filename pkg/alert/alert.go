// Package alert sends instant operational alerts — a breaker opened, every
// key of a tier is cooling, a key ran out of quota, and their recoveries — to
// group-chat robots (WeCom 企业微信, DingTalk 钉钉) and to generic JSON
// webhooks.
//
// # Throttling
//
// A condition is usually seen by many worker processes at once (ten workers
// watching the same breaker open). Notify therefore takes a Redis key per
// (Kind, Subject) with SET NX PX before it sends, so the same alert goes out
// at most once per Config.Throttle across all processes. Each kind is
// throttled on its own: a recovery (breaker_closed) is never held back
// because its failure (breaker_open) was just sent. The price is that a
// condition flapping faster than Throttle shows only its first open/close
// pair until the window ends; the robots themselves accept only 20 messages
// a minute per robot (and then mute it for ten minutes), so flapping has to
// be damped somewhere. Daily reports (KindDailyReport) are never throttled.
//
// If every sink fails, the throttle key is released so that the next Notify
// of the same alert, from any process, tries again. If Redis is unreachable,
// Notify sends anyway: an alerting path must not go silent because one of
// the things it watches is down; duplicates are the lesser harm.
//
// # Secrets
//
// A robot's webhook URL carries its token (WeCom `key=`, DingTalk
// `access_token=`), and DingTalk's signing secret is a credential. Both are
// secret.String; they appear in no log line, and the errors returned here
// never contain them (net/http's *url.Error, whose text includes the URL, is
// unwrapped and the remaining text is scrubbed).
package alert

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"bulwark/pkg/secret"
)

// Kind names what happened. The throttle is per (Kind, Subject).
type Kind string

// The kinds Bulwark raises. A recovery kind is throttled on its own, never
// against its failure kind.
const (
	// KindBreakerOpen: a circuit breaker opened (3 consecutive 429s, or every
	// provider exhausted). Subject is the breaker name, e.g. "claude/sonnet".
	KindBreakerOpen Kind = "breaker_open"
	// KindBreakerClosed: the breaker closed again (recovery).
	KindBreakerClosed Kind = "breaker_closed"
	// KindTierExhausted: every key of a (provider, tier) is cooling.
	KindTierExhausted Kind = "tier_exhausted"
	// KindTierRecovered: a key of that tier is usable again (recovery).
	KindTierRecovered Kind = "tier_recovered"
	// KindKeyQuotaExhausted: a key was disabled because its quota or billing
	// ran out (OpenAI insufficient_quota, Anthropic spend limit). Subject is
	// the key id, never the key.
	KindKeyQuotaExhausted Kind = "key_quota_exhausted"
	// KindKeyEnabled: a disabled key was enabled again (recovery).
	KindKeyEnabled Kind = "key_enabled"
	// KindGeneric: anything else, e.g. a monitoring threshold crossed.
	KindGeneric Kind = "generic"
	// KindDailyReport carries the daily report in Summary. It is never
	// throttled and rendered verbatim.
	KindDailyReport Kind = "daily_report"
)

// Recovery reports whether k announces the end of a condition.
func (k Kind) Recovery() bool {
	switch k {
	case KindBreakerClosed, KindTierRecovered, KindKeyEnabled:
		return true
	}
	return false
}

// throttled reports whether events of kind k go through the throttle.
func (k Kind) throttled() bool { return k != KindDailyReport }

// Severities of an Event.
const (
	SeverityCritical = "critical"
	SeverityWarning  = "warning"
	SeverityInfo     = "info"
)

// defaultSeverity is the severity of an Event that names none.
func defaultSeverity(k Kind) string {
	switch {
	case k == KindBreakerOpen || k == KindTierExhausted:
		return SeverityCritical
	case k.Recovery() || k == KindDailyReport:
		return SeverityInfo
	}
	return SeverityWarning
}

// Event is one alert.
type Event struct {
	// Kind says what happened; required.
	Kind Kind `json:"kind"`
	// Severity is "critical", "warning" or "info"; empty means the kind's
	// default (critical for breaker_open and tier_exhausted, info for
	// recoveries and reports, warning otherwise).
	Severity string `json:"severity"`
	// Subject is what it happened to: a breaker name ("claude/sonnet"), a
	// tier, or a key id — never a key value. With Kind it forms the
	// throttle key.
	Subject string `json:"subject"`
	// Summary is one human sentence (for KindDailyReport: the whole report
	// as markdown).
	Summary string `json:"summary"`
	// Details are extra facts, rendered sorted by key.
	Details map[string]string `json:"details,omitempty"`
	// At is when it happened; zero means the time of Notify.
	At time.Time `json:"at"`
}

// Webhook is one robot or endpoint.
type Webhook struct {
	// Name labels the sink in logs and errors; default "wecom-0",
	// "dingtalk-1", "generic-0"... by list and position. Not secret.
	Name string
	// URL is the full webhook address including its token. Secret.
	URL secret.String
	// Secret is DingTalk's signing secret (加签, "SEC..."); when set,
	// requests carry timestamp and sign query parameters. Only valid for
	// DingTalk robots.
	Secret secret.String
}

// Defaults of Config.
const (
	ThrottleDefault = 5 * time.Minute
	TimeoutDefault  = 10 * time.Second
	PrefixDefault   = "bulwark:"
	LanguageDefault = "zh-CN"
)

// Config configures a Notifier. Zero fields mean their defaults.
type Config struct {
	// WeCom group robots (企业微信群机器人).
	WeCom []Webhook
	// DingTalk group robots (钉钉自定义机器人).
	DingTalk []Webhook
	// Generic JSON webhooks: the Event is POSTed as JSON, plus a "text"
	// field holding the rendered markdown.
	Generic []Webhook
	// Throttle: the same (Kind, Subject) is sent at most once per Throttle
	// across all processes sharing the Redis. Default 5m; negative disables
	// throttling (and then no Redis client is needed).
	Throttle time.Duration
	// Prefix of the Redis keys. Default "bulwark:".
	Prefix string
	// Timeout bounds each sink's HTTP request. Default 10s.
	Timeout time.Duration
	// Language of the rendered texts: "zh-CN"/"zh" (default) or "en".
	Language string
}

// WithDefaults returns c with its zero fields set to their defaults.
func (c Config) WithDefaults() Config {
	if c.Throttle == 0 {
		c.Throttle = ThrottleDefault
	}
	if c.Prefix == "" {
		c.Prefix = PrefixDefault
	}
	if c.Timeout == 0 {
		c.Timeout = TimeoutDefault
	}
	if c.Language == "" {
		c.Language = LanguageDefault
	}
	return c
}

// Validate reports every field of c (defaults applied) out of range.
func (c Config) Validate() error {
	var errs []error
	if c.Timeout < 0 {
		errs = append(errs, fmt.Errorf("alert: Timeout: must be > 0, got %s", c.Timeout))
	}
	if _, ok := normalizeLang(c.Language); !ok {
		errs = append(errs, fmt.Errorf("alert: Language: %q is not zh-CN or en", c.Language))
	}
	check := func(list string, hooks []Webhook, signing bool) {
		for i, w := range hooks {
			field := fmt.Sprintf("alert: %s[%d]", list, i)
			u, err := url.Parse(w.URL.Reveal())
			// The parse error would quote the URL: say only what is wrong.
			if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
				errs = append(errs, fmt.Errorf("%s.URL: must be an absolute http(s) URL", field))
			}
			if !signing && !w.Secret.IsZero() {
				errs = append(errs, fmt.Errorf("%s.Secret: only DingTalk robots sign requests", field))
			}
		}
	}
	check("WeCom", c.WeCom, false)
	check("DingTalk", c.DingTalk, true)
	check("Generic", c.Generic, false)
	return errors.Join(errs...)
}

// Redis is the part of a Redis client the throttle needs; *redis.Client,
// *redis.ClusterClient and *redis.Ring satisfy it.
type Redis interface {
	SetNX(ctx context.Context, key string, value any, expiration time.Duration) *redis.BoolCmd
	redis.Scripter
}

// Sink is one destination of alerts.
type Sink interface {
	// Send delivers e once. Errors never contain the sink's URL or secret.
	Send(ctx context.Context, e Event) error
}

type namedSink struct {
	name string
	Sink
}

// Notifier sends Events to every configured sink, throttled through Redis.
// It is safe for concurrent use.
type Notifier struct {
	rdb    Redis
	cfg    Config
	sinks  []namedSink
	logger *slog.Logger
}

// New builds a Notifier. rdb may be nil only when cfg.Throttle is negative.
// hc is the HTTP client for all sinks; nil means a client that does not
// follow redirects (a webhook has no business redirecting a POST, and a
// redirect would carry the token elsewhere). A Notifier with no sinks is
// valid and sends nothing.
func New(rdb Redis, cfg Config, hc *http.Client, logger *slog.Logger) (*Notifier, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if rdb == nil && cfg.Throttle > 0 {
		return nil, errors.New("alert: a Redis client is required unless Throttle is negative")
	}
	if hc == nil {
		hc = &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	n := &Notifier{rdb: rdb, cfg: cfg, logger: logger}
	name := func(w Webhook, list string, i int) string {
		if w.Name != "" {
			return w.Name
		}
		return fmt.Sprintf("%s-%d", list, i)
	}
	for i, w := range cfg.WeCom {
		n.sinks = append(n.sinks, namedSink{name(w, "wecom", i), &WeCom{URL: w.URL, Language: cfg.Language, Client: hc}})
	}
	for i, w := range cfg.DingTalk {
		n.sinks = append(n.sinks, namedSink{name(w, "dingtalk", i), &DingTalk{URL: w.URL, Secret: w.Secret, Language: cfg.Language, Client: hc}})
	}
	for i, w := range cfg.Generic {
		n.sinks = append(n.sinks, namedSink{name(w, "generic", i), &Generic{URL: w.URL, Language: cfg.Language, Client: hc}})
	}
	return n, nil
}

// ErrInvalidEvent is returned by Notify for an Event without a Kind or with
// an unknown Severity.
var ErrInvalidEvent = errors.New("alert: invalid event")

// Notify sends e to every sink concurrently, each bounded by
// Config.Timeout, unless the same (Kind, Subject) was sent within
// Config.Throttle by any process; a throttled event returns nil. One failing
// sink does not stop the others; the result joins every sink's error. A nil
// *Notifier sends nothing.
func (n *Notifier) Notify(ctx context.Context, e Event) error {
	if n == nil {
		return nil
	}
	if e.Kind == "" {
		return fmt.Errorf("%w: no kind", ErrInvalidEvent)
	}
	if e.Severity == "" {
		e.Severity = defaultSeverity(e.Kind)
	}
	switch e.Severity {
	case SeverityCritical, SeverityWarning, SeverityInfo:
	default:
		return fmt.Errorf("%w: severity %q", ErrInvalidEvent, e.Severity)
	}
	if e.At.IsZero() {
		e.At = time.Now()
	}
	if len(n.sinks) == 0 {
		return nil
	}
	log := n.logger.With("kind", string(e.Kind), "subject", e.Subject)

	var token string // set when this call holds the throttle key
	if n.cfg.Throttle > 0 && e.Kind.throttled() {
		token = randomToken()
		ok, err := n.rdb.SetNX(ctx, throttleKey(n.cfg.Prefix, e.Kind, e.Subject), token, n.cfg.Throttle).Result()
		switch {
		case err != nil && ctx.Err() != nil:
			return fmt.Errorf("alert: throttle: %w", err)
		case err != nil:
			// Fail open: see the package comment.
			log.Warn("alert: throttle unavailable, sending unthrottled", "err", err)
			token = ""
		case !ok:
			log.Debug("alert: throttled")
			return nil
		}
	}

	errs := make([]error, len(n.sinks))
	var wg sync.WaitGroup
	for i, s := range n.sinks {
		wg.Go(func() {
			sctx, cancel := context.WithTimeout(ctx, n.cfg.Timeout)
			defer cancel()
			if err := s.Send(sctx, e); err != nil {
				errs[i] = fmt.Errorf("alert: sink %s: %w", s.name, err)
				log.Warn("alert: send failed", "sink", s.name, "err", err.Error())
				return
			}
			log.Debug("alert: sent", "sink", s.name)
		})
	}
	wg.Wait()

	failed := 0
	for _, err := range errs {
		if err != nil {
			failed++
		}
	}
	if failed == len(n.sinks) && token != "" {
		n.release(ctx, e, token, log)
	}
	return errors.Join(errs...)
}

// releaseScript deletes a throttle key only if this call still owns it (it
// may have expired and been taken by another process meanwhile).
//
// KEYS[1] throttle key; ARGV[1] owner token.
// Reply: integer 1 if deleted, 0 otherwise.
var releaseScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0`)

// release gives the throttle back after every sink failed, so the next
// Notify of the same alert retries instead of staying silent for Throttle.
func (n *Notifier) release(ctx context.Context, e Event, token string, log *slog.Logger) {
	// The caller's context may have ended with the sends; release anyway.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	res, err := releaseScript.Run(ctx, n.rdb, []string{throttleKey(n.cfg.Prefix, e.Kind, e.Subject)}, token).Result()
	if err != nil {
		log.Warn("alert: release throttle", "err", err)
		return
	}
	if _, ok := res.(int64); !ok {
		log.Warn("alert: release throttle: unexpected reply", "type", fmt.Sprintf("%T", res))
	}
}

// throttleKey is the one Redis key builder of this package:
// <prefix>alert:throttle:<kind>:<subject>. Long subjects are hashed to keep
// keys short.
func throttleKey(prefix string, k Kind, subject string) string {
	if len(subject) > 128 {
		h := sha256.Sum256([]byte(subject))
		subject = "sha256:" + hex.EncodeToString(h[:])
	}
	return prefix + "alert:throttle:" + string(k) + ":" + subject
}

func randomToken() string {
	b := make([]byte, 12)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// normalizeLang maps a language tag to "zh" or "en".
func normalizeLang(lang string) (string, bool) {
	l := strings.ToLower(strings.TrimSpace(lang))
	switch {
	case l == "" || l == "zh" || strings.HasPrefix(l, "zh-") || strings.HasPrefix(l, "zh_"):
		return "zh", true
	case l == "en" || strings.HasPrefix(l, "en-") || strings.HasPrefix(l, "en_"):
		return "en", true
	}
	return "", false
}
