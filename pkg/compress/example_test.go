package compress_test

import (
	"fmt"
	"strings"

	"bulwark/pkg/compress"
	"bulwark/pkg/llm"
)

// Compress the copy of a request that goes to the provider; cache keys
// stay computed on the original.
func Example() {
	c, err := compress.New(compress.Config{}) // once, at start-up; nil when compression is off
	if err != nil {
		panic(err)
	}
	var log []string
	log = append(log, "2024-11-03T08:15:20.050Z [UDS]    ECU-7E0  SW version 2.4.1")
	for i := range 40 {
		log = append(log, fmt.Sprintf("2024-11-03T08:15:2%d.%d00Z [GW]     U0100 lost communication with ECM", 1+i/10, i%10))
	}
	log = append(log, "2024-11-03T08:15:25.000Z [DTC]    ECU BMS  stored P0A80")
	req := &llm.Request{
		System: "You are a vehicle diagnosis assistant.",
		Messages: []llm.Message{{Role: llm.RoleUser, Content: []llm.Block{
			{Type: llm.BlockText, Text: "Why did the update fail?\n" + strings.Join(log, "\n")},
		}}},
		MaxTokens: 1024,
	}
	// Cache keys (cache.KeyOf), the tool-results hash and coalescing refs
	// are computed on req; only out goes to the provider.
	out, saved := c.Request(req)
	fmt.Println(out.Messages[0].Content[0].Text)
	fmt.Println("tokens saved:", saved)
	// Output:
	// Why did the update fail?
	// 2024-11-03T08:15:20.050Z [UDS] ECU-7E0 SW version 2.4.1
	// 2024-11-03T08:15:21.000Z [GW] U0100 lost communication with ECM
	// [previous line repeated 39 more times, last at 2024-11-03T08:15:24.900Z]
	// 2024-11-03T08:15:25.000Z [DTC] ECU BMS stored P0A80
	// tokens saved: 647
}
