package redisha_test

import (
	"fmt"

	"bulwark/pkg/testkit/redisha"
)

// The configuration file of one of three sentinels watching a master on
// port 6379.
func ExampleSentinelConfig() {
	doc, err := redisha.SentinelConfig(26379, "/tmp/ha", "bulwark", "127.0.0.1:6379")
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Print(doc)
	// Output:
	// port 26379
	// bind 127.0.0.1
	// dir /tmp/ha
	// sentinel monitor bulwark 127.0.0.1 6379 2
	// sentinel down-after-milliseconds bulwark 1000
	// sentinel failover-timeout bulwark 10000
	// sentinel parallel-syncs bulwark 1
}
