// Package azure is Bulwark's adapter for Azure OpenAI (provider kind
// "azure"): chat completions on a model deployment of an Azure OpenAI
// resource, over plain net/http so that every response header is seen and
// nothing retries behind Bulwark's back.
//
// Azure speaks OpenAI's Chat Completions wire format, so the body, the
// answer and the error bodies are translated by pkg/provider/openai
// (EncodeRequest, DecodeResponse, ReadStream, ErrorOf, ParseRateLimit);
// this package owns what is Azure's own (Microsoft's documents are cited;
// where they are silent, the behaviour Azure is seen to have):
//
//   - The endpoint. POST {endpoint}/openai/deployments/{deployment-id}/chat/completions?api-version={version}
//     ("Azure OpenAI in Azure AI Foundry Models REST API reference",
//     https://learn.microsoft.com/azure/ai-foundry/openai/reference). The
//     endpoint is the resource's (https://<resource>.openai.azure.com); a
//     key's llm.Credential.Endpoint replaces Config.BaseURL (a resource of
//     its own), and its Credential.Deployment replaces the deployment the
//     tier names (req.Model), e.g. a PTU deployment. The body keeps its
//     "model" field (the deployment when req.Model is empty), which Azure
//     ignores. api-version defaults to APIVersionDefault, the latest GA
//     data-plane version ("API version lifecycle": "2024-10-21 is currently
//     the latest GA API release").
//   - Authentication. Auth "api-key" (the default) sends the key in the
//     api-key header; Auth "entra" sends "Authorization: Bearer <token>" with
//     a Microsoft Entra ID token for the scope EntraScope, from
//     Config.Token (see TokenSource, NewDefaultTokenSource).
//   - Rate-limit headers. Azure sends x-ratelimit-remaining-requests and
//     x-ratelimit-remaining-tokens on every answer, and newer deployments
//     the limit and reset headers too (resets in seconds); a 429 carries
//     retry-after-ms and retry-after, read in that order. See ParseRateLimit
//     and ErrorOf for the fallbacks when a 429 has neither.
//   - Error bodies and their classes (ErrorOf): Azure's 429s ("Requests to
//     the ChatCompletions_Create Operation ... have exceeded call rate limit
//     ... Please retry after N seconds"), content_filter refusals,
//     DeploymentNotFound, and 401/403 in Azure's own {"error":{"code":"401",
//     "message":...}} shape.
//   - Provisioned throughput (PTU). A PTU deployment's 429 means its
//     provisioned capacity is fully used at that moment ("What is
//     provisioned throughput?": "The 429 response isn't an error, but
//     instead part of the design for telling users that a given deployment
//     is fully utilized at a point in time"; the retry-after-ms and
//     retry-after headers say when the next call will be accepted). Such a
//     429 stays rate_limited and carries Code CodeCapacityFull, so that the
//     pool can wait the (short) retry-after-ms instead of cooling the key;
//     see CodeCapacityFull.
package azure

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"time"

	"bulwark/pkg/llm"
	"bulwark/pkg/provider"
	"bulwark/pkg/provider/openai"
	"bulwark/pkg/secret"
)

const (
	// ProviderDefault is the provider name of a Client whose Config.Name is
	// empty.
	ProviderDefault llm.Provider = "azure"
	// APIVersionDefault is the api-version sent when Config.APIVersion is
	// empty: the latest GA data-plane inference version of Azure OpenAI.
	APIVersionDefault = "2024-10-21"
	// TimeoutDefault bounds one call, reading the answer included.
	TimeoutDefault = 120 * time.Second
	// AuthAPIKey sends each key's APIKey in the api-key header.
	AuthAPIKey = "api-key"
	// AuthEntra sends "Authorization: Bearer <token>" with a Microsoft Entra
	// ID access token from Config.Token; keys need no APIKey.
	AuthEntra = "entra"
)

// apiVersionPattern is the shape of a data-plane api-version: a date,
// optionally marked preview ("2024-10-21", "2025-04-01-preview").
var apiVersionPattern = regexp.MustCompile(`^\d{4}-\d{2}-\d{2}(-preview)?$`)

// Config configures a Client. The zero value is valid: api-key auth,
// APIVersionDefault, and every key bringing its own endpoint.
type Config struct {
	// Name is the provider name the Client reports and its errors carry
	// (the name of the provider in the configuration). Default
	// ProviderDefault ("azure").
	Name llm.Provider
	// BaseURL is the resource endpoint, https://<resource>.openai.azure.com
	// (or a gateway in front of it, path prefix allowed). A trailing "/",
	// "/v1" or "/openai" is dropped, so the endpoint as the portal shows it
	// works too. Optional: a key's llm.Credential.Endpoint replaces it, and
	// a call whose key has neither fails (without a class: a configuration
	// error).
	BaseURL string
	// APIVersion is the api-version query parameter, a date optionally
	// followed by "-preview". Default APIVersionDefault.
	APIVersion string
	// Timeout bounds one call, from sending the request to having read the
	// whole answer. Default TimeoutDefault (120 s); must not be negative.
	Timeout time.Duration
	// Auth is AuthAPIKey (default) or AuthEntra.
	Auth string
	// Token supplies the bearer tokens of AuthEntra; required then, unused
	// otherwise. See NewDefaultTokenSource.
	Token TokenSource
	// PTUKeys marks the keys (by llm.Credential.KeyID) whose deployment is
	// provisioned throughput: their 429 is "provisioned capacity full"
	// (CodeCapacityFull). A 429 that carries Azure's PTU utilization header
	// is recognised without it.
	PTUKeys map[string]bool
}

// WithDefaults returns c with every zero field set to its default.
func (c Config) WithDefaults() Config {
	c.Name = cmp.Or(c.Name, ProviderDefault)
	c.APIVersion = cmp.Or(c.APIVersion, APIVersionDefault)
	c.Timeout = cmp.Or(c.Timeout, TimeoutDefault)
	c.Auth = cmp.Or(c.Auth, AuthAPIKey)
	return c
}

// Validate reports the first invalid field of c after defaults, naming it.
// Call it when loading configuration to fail at start-up rather than on the
// first call.
func (c Config) Validate() error {
	c = c.WithDefaults()
	if !c.Name.Valid() {
		return fmt.Errorf("azure.Name: %q is not a provider name", c.Name)
	}
	if c.BaseURL != "" {
		if err := provider.ValidateBaseURL("azure.BaseURL", c.BaseURL); err != nil {
			return err
		}
	}
	if !apiVersionPattern.MatchString(c.APIVersion) {
		return fmt.Errorf("azure.APIVersion: %q is not an api-version such as %s or 2025-04-01-preview", c.APIVersion, APIVersionDefault)
	}
	if c.Timeout < 0 {
		return fmt.Errorf("azure.Timeout: must not be negative, got %s", c.Timeout)
	}
	switch c.Auth {
	case AuthAPIKey:
	case AuthEntra:
		if c.Token == nil {
			return errors.New("azure.Token: required with Auth " + AuthEntra)
		}
	default:
		return fmt.Errorf("azure.Auth: %q, want %s or %s", c.Auth, AuthAPIKey, AuthEntra)
	}
	return nil
}

// Client calls Azure OpenAI chat completions. It is safe for concurrent use
// and holds no per-call state.
type Client struct {
	cfg  Config
	hc   *http.Client
	base string // resourceRoot(cfg.BaseURL)
	// err is the configuration error found by New, returned by every call.
	err error
}

var (
	_ llm.Client   = (*Client)(nil)
	_ llm.Streamer = (*Client)(nil)
)

// New returns a Client for cfg (zero fields mean defaults) that sends with
// hc's Transport, or http.DefaultClient's when hc is nil. Redirects are not
// followed (see provider.NoRedirects). hc's own Timeout, if any, also
// applies; the per-call deadline is cfg.Timeout. An invalid cfg is reported
// by every Complete call (use Config.Validate to catch it earlier).
func New(cfg Config, hc *http.Client) *Client {
	cfg = cfg.WithDefaults()
	c := &Client{cfg: cfg, hc: provider.NoRedirects(hc), base: resourceRoot(cfg.BaseURL)}
	if err := cfg.Validate(); err != nil {
		c.err = fmt.Errorf("azure: invalid config: %w", err)
	}
	return c
}

// Provider returns Config.Name ("azure" by default).
func (c *Client) Provider() llm.Provider { return c.cfg.Name }

// Complete sends req to the deployment of cred (cred.Deployment, else
// req.Model) on the resource of cred (cred.Endpoint, else Config.BaseURL),
// authenticated as Config.Auth says, and returns the answer with the
// rate-limit headers. It never retries. A provider failure is an
// *llm.Error carrying class, status, code, a message free of key material,
// Retry-After and the rate-limit headers (see ErrorOf); a connection
// failure or Config.Timeout is transient. When ctx ends first, the error
// wraps ctx's error and is not an *llm.Error. A call that cannot be
// addressed (no endpoint, no deployment, an invalid key endpoint) fails
// without a class.
func (c *Client) Complete(ctx context.Context, cred llm.Credential, req *llm.Request) (*llm.Result, error) {
	call, w, err := c.call(ctx, cred, req, openai.EncodeRequest)
	if err != nil {
		return nil, err
	}
	return provider.Do(ctx, c.hc, call, w)
}

// Stream is Complete with the answer streamed (see llm.Streamer), in
// OpenAI's chunk format: the body says "stream": true and asks for the
// usage at the end (openai.EncodeStreamRequest), and openai.ReadStream
// reads the chunks, calling emit with each delta as it arrives. Failures
// are Complete's until the stream starts; after that, an error the stream
// carries is classified by Azure's table (ErrorOf), and a stream that
// breaks off, or outlasts Config.Timeout, is a transient *llm.Error. When
// ctx ends first, the error wraps ctx's error and is not an *llm.Error.
func (c *Client) Stream(ctx context.Context, cred llm.Credential, req *llm.Request, emit func(llm.Delta)) (*llm.Result, error) {
	call, w, err := c.call(ctx, cred, req, openai.EncodeStreamRequest)
	if err != nil {
		return nil, err
	}
	return provider.DoStream(ctx, c.hc, call, w, emit)
}

// call is the POST of req to cred's deployment, its body made by encode
// and authenticated as Config.Auth says (an Entra token is fetched with
// ctx), with the Wire that reads its replies: OpenAI's, with Azure's error
// table and rate-limit headers.
func (c *Client) call(ctx context.Context, cred llm.Credential, req *llm.Request, encode func(*llm.Request) ([]byte, error)) (provider.Call, provider.Wire, error) {
	if c.err != nil {
		return provider.Call{}, provider.Wire{}, c.err
	}
	if c.cfg.Auth == AuthAPIKey {
		if err := provider.CheckKey(c.cfg.Name, cred.APIKey); err != nil {
			return provider.Call{}, provider.Wire{}, err
		}
	}
	target, err := c.target(cred, req)
	if err != nil {
		return provider.Call{}, provider.Wire{}, err
	}
	if req.Model == "" {
		// Azure ignores the body's model, but the wire format wants one.
		r := *req
		r.Model = cred.Deployment
		req = &r
	}
	body, err := encode(req)
	if err != nil {
		return provider.Call{}, provider.Wire{}, &llm.Error{Class: llm.ClassPermanent, Provider: c.cfg.Name, Message: err.Error()}
	}
	h := http.Header{}
	h.Set("User-Agent", provider.UserAgent)
	sent := cred.APIKey // what must never appear in an error
	if c.cfg.Auth == AuthEntra {
		token, err := c.token(ctx)
		if err != nil {
			return provider.Call{}, provider.Wire{}, err
		}
		sent = token
		h.Set("Authorization", "Bearer "+token.Reveal())
	} else {
		h.Set("api-key", cred.APIKey.Reveal())
	}
	call := provider.Call{Provider: c.cfg.Name, URL: target, Header: h, Body: body, Timeout: c.cfg.Timeout}
	w := provider.Wire{
		Failure:    func(r *provider.Reply, now time.Time) error { return c.failure(r, sent, cred, now) },
		RateLimit:  ParseRateLimit,
		Decode:     openai.DecodeResponse,
		ReadStream: openai.ReadStream,
		Redact:     func(msg string) string { return provider.Redact(msg, sent) },
	}
	return call, w, nil
}

// target is the chat completions URL of cred's deployment.
func (c *Client) target(cred llm.Credential, req *llm.Request) (string, error) {
	base := c.base
	if cred.Endpoint != "" {
		if err := provider.ValidateBaseURL("endpoint of key "+cred.KeyID, cred.Endpoint); err != nil {
			return "", fmt.Errorf("%s: %w", c.cfg.Name, err)
		}
		base = resourceRoot(cred.Endpoint)
	}
	if base == "" {
		return "", fmt.Errorf("%s: key %q has no endpoint and the provider no base URL", c.cfg.Name, cred.KeyID)
	}
	deployment := cmp.Or(cred.Deployment, req.Model)
	if deployment == "" {
		return "", fmt.Errorf("%s: key %q has no deployment and the request no model", c.cfg.Name, cred.KeyID)
	}
	return ChatURL(base, deployment, c.cfg.APIVersion), nil
}

// ChatURL is the chat completions URL of deployment on the resource at
// endpoint for apiVersion:
// {endpoint}/openai/deployments/{deployment}/chat/completions?api-version={apiVersion},
// the deployment path-escaped. endpoint may end in "/", "/v1" or "/openai"
// (see Config.BaseURL).
func ChatURL(endpoint, deployment, apiVersion string) string {
	return resourceRoot(endpoint) + "/openai/deployments/" + url.PathEscape(deployment) +
		"/chat/completions?api-version=" + url.QueryEscape(apiVersion)
}

// resourceRoot trims a configured endpoint to the resource's root: the
// trailing "/", then a trailing "/v1" (the providers' base URLs may carry
// one, and Azure's next-generation base URL ends in "/openai/v1"), then a
// trailing "/openai".
func resourceRoot(endpoint string) string {
	endpoint = strings.TrimRight(endpoint, "/")
	endpoint = strings.TrimSuffix(endpoint, "/v1")
	endpoint = strings.TrimSuffix(endpoint, "/openai")
	return strings.TrimRight(endpoint, "/")
}

// token fetches the bearer token of AuthEntra. The caller's cancellation is
// returned as is (unclassified); a credential the identity platform refused
// (ErrCredentialRejected) or a token no header can carry is auth; any other
// failure to get one is transient.
func (c *Client) token(ctx context.Context) (secret.String, error) {
	raw, err := c.cfg.Token.Token(ctx)
	if err != nil {
		if ctxErr := ctx.Err(); ctxErr != nil {
			return secret.String{}, fmt.Errorf("%s: entra token: %w", c.cfg.Name, ctxErr)
		}
		class := llm.ClassTransient
		if errors.Is(err, ErrCredentialRejected) {
			class = llm.ClassAuth
		}
		return secret.String{}, &llm.Error{Class: class, Provider: c.cfg.Name,
			Message: provider.Redact("getting a Microsoft Entra ID token: "+err.Error(), secret.New(raw))}
	}
	token := secret.New(raw)
	if token.IsZero() {
		return secret.String{}, &llm.Error{Class: llm.ClassAuth, Provider: c.cfg.Name, Message: "the Microsoft Entra ID token source returned an empty token"}
	}
	if err := provider.CheckKey(c.cfg.Name, token); err != nil {
		return secret.String{}, err
	}
	return token, nil
}
