package httpapi

import (
	_ "embed"
	"net/http"
	"slices"

	"github.com/gin-gonic/gin"
)

// openAPISpec is the OpenAPI 3.1 description of this package's endpoints,
// kept true by openapi_test.go (every route gin registers is described,
// every described route is registered) and by pkg/service's OpenAPI test
// (real answers have every field it marks required, and no other).
//
//go:embed openapi.json
var openAPISpec []byte

// OpenAPI returns the OpenAPI 3.1 description served at GET /openapi.json.
func OpenAPI() []byte { return slices.Clone(openAPISpec) }

// serveOpenAPI answers GET /openapi.json, without a token like /healthz.
func serveOpenAPI(c *gin.Context) {
	c.Data(http.StatusOK, "application/json", openAPISpec)
}
