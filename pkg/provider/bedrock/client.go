// Package bedrock is Bulwark's adapter for Claude on Amazon Bedrock: the
// Bedrock Runtime's InvokeModel operation (POST /model/{modelId}/invoke)
// with Anthropic's Messages body, signed with AWS Signature Version 4 by the
// AWS SDK for Go v2's own signer, over plain net/http (provider.Post) so that
// timeouts, redaction and transport errors are the ones every adapter
// shares, and nothing retries behind Bulwark's back (the SDK's client would
// retry ThrottlingException and ModelNotReadyException on its own).
//
// # Keys
//
// A Bedrock key of the pool is a region of an account: its quota is the
// account's per-region, per-model RPM and TPM, so an operator lists one key
// per region (and per account, through a shared-config profile) with that
// quota as its rpm_limit and tpm_limit. The key has no secret of its own
// (llm.Credential.APIKey is unused): Region picks the endpoint
// (https://bedrock-runtime.<region>.amazonaws.com, amazonaws.com.cn for
// the China regions) and the signing region, and Profile picks the
// credentials. Credential.Endpoint and Deployment are not used.
//
// # Credentials
//
// Config.Credentials, when set, signs every call. Otherwise each profile
// gets the SDK's default credential chain (config.LoadDefaultConfig with
// WithSharedConfigProfile): environment (AWS_ACCESS_KEY_ID,
// AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN), the shared config and
// credentials files, web identity, SSO, a role to assume, the container's
// or the instance's role. A profile's chain is loaded once, on its first
// call, and its credentials are cached and refreshed before they expire
// (aws.CredentialsCache). Credentials that cannot be had are an auth
// failure of the key; an answer that says the credentials are expired or
// unknown also drops the cached ones, so the next call fetches them anew.
//
// # Wire
//
// The body is Anthropic's Messages request (anthropic.EncodeRequest)
// without "model", which the path carries, with "anthropic_version":
// "bedrock-2023-05-31" (Config.AnthropicVersion); the answer is Anthropic's
// Messages response (anthropic.DecodeResponse). The model is a Bedrock
// model id ("anthropic.claude-3-5-sonnet-20240620-v1:0"), an inference
// profile id ("us.anthropic.claude-…") or an ARN, escaped into the path as
// the SDK escapes it.
//
// Stream (llm.Streamer) calls InvokeModelWithResponseStream
// (/model/{modelId}/invoke-with-response-stream) with the same body and
// signature; the answer is an AWS event stream whose "chunk" events each
// carry one event of Anthropic's Messages stream (see ReadStream).
//
// # Rate limits
//
// Bedrock sends no rate-limit headers: every Result and *llm.Error has a
// zero (unknown) RateLimit, and the pool paces each key by its configured
// limits alone. A 429 ThrottlingException usually carries no Retry-After;
// one that does is honoured.
//
// # Errors
//
// The error type is read as the SDK reads it: the x-amzn-ErrorType header
// ("ThrottlingException:http://internal.amazon.com/coral/…"), else the
// body's "__type" ("com.amazon.coral.service#UnrecognizedClientException"),
// else its "code"; the message is the body's "message" (or "Message").
// Classify maps the type to a class (see classRules); the status decides
// only when the type is unknown or absent. No credential, signature or
// account id reaches an error (Redact).
package bedrock

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"
	"github.com/aws/smithy-go/encoding/httpbinding"

	"bulwark/pkg/llm"
	"bulwark/pkg/provider"
	"bulwark/pkg/provider/anthropic"
)

const (
	// ProviderDefault is the provider name a Client reports unless
	// Config.Provider names another.
	ProviderDefault llm.Provider = "bedrock"
	// TimeoutDefault bounds one call, reading the answer included.
	TimeoutDefault = 120 * time.Second
	// AnthropicVersionDefault is the anthropic_version Bedrock's Claude
	// models take in the body.
	AnthropicVersionDefault = "bedrock-2023-05-31"
	// SigningName is the Bedrock Runtime's SigV4 service name, the
	// "bedrock" of the credential scope <date>/<region>/bedrock/aws4_request.
	SigningName = "bedrock"
)

// Config configures a Client. The zero value means all defaults.
type Config struct {
	// Provider is the name the Client reports and its errors carry: the
	// configured provider's name. Default ProviderDefault.
	Provider llm.Provider
	// BaseURL replaces the regional endpoint for every key (a proxy, a VPC
	// endpoint, the mock provider); it may carry a path prefix. Default
	// empty: https://bedrock-runtime.<key's region>.amazonaws.com. The key's
	// region still signs the request.
	BaseURL string
	// Timeout bounds one call, from sending the request to having read the
	// whole answer. Default TimeoutDefault (120 s); must not be negative.
	Timeout time.Duration
	// AnthropicVersion is the body's anthropic_version. Default
	// AnthropicVersionDefault.
	AnthropicVersion string
	// Credentials, when set, sign every call whatever the key's profile
	// (cached with aws.NewCredentialsCache unless they already are). Nil:
	// each profile's default credential chain, loaded on first use and
	// cached.
	Credentials aws.CredentialsProvider
}

// WithDefaults returns c with every zero field set to its default.
func (c Config) WithDefaults() Config {
	if c.Provider == "" {
		c.Provider = ProviderDefault
	}
	if c.Timeout == 0 {
		c.Timeout = TimeoutDefault
	}
	if c.AnthropicVersion == "" {
		c.AnthropicVersion = AnthropicVersionDefault
	}
	return c
}

// Validate reports the first invalid field of c after defaults, naming it.
// Call it when loading configuration to fail at start-up rather than on the
// first call.
func (c Config) Validate() error {
	c = c.WithDefaults()
	if !c.Provider.Valid() {
		return fmt.Errorf("bedrock.Provider: %q is not a provider name", c.Provider)
	}
	if c.BaseURL != "" {
		if err := provider.ValidateBaseURL("bedrock.BaseURL", c.BaseURL); err != nil {
			return err
		}
	}
	if c.Timeout < 0 {
		return fmt.Errorf("bedrock.Timeout: must not be negative, got %s", c.Timeout)
	}
	if provider.BadHeaderValue(c.AnthropicVersion) || strings.TrimSpace(c.AnthropicVersion) != c.AnthropicVersion {
		return fmt.Errorf("bedrock.AnthropicVersion: %q is not a version", c.AnthropicVersion)
	}
	return nil
}

// Client calls InvokeModel. It is safe for concurrent use; its only state
// is the credentials it caches per profile.
type Client struct {
	cfg    Config
	hc     *http.Client
	signer *v4.Signer
	creds  *credentialSource
	// err is the configuration error found by New, returned by every call.
	err error
}

var _ llm.Client = (*Client)(nil)

// New returns a Client for cfg (zero fields mean defaults) that sends with
// hc's Transport, or http.DefaultClient's when hc is nil. Redirects are not
// followed (see provider.NoRedirects): a signed request goes to the host it
// was signed for or nowhere. hc's own Timeout, if any, also applies; the
// per-call deadline is cfg.Timeout. An invalid cfg is reported by every
// Complete call (use Config.Validate to catch it earlier).
func New(cfg Config, hc *http.Client) *Client {
	cfg = cfg.WithDefaults()
	c := &Client{cfg: cfg, hc: provider.NoRedirects(hc), signer: v4.NewSigner(), creds: newCredentialSource(cfg.Credentials)}
	if err := cfg.Validate(); err != nil {
		c.err = fmt.Errorf("bedrock: invalid config: %w", err)
	}
	return c
}

// Provider returns Config.Provider ("bedrock" by default).
func (c *Client) Provider() llm.Provider { return c.cfg.Provider }

// regionPattern is an AWS region name: "us-east-1", "us-gov-west-1",
// "ap-southeast-2". It goes into a host name, so nothing else may pass.
var regionPattern = regexp.MustCompile(`^[a-z]{2}(-[a-z]+)+-[0-9]{1,2}$`)

// Endpoint returns the Bedrock Runtime's regional endpoint for region:
// https://bedrock-runtime.<region>.amazonaws.com, or .amazonaws.com.cn for
// the China regions (cn-…). Other partitions (GovCloud aside, which is
// .amazonaws.com) need Config.BaseURL.
func Endpoint(region string) string {
	suffix := "amazonaws.com"
	if strings.HasPrefix(region, "cn-") {
		suffix = "amazonaws.com.cn"
	}
	return "https://bedrock-runtime." + region + "." + suffix
}

// InvokePath is the InvokeModel path of model: /model/{modelId}/invoke
// with the id escaped as a path label, as the SDK escapes it (":" and "/"
// of ids and ARNs become %3A and %2F).
func InvokePath(model string) string {
	return "/model/" + httpbinding.EscapePath(model, true) + "/invoke"
}

// Complete sends req to InvokeModel in cred.Region, signed with the
// credentials of cred.Profile (or Config.Credentials), and returns the
// answer. It never retries. A provider failure is an *llm.Error carrying
// class, status, the Bedrock error type as Code, a message free of
// credentials, and Retry-After when Bedrock sent one; a key without a valid
// region, or whose credentials cannot be had, is an auth failure; a
// connection failure or Config.Timeout is transient. When ctx ends first,
// the error wraps ctx's error (errors.Is(err, context.Canceled)) and is not
// an *llm.Error.
func (c *Client) Complete(ctx context.Context, cred llm.Credential, req *llm.Request) (*llm.Result, error) {
	call, w, err := c.call(ctx, cred, req, InvokePath(req.Model), "")
	if err != nil {
		return nil, err
	}
	return provider.Do(ctx, c.hc, call, w)
}

// call is the signed POST of req to path in cred.Region, sent with accept
// ("" for Post's application/json), and the Wire reading its replies with
// Bedrock's error table. Its error is Complete's for a key or a request
// that cannot be sent.
func (c *Client) call(ctx context.Context, cred llm.Credential, req *llm.Request, path, accept string) (provider.Call, provider.Wire, error) {
	if c.err != nil {
		return provider.Call{}, provider.Wire{}, c.err
	}
	p := c.cfg.Provider
	region := cred.Region
	if !regionPattern.MatchString(region) {
		msg := "the key has no region"
		if region != "" {
			msg = fmt.Sprintf("the key's region %q is not an AWS region", provider.Redact(region))
		}
		return provider.Call{}, provider.Wire{}, &llm.Error{Class: llm.ClassAuth, Provider: p, Message: msg}
	}
	body, err := EncodeRequest(req, c.cfg.AnthropicVersion)
	if err != nil {
		return provider.Call{}, provider.Wire{}, &llm.Error{Class: llm.ClassPermanent, Provider: p, Message: err.Error()}
	}
	cache, creds, err := c.credentials(ctx, cred.Profile, region)
	if err != nil {
		return provider.Call{}, provider.Wire{}, err
	}

	base := c.cfg.BaseURL
	if base == "" {
		base = Endpoint(region)
	}
	sum := sha256.Sum256(body)
	payloadHash := hex.EncodeToString(sum[:])
	h := http.Header{}
	h.Set("User-Agent", provider.UserAgent)
	h.Set("X-Amz-Content-Sha256", payloadHash)
	if accept != "" {
		h.Set("Accept", accept)
	}
	call := provider.Call{
		Provider: p,
		URL:      strings.TrimRight(base, "/") + path,
		Header:   h,
		Body:     body,
		Timeout:  c.cfg.Timeout,
		Sign: func(r *http.Request) error {
			return c.signer.SignHTTP(r.Context(), creds, r, payloadHash, SigningName, region, time.Now())
		},
	}
	// The Anthropic answer, whole or streamed, with Bedrock's error table;
	// no rate-limit headers.
	w := provider.Wire{
		Failure: func(r *provider.Reply, now time.Time) error {
			e := errorOf(p, r, creds, req.Model, now)
			if staleCredentials(e.Code) {
				cache.Invalidate()
			}
			return e
		},
		Decode:     anthropic.DecodeResponse,
		ReadStream: ReadStream,
		Redact:     func(msg string) string { return Redact(msg, creds) },
	}
	return call, w, nil
}

// credentials returns the cache of profile's credentials in region and
// the credentials it holds, or the error of a key whose credentials cannot
// be had or cannot sign.
func (c *Client) credentials(ctx context.Context, profile, region string) (*aws.CredentialsCache, aws.Credentials, error) {
	p := c.cfg.Provider
	cache, err := c.creds.provider(ctx, profile, region)
	if err != nil {
		return nil, aws.Credentials{}, c.credentialError(ctx, err, aws.Credentials{})
	}
	creds, err := cache.Retrieve(ctx)
	if err != nil {
		return nil, aws.Credentials{}, c.credentialError(ctx, err, creds)
	}
	if !creds.HasKeys() {
		return nil, aws.Credentials{}, &llm.Error{Class: llm.ClassAuth, Provider: p, Message: "credentials: no access key id or secret access key"}
	}
	if provider.BadHeaderValue(creds.AccessKeyID) || provider.BadHeaderValue(creds.SessionToken) {
		return nil, aws.Credentials{}, &llm.Error{Class: llm.ClassAuth, Provider: p, Message: "the credentials contain characters a header cannot carry"}
	}
	return cache, creds, nil
}

// credentialError is the error of credentials that could not be had: the
// caller's context error when it ended, else an auth failure of the key.
func (c *Client) credentialError(ctx context.Context, err error, creds aws.Credentials) error {
	if ctxErr := ctx.Err(); ctxErr != nil {
		return fmt.Errorf("%s: credentials: %w", c.cfg.Provider, ctxErr)
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		// A credential provider's own deadline (IMDS, STS): the key may be
		// fine, the chain was slow.
		return &llm.Error{Class: llm.ClassTransient, Provider: c.cfg.Provider, Message: "credentials: " + Redact(err.Error(), creds)}
	}
	return &llm.Error{Class: llm.ClassAuth, Provider: c.cfg.Provider, Message: "credentials: " + Redact(err.Error(), creds)}
}
