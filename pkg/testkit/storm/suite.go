package storm

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"
)

// stopReserve is what a scenario needs beyond its load: start-up, and
// stopping the processes (at most SIGTERM + 10 s + SIGKILL).
const stopReserve = 20 * time.Second

// Main is the storm command (scripts/storm) and TestStormBench: it parses
// args, builds the binaries, runs the scenarios in order, prints one line
// per scenario on stdout, then the targets each missed, and returns the
// exit code: 0 when every target was met, 1 when one was missed or a
// scenario could not run, 2 for bad arguments.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("storm", flag.ContinueOnError)
	fs.SetOutput(stderr)
	names := fs.String("scenarios", strings.Join(ScenarioNames, ","), "scenarios to run, in order")
	n := fs.Int("n", 400, "requests per scenario")
	clients := fs.Int("clients", 50, "concurrent clients")
	limit := fs.Duration("limit", 0, "hard time limit of each scenario's load (0: the keys' time for -n at capacity + 12s)")
	// 570 s: the 285 s the five S1/S2 scenarios had, plus S3-mixed's
	// minute (about 35 s in all, its limit 56 s), plus the two fleet
	// scenarios' 135 s (about 65 s each, their limits 62 s), plus S4-tpm's
	// 90 s (about 80 s, its limit 80 s); each earlier scenario keeps at
	// least the room it had before.
	budget := fs.Duration("budget", 570*time.Second, "time for all scenarios together, after the build; a scenario's limit shrinks to fit")
	keep := fs.Bool("keep", false, "keep each scenario's folder (config.yaml, process logs) and print it")
	logs := fs.Bool("logs", false, "print the last lines of every process's log after each scenario")
	estimates := fs.String("estimates", "", "folder to write each async scenario's queue estimates to, as <scenario>-estimates.csv")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	var scenarios []Scenario
	for name := range strings.SplitSeq(*names, ",") {
		sc, err := NewScenario(strings.TrimSpace(name), *n, *clients, *limit)
		if err != nil {
			printLine(stderr, err)
			return 2
		}
		scenarios = append(scenarios, sc)
	}

	binDir, err := os.MkdirTemp("", "bulwark-storm-bin-*")
	if err != nil {
		printLine(stderr, "storm:", err)
		return 1
	}
	defer func() { _ = os.RemoveAll(binDir) }()
	printLine(stderr, "storm: building ./api ./worker ./scripts/mockprovider (no -race) …")
	bins, err := Build(ctx, binDir)
	if err != nil {
		printLine(stderr, err)
		return 1
	}
	window := "1s (-window 1s)"
	if !bins.MockWindow {
		window = "the mock's built-in metering (this mockprovider has no -window flag)"
	}
	printf(stdout, "storm: %d keys x %d RPM = %.0f requests/s capacity; mock enforcement window: %s\n",
		Keys, KeyRPM, Capacity(), window)

	for _, sc := range scenarios {
		if sc.Mixed {
			printf(stdout, "storm: %s: claude/sonnet 1 key x %d RPM, fallback [bedrock/sonnet 2 regions x %d RPM, azure/gpt4o PTU %d + standard %d RPM]"+
				" = %.0f requests/s of cloud capacity; router layer to local/qwen, max_in_flight %d (the mock answers 503 busy beyond); mock in this process\n",
				sc.Name, MixedClaudeRPM, MixedBedrockRPM, MixedAzurePTURPM, MixedAzureStdRPM, MixedCloudCapacity(), MixedLocalInFlight)
			break
		}
	}
	for _, sc := range scenarios {
		if sc.PoolTPM > 0 {
			printf(stdout, "storm: %s: %d keys x %d TPM, max_tokens %d, about %.0f tokens a call (prompt + max_tokens, kept at admission)"+
				" = %.2f requests/s of token capacity (RPM allows %.0f)\n",
				sc.Name, sc.keys(), sc.keyTPM(), sc.maxTokens(), sc.callTokens(), sc.capacity(), float64(sc.keys()*sc.keyRPM())/60)
		}
	}
	env := Env{Bins: bins, PGAdminDSN: PGAdminDSN(), KeepDir: *keep, EstimatesDir: *estimates}
	deadline := time.Now().Add(*budget)
	var misses []string
	for i, sc := range scenarios {
		// Leave every later scenario at least its reserve plus a little
		// load time.
		left := time.Until(deadline) - time.Duration(len(scenarios)-i-1)*(stopReserve+10*time.Second) - stopReserve
		if left < 10*time.Second {
			misses = append(misses, fmt.Sprintf("%s: not run, the %s budget is spent", sc.Name, *budget))
			printf(stdout, "%-13s NOT RUN: the %s budget is spent\n", sc.Name, *budget)
			continue
		}
		if sc.Limit > left {
			sc.Limit = left
		}
		res, err := Run(ctx, env, sc)
		printLine(stdout, res.String())
		if res.Dir != "" {
			printf(stdout, "%-13s logs and config in %s\n", "", res.Dir)
		}
		if *logs || err != nil {
			printf(stderr, "%s", res.Logs)
		}
		if err != nil {
			printLine(stderr, err)
			misses = append(misses, fmt.Sprintf("%s: %v", sc.Name, firstLine(err)))
		}
		for _, m := range res.Misses(sc.Targets) {
			misses = append(misses, sc.Name+": "+m)
		}
		if ctx.Err() != nil {
			break
		}
	}
	if len(misses) == 0 {
		printLine(stdout, "storm: every target met")
		return 0
	}
	printLine(stdout, "storm: targets missed:")
	for _, m := range misses {
		printLine(stdout, "  "+m)
	}
	return 1
}

// printf and printLine write the command's output; a failed write to a
// terminal or pipe leaves nobody to tell.
func printf(w io.Writer, format string, args ...any) { _, _ = fmt.Fprintf(w, format, args...) }

func printLine(w io.Writer, args ...any) { _, _ = fmt.Fprintln(w, args...) }

func firstLine(err error) string {
	s, _, _ := strings.Cut(err.Error(), "\n")
	if errors.Is(err, context.Canceled) {
		return "interrupted"
	}
	return s
}
