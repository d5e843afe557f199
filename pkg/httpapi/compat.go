package httpapi

import (
	"net/http"

	"github.com/gin-gonic/gin"
)

func openAIError(c *gin.Context, status int, code, msg string) {
	c.AbortWithStatusJSON(status, gin.H{"error": gin.H{"message": msg, "type": "invalid_request_error", "param": nil, "code": code}})
}

func anthropicError(c *gin.Context, status int, typ, msg string) {
	c.AbortWithStatusJSON(status, gin.H{"type": "error", "error": gin.H{"type": typ, "message": msg}})
}

func (s *Server) openAIChat(c *gin.Context) {
	openAIError(c, http.StatusNotImplemented, "not_implemented", "not implemented yet")
}

func (s *Server) anthropicMessages(c *gin.Context) {
	anthropicError(c, http.StatusNotImplemented, "api_error", "not implemented yet")
}
