package service_test

import (
	"os"
	"testing"

	"github.com/gin-gonic/gin"
)

// TestMain sets gin's process-wide mode, as cmd api's main does: no
// package of Bulwark sets it.
func TestMain(m *testing.M) {
	gin.SetMode(gin.TestMode)
	os.Exit(m.Run())
}
