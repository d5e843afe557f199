package azure

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/policy"
	"github.com/Azure/azure-sdk-for-go/sdk/azidentity"
)

// credential is an azcore.TokenCredential of tests: each GetToken returns
// the next token, valid for lifetime from the test clock.
type credential struct {
	clock    *clock
	lifetime time.Duration
	refresh  time.Duration // RefreshOn after issue; 0: none
	err      error
	calls    atomic.Int32
	scopes   chan []string
	// entered and release, when set, hold each GetToken until released.
	entered chan struct{}
	release chan struct{}
}

func (c *credential) GetToken(ctx context.Context, opts policy.TokenRequestOptions) (azcore.AccessToken, error) {
	n := c.calls.Add(1)
	if c.scopes != nil {
		c.scopes <- opts.Scopes
	}
	if c.entered != nil {
		c.entered <- struct{}{}
		select {
		case <-c.release:
		case <-ctx.Done():
			return azcore.AccessToken{}, ctx.Err()
		}
	}
	if c.err != nil {
		return azcore.AccessToken{}, c.err
	}
	now := c.clock.now()
	tok := azcore.AccessToken{Token: "token-" + string(rune('0'+n)), ExpiresOn: now.Add(c.lifetime)}
	if c.refresh > 0 {
		tok.RefreshOn = now.Add(c.refresh)
	}
	return tok, nil
}

// clock is a settable clock.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func newSource(cred *credential) *CredentialSource {
	s := NewCredentialSource(cred)
	s.now = cred.clock.now
	return s
}

func token(t *testing.T, s TokenSource) string {
	t.Helper()
	tok, err := s.Token(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func TestCredentialSourceCaches(t *testing.T) {
	t.Parallel()
	clk := &clock{t: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)}
	cred := &credential{clock: clk, lifetime: time.Hour, scopes: make(chan []string, 8)}
	s := newSource(cred)
	for _, step := range []struct {
		advance time.Duration
		want    string
	}{
		{0, "token-1"},
		{54 * time.Minute, "token-1"}, // 6 min left
		{time.Minute, "token-2"},      // 5 min left: replaced
		{0, "token-2"},
	} {
		clk.advance(step.advance)
		if got := token(t, s); got != step.want {
			t.Fatalf("after %s: %s, want %s", step.advance, got, step.want)
		}
	}
	if got := <-cred.scopes; len(got) != 1 || got[0] != EntraScope {
		t.Errorf("scopes %v, want [%s]", got, EntraScope)
	}
	s.Invalidate()
	if got := token(t, s); got != "token-3" {
		t.Errorf("after Invalidate: %s, want a new token", got)
	}
}

func TestCredentialSourceRefreshOn(t *testing.T) {
	t.Parallel()
	clk := &clock{t: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)}
	// RefreshOn wins over the margin; a short-lived token is kept for half
	// its life, not refetched on every call.
	s := newSource(&credential{clock: clk, lifetime: time.Hour, refresh: 10 * time.Minute})
	token(t, s)
	clk.advance(10 * time.Minute)
	if got := token(t, s); got != "token-2" {
		t.Errorf("at RefreshOn: %s, want a new token", got)
	}
	short := newSource(&credential{clock: clk, lifetime: 4 * time.Minute})
	token(t, short)
	clk.advance(119 * time.Second)
	if got := token(t, short); got != "token-1" {
		t.Errorf("a 4-minute token refetched after 119 s: %s", got)
	}
	clk.advance(time.Second)
	if got := token(t, short); got != "token-2" {
		t.Errorf("a 4-minute token kept past half its life: %s", got)
	}
}

// However many calls need a token at once, one is fetched; a caller that
// gives up while another fetches gets its context's error.
func TestCredentialSourceOneFetch(t *testing.T) {
	t.Parallel()
	clk := &clock{t: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)}
	cred := &credential{clock: clk, lifetime: time.Hour, entered: make(chan struct{}, 1), release: make(chan struct{})}
	s := newSource(cred)

	const callers = 8
	var wg sync.WaitGroup
	got := make(chan string, callers)
	for range callers {
		wg.Go(func() {
			tok, err := s.Token(t.Context())
			if err != nil {
				t.Error(err)
			}
			got <- tok
		})
	}
	<-cred.entered // one caller is fetching and holds the right to

	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := s.Token(ctx); !errors.Is(err, context.Canceled) {
		t.Errorf("a caller that gave up: %v, want context.Canceled", err)
	}

	close(cred.release)
	wg.Wait()
	close(got)
	for tok := range got {
		if tok != "token-1" {
			t.Errorf("a caller got %q, want token-1", tok)
		}
	}
	if n := cred.calls.Load(); n != 1 {
		t.Errorf("%d fetches, want 1", n)
	}
}

func TestCredentialErrors(t *testing.T) {
	t.Parallel()
	failed := func(status int) error {
		return &azidentity.AuthenticationFailedError{RawResponse: &http.Response{
			StatusCode: status, Status: http.StatusText(status), Body: io.NopCloser(strings.NewReader(`{"error":"invalid_client"}`)),
		}}
	}
	for _, tt := range []struct {
		name     string
		err      error
		rejected bool
	}{
		{"no credential in this environment", azidentity.NewCredentialUnavailableError("DefaultAzureCredential: failed to acquire a token"), true},
		{"a wrong client secret", failed(http.StatusBadRequest), true},
		{"the identity platform throttles", failed(http.StatusTooManyRequests), false},
		{"the identity platform fails", failed(http.StatusServiceUnavailable), false},
		{"no answer", errors.New("dial tcp: i/o timeout"), false},
	} {
		clk := &clock{t: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)}
		_, err := newSource(&credential{clock: clk, err: tt.err}).Token(t.Context())
		if err == nil || errors.Is(err, ErrCredentialRejected) != tt.rejected || !errors.Is(err, tt.err) {
			t.Errorf("%s: %v; want rejected %t, wrapping the credential's error", tt.name, err, tt.rejected)
		}
	}
}

// The default source is built without contacting anyone.
func TestNewDefaultTokenSource(t *testing.T) {
	t.Parallel()
	s, err := NewDefaultTokenSource(nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(s.scopes) != 1 || s.scopes[0] != EntraScope {
		t.Errorf("scopes %v", s.scopes)
	}
	if err := (Config{Auth: AuthEntra, Token: s}).Validate(); err != nil {
		t.Error(err)
	}
}
