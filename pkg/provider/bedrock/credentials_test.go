package bedrock

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"bulwark/pkg/llm"
	"bulwark/pkg/provider/anthropic"
	"bulwark/pkg/testkit/wiretest"
)

// signedBy serves InvokeModel and verifies each signature with the secret
// of the access key id that made it; seen receives the access key id and
// the session token.
func signedBy(t *testing.T, secrets map[string]string) (*httptest.Server, chan [2]string) {
	t.Helper()
	resp, err := anthropic.EncodeResponse(wiretest.Responses()[0].Value, "")
	if err != nil {
		t.Fatal(err)
	}
	seen := make(chan [2]string, 8)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		scope, _, _ := strings.Cut(strings.TrimPrefix(r.Header.Get("Authorization"), "AWS4-HMAC-SHA256 Credential="), "/")
		if err := verifySigV4(r, body, secrets[scope]); err != nil {
			t.Error(err)
			w.WriteHeader(http.StatusForbidden)
			return
		}
		seen <- [2]string{scope, r.Header.Get("X-Amz-Security-Token")}
		_, _ = w.Write(resp)
	}))
	t.Cleanup(srv.Close)
	return srv, seen
}

// Without Config.Credentials, the default chain signs: here the
// environment's keys and token. It is loaded once per profile and kept, so
// a change of the environment afterwards does not reach a loaded profile.
func TestDefaultChainFromEnvironment(t *testing.T) {
	t.Setenv("AWS_ACCESS_KEY_ID", testAKID)
	t.Setenv("AWS_SECRET_ACCESS_KEY", testSecret)
	t.Setenv("AWS_SESSION_TOKEN", testToken)
	srv, seen := signedBy(t, map[string]string{testAKID: testSecret, "AKIAOTHERKEY00000000": "other"})
	c := New(Config{BaseURL: srv.URL}, srv.Client())
	if _, err := c.Complete(t.Context(), cred(testRegion), textRequest(testModel)); err != nil {
		t.Fatal(err)
	}
	if got := <-seen; got != [2]string{testAKID, testToken} {
		t.Errorf("signed as %v, want the environment's key and token", got)
	}
	t.Setenv("AWS_ACCESS_KEY_ID", "AKIAOTHERKEY00000000")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "other")
	if _, err := c.Complete(t.Context(), cred("us-east-1"), textRequest(testModel)); err != nil {
		t.Fatal(err)
	}
	if got := <-seen; got[0] != testAKID {
		t.Errorf("signed as %v: the profile's chain was loaded again", got)
	}
	// A new client loads the chain anew.
	if _, err := New(Config{BaseURL: srv.URL}, srv.Client()).Complete(t.Context(), cred(testRegion), textRequest(testModel)); err != nil {
		t.Fatal(err)
	}
	if got := <-seen; got[0] != "AKIAOTHERKEY00000000" {
		t.Errorf("signed as %v, want the new environment's key", got)
	}
}

// A key's profile picks its account's credentials from the shared files; a
// profile that does not exist, or a chain with nothing in it, is an auth
// failure of the key and nothing is sent.
func TestProfiles(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "credentials")
	if err := os.WriteFile(file, []byte("[default]\naws_access_key_id = AKIADEFAULTACCOUNT00\naws_secret_access_key = default-secret\n\n"+
		"[acct-b]\naws_access_key_id = AKIAACCOUNTB00000000\naws_secret_access_key = b-secret\naws_session_token = b-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", file)
	srv, seen := signedBy(t, map[string]string{"AKIADEFAULTACCOUNT00": "default-secret", "AKIAACCOUNTB00000000": "b-secret"})
	c := New(Config{BaseURL: srv.URL}, srv.Client())

	for _, tt := range []struct{ profile, akid, token string }{
		{"", "AKIADEFAULTACCOUNT00", ""},
		{"acct-b", "AKIAACCOUNTB00000000", "b-token"},
		{"", "AKIADEFAULTACCOUNT00", ""},
	} {
		k := cred("us-east-1")
		k.Profile = tt.profile
		if _, err := c.Complete(t.Context(), k, textRequest(testModel)); err != nil {
			t.Fatalf("profile %q: %v", tt.profile, err)
		}
		if got := <-seen; got != [2]string{tt.akid, tt.token} {
			t.Errorf("profile %q signed as %v, want %s", tt.profile, got, tt.akid)
		}
	}
	c.creds.mu.Lock()
	loaded := len(c.creds.byProfile)
	c.creds.mu.Unlock()
	if loaded != 2 {
		t.Errorf("%d chains loaded, want one per profile", loaded)
	}

	k := cred("us-east-1")
	k.Profile = "no-such-profile"
	pe := failure(t, c, k, textRequest(testModel))
	if pe.Class != llm.ClassAuth || !strings.Contains(pe.Message, "no-such-profile") {
		t.Errorf("error %v, want auth naming the profile", pe)
	}

	// Nothing anywhere: no environment, no files, no instance role (IMDS
	// is disabled for the tests).
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", os.DevNull)
	pe = failure(t, New(Config{BaseURL: srv.URL}, srv.Client()), cred("us-east-1"), textRequest(testModel))
	if pe.Class != llm.ClassAuth || !strings.HasPrefix(pe.Message, "credentials: ") {
		t.Errorf("error %v, want auth", pe)
	}
	select {
	case got := <-seen:
		t.Errorf("a request was sent, signed as %v", got)
	default:
	}
}

// Config.Credentials sign every key whatever its profile; an answer saying
// the credentials are stale drops the cached ones, so the next call
// fetches them again, and other errors do not.
func TestConfigCredentialsRefetchedWhenStale(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		typ     string
		refetch bool
	}{
		{"ExpiredTokenException", true},
		{"UnrecognizedClientException", true},
		{"InvalidSignatureException", true},
		{"AccessDeniedException", false},
		{"ThrottlingException", false},
	} {
		t.Run(tt.typ, func(t *testing.T) {
			t.Parallel()
			srv := fakeBedrock(t, "", testSecret, answer{status: 403, header: typed(tt.typ), body: []byte(`{"message":"no"}`)}, nil)
			creds := staticCreds(testAKID, testSecret, testToken)
			c := testClient(srv.URL, srv.Client(), creds)
			k := cred(testRegion)
			k.Profile = "ignored-when-credentials-are-set"
			for range 2 {
				_, _ = c.Complete(t.Context(), k, textRequest(testModel))
			}
			want := int32(1)
			if tt.refetch {
				want = 2
			}
			if n := creds.calls.Load(); n != want {
				t.Errorf("credentials retrieved %d times, want %d", n, want)
			}
		})
	}

	t.Run("a provider that fails is an auth failure", func(t *testing.T) {
		t.Parallel()
		creds := &countingCreds{err: errors.New("sts: AssumeRole denied for " + testAKID)}
		pe := failure(t, New(Config{Credentials: creds}, nil), cred(testRegion), textRequest(testModel))
		if pe.Class != llm.ClassAuth || strings.Contains(pe.Error(), testAKID) || !strings.Contains(pe.Message, "AssumeRole denied") {
			t.Errorf("error %v, want a redacted auth failure", pe)
		}
		pe = failure(t, New(Config{Credentials: staticCreds("", "", "")}, nil), cred(testRegion), textRequest(testModel))
		if pe.Class != llm.ClassAuth {
			t.Errorf("error %v, want auth for credentials without keys", pe)
		}
	})
}

// roundTrip answers every request itself, without a network.
type roundTrip func(*http.Request) (*http.Response, error)

func (f roundTrip) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// The key's region picks the endpoint and signs the request; a key without
// a region, or with something else in it, sends nothing.
func TestRegionPicksEndpoint(t *testing.T) {
	t.Parallel()
	resp, _ := anthropic.EncodeResponse(wiretest.Responses()[0].Value, "")
	var mu sync.Mutex
	var got []string
	hc := &http.Client{Transport: roundTrip(func(r *http.Request) (*http.Response, error) {
		mu.Lock()
		got = append(got, r.URL.Scheme+"://"+r.URL.Host+r.URL.EscapedPath()+" "+strings.Split(r.Header.Get("Authorization"), "/")[2])
		mu.Unlock()
		_ = r.Body.Close()
		return &http.Response{StatusCode: 200, Header: http.Header{"Content-Type": {"application/json"}},
			Body: io.NopCloser(strings.NewReader(string(resp))), Request: r}, nil
	})}
	c := New(Config{Credentials: staticCreds(testAKID, testSecret, "")}, hc)
	for _, tt := range []struct{ region, want string }{
		{"us-east-1", "https://bedrock-runtime.us-east-1.amazonaws.com/model/anthropic.claude-3-5-sonnet-20240620-v1%3A0/invoke us-east-1"},
		{"eu-central-1", "https://bedrock-runtime.eu-central-1.amazonaws.com/model/anthropic.claude-3-5-sonnet-20240620-v1%3A0/invoke eu-central-1"},
		{"us-gov-west-1", "https://bedrock-runtime.us-gov-west-1.amazonaws.com/model/anthropic.claude-3-5-sonnet-20240620-v1%3A0/invoke us-gov-west-1"},
		{"cn-north-1", "https://bedrock-runtime.cn-north-1.amazonaws.com.cn/model/anthropic.claude-3-5-sonnet-20240620-v1%3A0/invoke cn-north-1"},
	} {
		mu.Lock()
		got = nil
		mu.Unlock()
		if _, err := c.Complete(t.Context(), cred(tt.region), textRequest(testModel)); err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		if len(got) != 1 || got[0] != tt.want {
			t.Errorf("region %s: sent %q, want %q", tt.region, got, tt.want)
		}
		mu.Unlock()
	}

	mu.Lock()
	got = nil
	mu.Unlock()
	for _, region := range []string{"", "us-east-1.evil.example/x", "US-EAST-1", "us-east-1 ", "local"} {
		pe := failure(t, c, cred(region), textRequest(testModel))
		if pe.Class != llm.ClassAuth || pe.Provider != "bedrock" {
			t.Errorf("region %q: error %v, want auth", region, pe)
		}
	}
	mu.Lock()
	if len(got) != 0 {
		t.Errorf("sent %q for keys without a valid region", got)
	}
	mu.Unlock()

	if e := Endpoint("ap-southeast-2"); e != "https://bedrock-runtime.ap-southeast-2.amazonaws.com" {
		t.Errorf("Endpoint = %s", e)
	}
}
