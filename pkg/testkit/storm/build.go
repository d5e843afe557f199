package storm

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// Binaries are the built programs a scenario starts.
type Binaries struct {
	// API, Worker and Mock are absolute paths of ./api, ./worker and
	// ./scripts/mockprovider.
	API, Worker, Mock string
	// MockWindow reports whether the mock provider has a -window flag (its
	// enforcement window); when it does, scenarios pass -window 1s.
	MockWindow bool
}

// Build compiles ./api, ./worker and ./scripts/mockprovider of the module
// that the current directory belongs to into dir, without the race
// detector (the processes are the system under test, not the code under
// the race detector), and asks the mock for its flags.
func Build(ctx context.Context, dir string) (Binaries, error) {
	root, err := ModuleRoot(ctx)
	if err != nil {
		return Binaries{}, err
	}
	dir, err = filepath.Abs(dir)
	if err != nil {
		return Binaries{}, fmt.Errorf("storm: build: %w", err)
	}
	cmd := exec.CommandContext(ctx, "go", "build", "-o", dir+string(filepath.Separator), "./api", "./worker", "./scripts/mockprovider")
	cmd.Dir = root
	// A GOFLAGS=-race from the environment would build instrumented
	// binaries: the timings would be the race detector's.
	cmd.Env = append(os.Environ(), "GOFLAGS=")
	if out, err := cmd.CombinedOutput(); err != nil {
		return Binaries{}, fmt.Errorf("storm: go build in %s: %w\n%s", root, err, out)
	}
	b := Binaries{API: filepath.Join(dir, "api"), Worker: filepath.Join(dir, "worker"), Mock: filepath.Join(dir, "mockprovider")}

	// -h prints the flags and exits (status 0 or 2 depending on the flag
	// package's version); only the text matters.
	var usage bytes.Buffer
	h := exec.CommandContext(ctx, b.Mock, "-h")
	h.Stdout, h.Stderr = &usage, &usage
	_ = h.Run()
	b.MockWindow = strings.Contains(usage.String(), "-window")
	return b, nil
}

// ModuleRoot returns the folder of the go.mod that governs the current
// directory (`go env GOMOD`).
func ModuleRoot(ctx context.Context) (string, error) {
	out, err := exec.CommandContext(ctx, "go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("storm: go env GOMOD: %w", err)
	}
	gomod := strings.TrimSpace(string(out))
	if gomod == "" || gomod == os.DevNull {
		return "", fmt.Errorf("storm: not inside a Go module (go env GOMOD = %q)", gomod)
	}
	return filepath.Dir(gomod), nil
}
