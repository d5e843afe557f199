package metrics_test

import (
	"context"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"bulwark/pkg/llm"
	"bulwark/pkg/metrics"
)

// A process builds its metrics on its own registry; the process that
// serves the shared state adds the state collector.
func ExampleNew() {
	reg := prometheus.NewRegistry()
	m := metrics.New(reg)
	reg.MustRegister(metrics.NewStateCollector(func(ctx context.Context) (metrics.State, error) {
		// Read queue depths, slots, keys and breakers from Redis here.
		return metrics.State{QueueDepth: map[string]int{"critical": 0, "low": 12}}, nil
	}, 0))

	route := llm.Route{Provider: llm.ProviderClaude, Tier: "sonnet"}
	m.InitKeys("claude-1", "claude-2")
	m.ObserveCall(route, "claude-1", &llm.Error{Class: llm.ClassRateLimited, Status: 429}, 120*time.Millisecond)
	m.ObserveCall(route, "claude-2", nil, 2*time.Second)
	m.AddUsage(route, llm.Usage{InputTokens: 1200, OutputTokens: 300}, metrics.Price{InputPerMTok: 3, OutputPerMTok: 15})

	mfs, _ := reg.Gather()
	for _, mf := range mfs {
		if mf.GetName() == metrics.NameProviderCalls {
			for _, s := range mf.GetMetric() { // labels sorted: key_id, outcome, provider, tier
				fmt.Println(s.GetLabel()[0].GetValue(), s.GetLabel()[1].GetValue(), s.GetCounter().GetValue())
			}
		}
	}
	// Output:
	// claude-1 rate_limited 1
	// claude-2 ok 1
}

func ExampleOutcome() {
	fmt.Println(metrics.Outcome(nil))
	fmt.Println(metrics.Outcome(&llm.Error{Class: llm.ClassQuota, Status: 429, Code: "insufficient_quota"}))
	fmt.Println(metrics.Outcome(&llm.Error{Class: llm.ClassTransient, Err: context.DeadlineExceeded}))
	fmt.Println(metrics.Outcome(&llm.Error{Class: llm.ClassPermanent, Status: 400}))
	fmt.Println(metrics.Outcome(&llm.Error{Class: llm.ClassRateLimited, Status: 429}))
	fmt.Println(metrics.Outcome(&llm.Error{Class: llm.ClassRateLimited, Status: 429, Code: llm.CodeCapacityFull}))
	// Output:
	// ok
	// quota
	// timeout
	// bad_request
	// rate_limited
	// capacity_full
}

func ExampleCost() {
	sonnet := metrics.Price{InputPerMTok: 3, OutputPerMTok: 15}
	fmt.Printf("$%.4f\n", metrics.Cost(sonnet, llm.Usage{InputTokens: 1200, OutputTokens: 300}))
	// Output: $0.0081
}
