package service_test

import (
	"os"
	"testing"

	"github.com/gin-gonic/gin"
)

// TestMain sets gin's process-wide mode, as cmd api's main does: no
// package of Bulwark sets it. It also gives the AWS SDK's default
// credential chain static test credentials (the Bedrock routes sign with
// them against the mock) and keeps it off the instance metadata service.
func TestMain(m *testing.M) {
	gin.SetMode(gin.TestMode)
	for k, v := range map[string]string{
		"AWS_ACCESS_KEY_ID": "AKIDBULWARKTEST", "AWS_SECRET_ACCESS_KEY": "bulwark-test-secret",
		"AWS_EC2_METADATA_DISABLED": "true", "AWS_CONFIG_FILE": os.DevNull, "AWS_SHARED_CREDENTIALS_FILE": os.DevNull,
	} {
		if err := os.Setenv(k, v); err != nil {
			panic(err)
		}
	}
	os.Exit(m.Run())
}
