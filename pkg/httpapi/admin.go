package httpapi

import (
	"errors"
	"net/http"
	"time"

	"github.com/gin-gonic/gin"

	"bulwark/pkg/breaker"
	"bulwark/pkg/keypool"
	"bulwark/pkg/report"
)

func (s *Server) adminKeys(c *gin.Context) {
	keys, err := s.d.Keys.Snapshot(c.Request.Context())
	if err != nil {
		s.d.Logger.Error("admin: key snapshot", "err", err)
		apiError(c, http.StatusServiceUnavailable, "unavailable", "", "key pool state unavailable")
		return
	}
	c.JSON(http.StatusOK, gin.H{"keys": keys})
}

func (s *Server) adminEnableKey(c *gin.Context) {
	if err := s.d.Keys.Enable(c.Request.Context(), c.Param("id")); err != nil {
		s.keyAdminError(c, "enable", err)
		return
	}
	c.JSON(http.StatusOK, gin.H{"id": c.Param("id"), "disabled": false})
}

func (s *Server) adminDisableKey(c *gin.Context) {
	reason := c.Query("reason")
	if reason == "" {
		reason = "disabled by an operator"
	}
	if err := s.d.Keys.Disable(c.Request.Context(), c.Param("id"), reason); err != nil {
		s.keyAdminError(c, "disable", err)
		return
	}
	c.JSON(http.StatusOK, gin.H{"id": c.Param("id"), "disabled": true, "reason": reason})
}

// keyAdminError answers 404 for a key that is not configured and 503 when
// the pool's state cannot be changed (Redis down): an outage must not look
// like a typo.
func (s *Server) keyAdminError(c *gin.Context, op string, err error) {
	if errors.Is(err, keypool.ErrUnknownKey) {
		apiError(c, http.StatusNotFound, "not_found", "id", "no key "+c.Param("id"))
		return
	}
	s.d.Logger.Error("admin: "+op+" key", "key_id", c.Param("id"), "err", err)
	apiError(c, http.StatusServiceUnavailable, "unavailable", "", "key pool state unavailable")
}

func (s *Server) adminBreakers(c *gin.Context) {
	list, err := s.d.Breakers.List(c.Request.Context())
	if err != nil {
		s.d.Logger.Error("admin: breakers", "err", err)
		apiError(c, http.StatusServiceUnavailable, "unavailable", "", "breaker state unavailable")
		return
	}
	c.JSON(http.StatusOK, gin.H{"breakers": list})
}

func (s *Server) adminResetBreaker(c *gin.Context) {
	if err := s.d.Breakers.Reset(c.Request.Context(), c.Param("name")); err != nil {
		if errors.Is(err, breaker.ErrInvalidName) {
			apiError(c, http.StatusBadRequest, "invalid_request", "name", err.Error())
			return
		}
		s.d.Logger.Error("admin: reset breaker", "breaker", c.Param("name"), "err", err)
		apiError(c, http.StatusServiceUnavailable, "unavailable", "", "breaker state unavailable")
		return
	}
	c.JSON(http.StatusOK, gin.H{"name": c.Param("name"), "state": "closed"})
}

// invalidateBody is POST /admin/cache/invalidate: by case id, or a whole
// namespace (tenant and/or layer; both empty = everything).
type invalidateBody struct {
	Tenant string `json:"tenant"`
	CaseID string `json:"case_id"`
	Layer  string `json:"layer"`
	All    bool   `json:"all"`
}

func (s *Server) adminInvalidate(c *gin.Context) {
	var b invalidateBody
	if !decodeJSON(c, &b) {
		return
	}
	ctx := c.Request.Context()
	var n int64
	var err error
	switch {
	case b.CaseID != "":
		n, err = s.d.Cache.InvalidateCase(ctx, b.Tenant, b.CaseID)
	case b.Tenant != "" || b.Layer != "" || b.All:
		n, err = s.d.Cache.InvalidateNamespace(ctx, b.Tenant, b.Layer)
	default:
		apiError(c, http.StatusUnprocessableEntity, "invalid_request", "case_id",
			"give case_id, or tenant and/or layer, or all: true")
		return
	}
	if err != nil {
		s.d.Logger.Error("admin: invalidate", "err", err)
		apiError(c, http.StatusServiceUnavailable, "unavailable", "", "cache unavailable")
		return
	}
	c.JSON(http.StatusOK, gin.H{"deleted": n})
}

func (s *Server) adminReport(c *gin.Context) {
	to := time.Now()
	from := to.Add(-24 * time.Hour)
	if v := c.Query("from"); v != "" {
		t, err := time.Parse(time.RFC3339, v)
		if err != nil {
			apiError(c, http.StatusBadRequest, "invalid_request", "from", "must be RFC 3339")
			return
		}
		from = t
	}
	if v := c.Query("to"); v != "" {
		t, err := time.Parse(time.RFC3339, v)
		if err != nil {
			apiError(c, http.StatusBadRequest, "invalid_request", "to", "must be RFC 3339")
			return
		}
		to = t
	}
	r, err := s.d.Reporter.ReportJSON(c.Request.Context(), from, to)
	if err != nil {
		// A reversed, empty or too long period is the caller's mistake.
		if errors.Is(err, report.ErrRange) {
			apiError(c, http.StatusBadRequest, "invalid_request", "from", err.Error())
			return
		}
		apiError(c, http.StatusServiceUnavailable, "unavailable", "", "report unavailable: "+err.Error())
		return
	}
	c.JSON(http.StatusOK, r)
}
