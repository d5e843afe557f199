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
// Bearer header by itself. It guards every operator surface: the /admin
// endpoints, /metrics, the profiles and /readyz's details.
func (s *Server) adminAuth(c *gin.Context) {
	if !s.isAdmin(c.Request) {
		s.adminRefused(c)
		return
	}
	c.Next()
}

// isAdmin reports whether r carries the admin token, compared in constant
// time. Without a configured admin token nothing is admin.
func (s *Server) isAdmin(r *http.Request) bool {
	return AdminToken(r, s.cfg.AdminToken)
}

// AdminToken reports whether r carries the admin token want: Bearer,
// x-api-key or the Basic-auth password, compared in constant time. A zero
// want accepts nothing. The worker's debug listener guards its profiles
// with it.
func AdminToken(r *http.Request, want secret.String) bool {
	tok := token(r)
	if _, pass, ok := r.BasicAuth(); ok {
		tok = secret.New(pass)
	}
	return !want.IsZero() && !tok.IsZero() && tok.Equal(want)
}

// adminRefused answers a request without the admin token: 401 with a
// Basic challenge (a browser then asks for it), saying what is wanted and
// never what the token is.
func (s *Server) adminRefused(c *gin.Context) {
	AdminRefused(c.Writer)
	c.Abort()
}

// AdminRefused writes the 401 of a request without the admin token, in
// the async API's error format.
func AdminRefused(w http.ResponseWriter) {
	w.Header().Set("WWW-Authenticate", `Basic realm="bulwark admin", charset="UTF-8"`)
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.WriteHeader(http.StatusUnauthorized)
	_, _ = w.Write([]byte(adminRefusedBody))
}

// adminRefusedBody is AdminRefused's body (errorBody).
const adminRefusedBody = `{"error":{"type":"unauthorized","message":"admin token required (Bearer, or as the Basic auth password)"}}`

// hasCredentials reports whether r sends any token at all.
func hasCredentials(r *http.Request) bool {
	return r.Header.Get("Authorization") != "" || r.Header.Get("x-api-key") != ""
}

// AdminOnly serves h only to requests carrying the admin token want
// (AdminToken); others get AdminRefused's 401.
func AdminOnly(want secret.String, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !AdminToken(r, want) {
			AdminRefused(w)
			return
		}
		h.ServeHTTP(w, r)
	})
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
