package azure

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/policy"
	"github.com/Azure/azure-sdk-for-go/sdk/azidentity"
)

// EntraScope is the OAuth 2.0 scope of the Microsoft Entra ID tokens Azure
// OpenAI accepts ("Authorization: Bearer"), as Microsoft's SDKs request it.
const EntraScope = "https://cognitiveservices.azure.com/.default"

// ErrCredentialRejected marks a TokenSource error that waiting will not
// cure: the identity platform refused the credential, or no credential is
// configured at all. Complete reports it as auth; any other TokenSource
// error is transient.
var ErrCredentialRejected = errors.New("azure: the Microsoft Entra ID credential was refused or is not configured")

// TokenSource supplies the bearer tokens of Auth entra: Microsoft Entra ID
// access tokens for EntraScope. Token is called once per call, so an
// implementation caches its token (CredentialSource does). An error
// wrapping ErrCredentialRejected is an auth failure, any other a transient
// one. A TokenSource that also has a method Invalidate() is told when Azure
// answered 401 to its token, so that the next call fetches a new one.
type TokenSource interface {
	Token(ctx context.Context) (string, error)
}

// NewDefaultTokenSource returns a CredentialSource over
// azidentity.NewDefaultAzureCredential(opts): the environment's Azure
// credential chain (environment variables, workload identity, managed
// identity, Azure CLI, ...), for EntraScope. opts may be nil. It does not
// contact the identity platform; the first Token does.
func NewDefaultTokenSource(opts *azidentity.DefaultAzureCredentialOptions) (*CredentialSource, error) {
	cred, err := azidentity.NewDefaultAzureCredential(opts)
	if err != nil {
		return nil, fmt.Errorf("azure: the default Azure credential: %w", err)
	}
	return NewCredentialSource(cred), nil
}

// CredentialSource is a TokenSource over an azcore.TokenCredential (any
// azidentity credential). It caches the token until its RefreshOn, else
// until five minutes (at most half its lifetime) before it expires, and
// fetches one token at a time however many calls need it. Safe for
// concurrent use.
type CredentialSource struct {
	cred   azcore.TokenCredential
	scopes []string
	now    func() time.Time
	fetch  chan struct{} // holds one token: the right to fetch

	mu        sync.Mutex
	token     string    // guarded by mu
	refreshAt time.Time // guarded by mu
}

var _ TokenSource = (*CredentialSource)(nil)

// refreshMargin is how long before its expiry a token without a RefreshOn
// is replaced.
const refreshMargin = 5 * time.Minute

// NewCredentialSource returns a CredentialSource for cred and scopes
// (EntraScope when none).
func NewCredentialSource(cred azcore.TokenCredential, scopes ...string) *CredentialSource {
	if len(scopes) == 0 {
		scopes = []string{EntraScope}
	}
	return &CredentialSource{cred: cred, scopes: scopes, now: time.Now, fetch: make(chan struct{}, 1)}
}

// Token returns the cached token, or fetches a new one. See TokenSource
// for the meaning of its errors; the caller's cancellation while waiting
// for another caller's fetch is returned as ctx's error.
func (s *CredentialSource) Token(ctx context.Context) (string, error) {
	if t, ok := s.cached(); ok {
		return t, nil
	}
	select {
	case s.fetch <- struct{}{}:
	case <-ctx.Done():
		return "", ctx.Err()
	}
	defer func() { <-s.fetch }()
	if t, ok := s.cached(); ok { // fetched while this call waited
		return t, nil
	}
	start := s.now()
	tok, err := s.cred.GetToken(ctx, policy.TokenRequestOptions{Scopes: s.scopes})
	if err != nil {
		return "", credentialError(err)
	}
	refreshAt := tok.RefreshOn
	if refreshAt.IsZero() {
		refreshAt = tok.ExpiresOn.Add(-min(refreshMargin, tok.ExpiresOn.Sub(start)/2))
	}
	s.mu.Lock()
	s.token, s.refreshAt = tok.Token, refreshAt
	s.mu.Unlock()
	return tok.Token, nil
}

// Invalidate drops the cached token: Azure refused it.
func (s *CredentialSource) Invalidate() {
	s.mu.Lock()
	s.token, s.refreshAt = "", time.Time{}
	s.mu.Unlock()
}

func (s *CredentialSource) cached() (string, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.token == "" || !s.now().Before(s.refreshAt) {
		return "", false
	}
	return s.token, true
}

// credentialError marks err with ErrCredentialRejected when waiting will
// not cure it: the identity platform answered with a 4xx other than 429 (a
// wrong secret, an unknown client, a missing consent), or the credential
// says it is unavailable or must not be retried (no credential configured
// in this environment). A failure without an answer, a 429 or a 5xx of the
// identity platform stays unmarked: transient.
func credentialError(err error) error {
	var failed *azidentity.AuthenticationFailedError
	if errors.As(err, &failed) {
		if res := failed.RawResponse; res != nil && res.StatusCode >= 400 && res.StatusCode < 500 &&
			res.StatusCode != http.StatusTooManyRequests {
			return fmt.Errorf("%w: %w", ErrCredentialRejected, err)
		}
		return err
	}
	var final interface{ NonRetriable() }
	if errors.As(err, &final) {
		return fmt.Errorf("%w: %w", ErrCredentialRejected, err)
	}
	return err
}
