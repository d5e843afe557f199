package service_test

import (
	"os/exec"
	"strings"
	"testing"
)

// TestProgramsLeaveOutTheTestKit: the three programs never link what
// only tests and benchmarks use (pkg/testkit: the mock provider, the
// storm, the test environment), so the tree's split between what runs in
// production and what tests it holds in the binaries too.
func TestProgramsLeaveOutTheTestKit(t *testing.T) {
	t.Parallel()
	out, err := exec.CommandContext(t.Context(), "go", "list", "-deps", "bulwark/api", "bulwark/worker", "bulwark/scheduler").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	for dep := range strings.FieldsSeq(string(out)) {
		if strings.HasPrefix(dep, "bulwark/pkg/testkit") {
			t.Errorf("a program depends on %s", dep)
		}
	}
}
