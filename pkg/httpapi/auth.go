package httpapi

import (
	"mime"
	"net/http"
	"net/url"
	"strings"

	"github.com/gin-gonic/gin"

	"bulwark/pkg/intake"
	"bulwark/pkg/secret"
)

// token reads the client token the way each SDK sends it: Authorization:
// Bearer (OpenAI, our API) or x-api-key (Anthropic).
func token(r *http.Request) secret.String {
	if h := r.Header.Get("Authorization"); h != "" {
		if t, ok := strings.CutPrefix(h, "Bearer "); ok {
			return secret.New(strings.TrimSpace(t))
		}
	}
	return secret.New(strings.TrimSpace(r.Header.Get("x-api-key")))
}

func (s *Server) auth(c *gin.Context) {
	tok := token(c.Request)
	if tok.IsZero() {
		s.authError(c, "missing client token: send Authorization: Bearer <token> or x-api-key")
		return
	}
	t, ok := s.cfg.Tenants[tok.SHA256()]
	if !ok {
		s.authError(c, "invalid client token")
		return
	}
	c.Set(ctxTenant, t)
	c.Next()
}

func (s *Server) authError(c *gin.Context, msg string) {
	routeError(c, http.StatusUnauthorized, "invalid_api_key", msg)
}

// adminAuth accepts the admin token as a Bearer token, or as the password
// of HTTP Basic auth (any user name) so that an operator can open the
// asynqmon dashboard at /admin/queues in a browser, which cannot send a
// Bearer header by itself.
func (s *Server) adminAuth(c *gin.Context) {
	tok := token(c.Request)
	if _, pass, ok := c.Request.BasicAuth(); ok {
		tok = secret.New(pass)
	}
	if s.cfg.AdminToken.IsZero() || tok.IsZero() || !tok.Equal(s.cfg.AdminToken) {
		c.Header("WWW-Authenticate", `Basic realm="bulwark admin", charset="UTF-8"`)
		apiError(c, http.StatusUnauthorized, "unauthorized", "", "admin token required (Bearer, or as the Basic auth password)")
		return
	}
	c.Next()
}

func tenantOf(c *gin.Context) intake.Tenant {
	t, _ := c.MustGet(ctxTenant).(intake.Tenant)
	return t
}

// sameSite refuses a state-changing admin request that a browser sent on
// behalf of another site. A browser resends Basic-auth credentials on
// cross-site requests, so without this a page an operator visits could
// disable keys, reset breakers or empty the cache. Requests from scripts
// and curl send neither header and pass; asynqmon's own pages are
// same-origin.
func sameSite(c *gin.Context) {
	switch c.Request.Method {
	case http.MethodGet, http.MethodHead, http.MethodOptions:
		c.Next()
		return
	}
	if site := c.GetHeader("Sec-Fetch-Site"); site != "" && site != "same-origin" && site != "none" {
		apiError(c, http.StatusForbidden, "cross_site", "", "cross-site admin requests are refused")
		return
	}
	if origin := c.GetHeader("Origin"); origin != "" {
		u, err := url.Parse(origin)
		if err != nil || u.Host != c.Request.Host {
			apiError(c, http.StatusForbidden, "cross_site", "", "admin requests from another origin are refused")
			return
		}
	}
	c.Next()
}

// jsonOnly refuses a state-changing admin request whose Content-Type is
// not application/json, body or not. An HTML form can only send
// form-encoded or text bodies, and a cross-site script asking for JSON
// needs a CORS preflight that nothing here answers: with sameSite, no page
// can drive the admin endpoints through an operator's browser.
func jsonOnly(c *gin.Context) {
	mt, _, err := mime.ParseMediaType(c.GetHeader("Content-Type"))
	if err != nil || mt != "application/json" {
		apiError(c, http.StatusUnsupportedMediaType, "json_required", "Content-Type",
			"admin writes require Content-Type: application/json (even without a body)")
		return
	}
	c.Next()
}
