package bedrock

import (
	"os"
	"testing"

	"go.uber.org/goleak"
)

// TestMain makes the default credential chain hermetic: no credentials,
// profile or shared files of the machine running the tests, and never the
// instance metadata service (nothing leaves 127.0.0.1). Tests that want
// the chain to find something set it up with t.Setenv. It also fails the
// package if a test leaves a goroutine behind.
func TestMain(m *testing.M) {
	for _, k := range []string{"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE",
		"AWS_DEFAULT_PROFILE", "AWS_REGION", "AWS_DEFAULT_REGION", "AWS_ROLE_ARN", "AWS_WEB_IDENTITY_TOKEN_FILE",
		"AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "AWS_CONTAINER_CREDENTIALS_FULL_URI", "AWS_BEARER_TOKEN_BEDROCK"} {
		_ = os.Unsetenv(k)
	}
	_ = os.Setenv("AWS_EC2_METADATA_DISABLED", "true")
	_ = os.Setenv("AWS_CONFIG_FILE", os.DevNull)
	_ = os.Setenv("AWS_SHARED_CREDENTIALS_FILE", os.DevNull)
	goleak.VerifyTestMain(m)
}
