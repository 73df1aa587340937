package testkit_test

import (
	"os/exec"
	"strings"
	"testing"
)

const (
	module  = "github.com/snapcoord/snapcoord"
	testkit = module + "/internal/testkit"
)

// isTestkit reports whether the import path is testkit or below it.
func isTestkit(path string) bool {
	return path == testkit || strings.HasPrefix(path, testkit+"/")
}

// goList runs go list with args and returns its output's lines.
func goList(t *testing.T, args ...string) []string {
	t.Helper()
	// go test puts its own go first on PATH.
	out, err := exec.Command("go", append([]string{"list"}, args...)...).Output()
	if err != nil {
		t.Fatalf("go list %s: %v", strings.Join(args, " "), err)
	}
	return strings.Fields(string(out))
}

// Neither product binary contains a test kit, directly or through
// another package.
func TestBinariesDoNotDependOnTestkit(t *testing.T) {
	deps := goList(t, "-deps", module+"/cmd/snapcoord", module+"/cmd/snapctl")
	if len(deps) < 10 {
		t.Fatalf("go list -deps listed %d packages: %v", len(deps), deps)
	}
	for _, dep := range deps {
		if isTestkit(dep) {
			t.Errorf("cmd/snapcoord or cmd/snapctl depends on %s", dep)
		}
	}
}

// No package's non-test files import a test kit, except the test kits'
// own and those of the development tools (tools/dev).
func TestOnlyTestsAndDevToolsImportTestkit(t *testing.T) {
	// One line per package: its path, then what its non-test files import.
	lines := goList(t, "-f", "{{.ImportPath}}:{{join .Imports \",\"}}", module+"/...")
	for _, line := range lines {
		pkg, imports, _ := strings.Cut(line, ":")
		if isTestkit(pkg) || strings.HasPrefix(pkg, module+"/tools/dev/") {
			continue
		}
		for imp := range strings.SplitSeq(imports, ",") {
			if isTestkit(imp) {
				t.Errorf("%s imports %s outside its _test.go files", pkg, imp)
			}
		}
	}
}
