package mockprovider

// Azure OpenAI on the mock.
//
//	POST /openai/deployments/{deployment}/chat/completions?api-version=...
//
// Azure serves OpenAI's Chat Completions wire format on a deployment of an
// Azure OpenAI resource; the mock parses and answers the body exactly as
// POST /v1/chat/completions does (chatWire) and imitates what is Azure's
// own. Each behaviour and where it comes from:
//
//   - The path and the required api-version query parameter: "Azure OpenAI
//     REST API reference", Chat completions, POST
//     https://{endpoint}/openai/deployments/{deployment-id}/chat/completions?api-version=2024-10-21,
//     api-version "Required" (https://learn.microsoft.com/azure/ai-foundry/openai/reference).
//     Any deployment name is accepted.
//   - A missing api-version is 400 {"error":{"code":"MissingApiVersionParameter",
//     "message":"The api-version query parameter (?api-version=) is required
//     for all requests."}}: Microsoft's REST API Guidelines for Azure
//     services, "versioning-api-version-missing"
//     (https://github.com/microsoft/api-guidelines/blob/vNext/azure/Guidelines.md).
//   - The key: the api-key header, or "Authorization: Bearer <token>" with a
//     Microsoft Entra ID token (REST reference, "Authentication"). The mock
//     accepts any non-empty value and meters by it, so every Entra caller
//     that shares a token shares its buckets. A missing one is 401 in
//     Azure's own error shape, {"error":{"code":"401","message":"Access
//     denied due to missing subscription key. ..."}}, as Azure answers it
//     (the reference does not spell the body out).
//   - Limits per deployment: "Assigning TPM to a deployment sets the
//     Tokens-Per-Minute (TPM) and Requests-Per-Minute (RPM) rate limits for
//     the deployment"; TPM counts the prompt and max_tokens at admission; RPM
//     "evaluates the rate of incoming requests over a small period of time,
//     typically 1 or 10 seconds" ("Manage Azure OpenAI quota",
//     https://learn.microsoft.com/azure/ai-foundry/openai/how-to/quota). So
//     each (key, deployment) has the buckets of Limits (the key's, else
//     DefaultLimits), exactly as the OpenAI endpoints meter them (see the
//     package doc, "Rate limits"), and two deployments never share them.
//   - Rate-limit headers: x-ratelimit-remaining-requests and
//     x-ratelimit-remaining-tokens on every answer, the two Azure sends
//     (the REST reference does not list response headers; they are
//     described in "Understanding Azure OpenAI's x-ratelimit-remaining-tokens
//     and x-ratelimit-remaining-requests headers" by Microsoft's Clemens
//     Siebler, and in Azure/azure-rest-api-specs#26884), plus
//     x-ratelimit-limit-{requests,tokens} and x-ratelimit-reset-{requests,tokens}
//     in whole seconds, which newer deployments send as well
//     (openai/openai-dotnet#838). The figures are the per-minute view, as on
//     the OpenAI endpoints (Azure's remaining-requests may count its 10 s
//     window instead).
//   - A refused call is 429 with retry-after-ms and retry-after ("the
//     retry-after and retry-after-ms response headers ... provide the time
//     in seconds and milliseconds respectively", "Get started with
//     provisioned deployments", Handling high utilization) and the body
//     {"error":{"code":"429","message":"Requests to the
//     ChatCompletions_Create Operation under Azure OpenAI API version
//     <version> have exceeded call rate limit of your current OpenAI S0
//     pricing tier. Please retry after N seconds. ..."}} ("token rate limit"
//     when the token bucket refused), the wording Azure's standard
//     deployments answer with ("Rate Limit Exceeded", the first of the 429
//     scenarios of the quota page above). A call whose tokens exceed the
//     deployment's TPM itself gets a 429 without retry headers.
//   - Provisioned (PTU) deployments, Config.AzurePTUDeployments: "When the
//     current utilization is above 100%, the service returns a 429 code with
//     the retry-after-ms header set to the time until utilization is below
//     100%" ("What is provisioned throughput?", How does the service decide
//     when to send a 429,
//     https://learn.microsoft.com/azure/ai-foundry/openai/concepts/provisioned-throughput).
//     The mock sends retry-after-ms and retry-after, and reports the
//     deployment's utilization in azure-openai-deployment-utilization
//     ("42.5%"; at least 100% on a 429), the header Microsoft's benchmarking
//     tool for provisioned deployments reads (github.com/Azure/azure-openai-benchmark),
//     instead of the x-ratelimit-* headers. Microsoft documents no body for
//     this 429: the mock's message is its own and says "provisioned
//     throughput", not a token or call rate limit of a pricing tier. A
//     PTU deployment's capacity is the Limits of the key calling it.
//   - The model's own errors keep OpenAI's shape, which Azure passes
//     through (a 400 invalid_request_error, a 500 server_error, the
//     insufficient_quota 429 of a quota fault); an overload fault is 503
//     with the wording Azure answers with, "That model is currently
//     overloaded with other requests..." (as reported in
//     scalaone/azure-openai-proxy#22).
//   - The request id goes in apim-request-id, as Azure's gateway sends it.
//   - The body's "model" is optional, as on Azure, where the deployment
//     names the model: the answer reports it, or the deployment's name.
//   - stream=true streams as on /v1/chat/completions (openai_stream.go):
//     Azure serves OpenAI's chunks. The content-filter annotations Azure
//     adds to a stream (prompt_filter_results in a first chunk with no
//     choices, content_filter_results on the others) are not sent.
//
// Stats and faults count Azure calls in the OpenAI wire family: a Fault
// with Provider "openai" (or "") also fails the Azure endpoint, and its
// calls are counted under "openai".

import (
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"
)

const (
	// azureUtilizationHeader reports a provisioned deployment's utilization.
	azureUtilizationHeader = "azure-openai-deployment-utilization"
	// azureMissingAPIVersion is the message of the Azure REST guidelines
	// for a request without api-version.
	azureMissingAPIVersion = "The api-version query parameter (?api-version=) is required for all requests."
	// azureQuotaLink ends Azure's rate-limit messages.
	azureQuotaLink = "Please go here: https://aka.ms/oai/quotaincrease if you would like to further increase the default rate limit."
)

// azurePTUSet is the set of Config.AzurePTUDeployments.
func azurePTUSet(names []string) map[string]bool {
	set := make(map[string]bool, len(names))
	for _, n := range names {
		if n != "" {
			set[n] = true
		}
	}
	return set
}

// serveAzureChat serves POST /openai/deployments/{deployment}/chat/completions.
func (s *Server) serveAzureChat(w http.ResponseWriter, r *http.Request) {
	d := r.PathValue("deployment")
	s.serve(w, r, azureWire{deployment: d, apiVersion: r.URL.Query().Get("api-version"), ptu: s.azurePTU[d]})
}

// azureWire is Azure OpenAI chat completions on one deployment. It parses
// as chatWire does; its stats and faults are Azure's own ("azure"), so a
// fault on OpenAI leaves Azure answering, as two clouds would.
type azureWire struct {
	openAIBase
	deployment string
	apiVersion string
	ptu        bool // a provisioned (PTU) deployment
}

// providerAzure names the Azure wire in stats and faults.
const providerAzure provider = "azure"

func (azureWire) provider() provider { return providerAzure }

// endpoint names the deployment's buckets: each deployment limits apart.
func (a azureWire) endpoint() string { return "azure/" + a.deployment }

func (azureWire) requestIDHeader() string { return "apim-request-id" }

// apiKey reads the api-key header, else a Bearer token.
func (azureWire) apiKey(r *http.Request) string {
	if k := strings.TrimSpace(r.Header.Get("api-key")); k != "" {
		return k
	}
	return bearerKey(r)
}

func (a azureWire) preflight(*http.Request) *apiError {
	if a.apiVersion == "" {
		return &apiError{kind: errInvalid, message: azureMissingAPIVersion}
	}
	return nil
}

// parse reads the body as Chat Completions, the deployment standing in for
// a missing model.
func (a azureWire) parse(body []byte) (*call, *apiError) {
	var fields map[string]json.RawMessage
	if json.Unmarshal(body, &fields) == nil {
		var model string
		if raw, ok := fields["model"]; !ok || json.Unmarshal(raw, &model) != nil || model == "" {
			fields["model"], _ = json.Marshal(a.deployment) // marshalling a string cannot fail
			if b, err := json.Marshal(fields); err == nil {
				body = b
			}
		}
	}
	return chatWire{}.parse(body)
}

// setRateHeaders writes x-ratelimit-{limit,remaining,reset}-{requests,tokens}
// (resets in whole seconds, rounded up) for a standard deployment, and the
// utilization header for a provisioned one.
func (a azureWire) setRateHeaders(h http.Header, s snapshot) {
	if a.ptu {
		if u, ok := utilization(s); ok {
			h.Set(azureUtilizationHeader, formatUtilization(u))
		}
		return
	}
	set := func(name string, st state) {
		if !st.limited {
			return
		}
		h.Set("x-ratelimit-limit-"+name, strconv.Itoa(st.limit))
		h.Set("x-ratelimit-remaining-"+name, strconv.Itoa(st.remaining))
		h.Set("x-ratelimit-reset-"+name, strconv.FormatInt(ceilSeconds(st.reset), 10))
	}
	set("requests", s.requests)
	set("tokens", s.tokens)
}

// utilization is the used share of the per-minute token bucket (of the
// request bucket when tokens are unlimited), in percent; false when the key
// is unlimited.
func utilization(s snapshot) (float64, bool) {
	st := s.tokens
	if !st.limited {
		st = s.requests
	}
	if !st.limited || st.limit <= 0 {
		return 0, false
	}
	return 100 * float64(st.limit-st.remaining) / float64(st.limit), true
}

// formatUtilization renders a percentage as the utilization header does:
// "42.5%".
func formatUtilization(u float64) string {
	return strconv.FormatFloat(math.Round(u*10)/10, 'f', 1, 64) + "%"
}

// ceilSeconds is d in whole seconds, rounded up; 0 for d <= 0.
func ceilSeconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Second - 1) / time.Second)
}

// azureErrorBody is Azure's own error shape.
type azureErrorBody struct {
	Error azureErrorDetail `json:"error"`
}

type azureErrorDetail struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

func (a azureWire) writeError(w http.ResponseWriter, e *apiError, requestID string) {
	switch {
	case e.kind == errInvalid && e.message == azureMissingAPIVersion:
		writeJSON(w, http.StatusBadRequest, azureErrorBody{Error: azureErrorDetail{Code: "MissingApiVersionParameter", Message: e.message}})
	case e.kind == errAuth:
		writeJSON(w, http.StatusUnauthorized, azureErrorBody{Error: azureErrorDetail{Code: "401",
			Message: "Access denied due to missing subscription key. Make sure to include subscription key when making requests to an API."}})
	case e.kind == errRateLimit || e.kind == errTooLarge:
		a.writeRateLimit(w, e)
	case e.kind == errOverloaded:
		c := *e
		if c.custom == "" {
			c.custom = "That model is currently overloaded with other requests. You can retry your request, or contact us " +
				"through an Azure support request at: https://go.microsoft.com/fwlink/?linkid=2213926 if the error persists."
		}
		a.openAIBase.writeError(w, &c, requestID)
	default:
		a.openAIBase.writeError(w, e, requestID)
	}
}

// writeRateLimit writes a 429: a standard deployment's rate-limit answer,
// or a provisioned deployment's "capacity full" one.
func (a azureWire) writeRateLimit(w http.ResponseWriter, e *apiError) {
	op := "Requests to the ChatCompletions_Create Operation under Azure OpenAI API version " + a.apiVersion
	var msg string
	switch {
	case a.ptu && e.kind == errTooLarge:
		msg = fmt.Sprintf("%s exceed the provisioned throughput of deployment '%s': this request asks for %d tokens, more than the deployment processes in a minute.",
			op, a.deployment, e.requested)
	case a.ptu:
		msg = fmt.Sprintf("%s have exceeded the provisioned throughput of deployment '%s': its utilization is above 100%%. Please retry after %d milliseconds.",
			op, a.deployment, retryAfterMillis(e.retryAfter))
	case e.kind == errTooLarge:
		msg = fmt.Sprintf("%s have exceeded token rate limit of your current OpenAI S0 pricing tier. This request asks for %d tokens, "+
			"more than the limit of %d tokens per minute: reduce the prompt or max_tokens. %s", op, e.requested, e.limit, azureQuotaLink)
	default:
		limit := "call"
		if e.limitedBy != limitByRequests {
			limit = "token"
		}
		secs := retryAfterSeconds(e.retryAfter)
		unit := "seconds"
		if secs == 1 {
			unit = "second"
		}
		msg = fmt.Sprintf("%s have exceeded %s rate limit of your current OpenAI S0 pricing tier. Please retry after %d %s. %s",
			op, limit, secs, unit, azureQuotaLink)
	}
	if e.custom != "" {
		msg = e.custom
	}
	if e.retryAfter > 0 {
		w.Header().Set("retry-after", strconv.FormatInt(retryAfterSeconds(e.retryAfter), 10))
		w.Header().Set("retry-after-ms", strconv.FormatInt(retryAfterMillis(e.retryAfter), 10))
	}
	if a.ptu {
		u, _ := strconv.ParseFloat(strings.TrimSuffix(w.Header().Get(azureUtilizationHeader), "%"), 64)
		w.Header().Set(azureUtilizationHeader, formatUtilization(max(u, 100)))
	}
	writeJSON(w, http.StatusTooManyRequests, azureErrorBody{Error: azureErrorDetail{Code: "429", Message: msg}})
}
