package azure

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package if a test leaves a goroutine behind (an
// unclosed response body, a server that was never stopped).
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
