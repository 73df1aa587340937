package version

import (
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"strings"
	"testing"
)

func TestResolve(t *testing.T) {
	vcs := func(rev, modified string) []debug.BuildSetting {
		return []debug.BuildSetting{{Key: "vcs", Value: "git"}, {Key: "vcs.revision", Value: rev}, {Key: "vcs.modified", Value: modified}}
	}
	for _, tc := range []struct {
		name                      string
		bi                        debug.BuildInfo
		stampVersion, stampCommit string
		want                      Info
	}{
		{"go build in a checkout: the go command's stamps win",
			debug.BuildInfo{GoVersion: "go1.27.3", Main: debug.Module{Version: "v0.0.0-20261201143847-ff283cc1a2b3"}, Settings: vcs("ff283cc1a2b3", "false")},
			"v9-make", "make-commit", Info{"v0.0.0-20261201143847-ff283cc1a2b3", "ff283cc1a2b3", "go1.27.3"}},
		{"uncommitted changes",
			debug.BuildInfo{GoVersion: "go1.27.3", Main: debug.Module{Version: "v0.0.0-20261201143847-ff283cc1a2b3+dirty"}, Settings: vcs("ff283cc1a2b3", "true")},
			"", "", Info{"v0.0.0-20261201143847-ff283cc1a2b3+dirty", "ff283cc1a2b3-dirty", "go1.27.3"}},
		{"make build without VCS information: the Makefile's stamps",
			debug.BuildInfo{GoVersion: "go1.27.3", Main: debug.Module{Version: "(devel)"}},
			"ff283cc-dirty", "ff283cc1a2b3", Info{"ff283cc-dirty", "ff283cc1a2b3", "go1.27.3"}},
		{"go install of a release",
			debug.BuildInfo{GoVersion: "go1.27.3", Main: debug.Module{Version: "v1.2.0"}},
			"", "", Info{"v1.2.0", "unknown", "go1.27.3"}},
		{"nothing known",
			debug.BuildInfo{GoVersion: "go1.27.3", Main: debug.Module{Version: "(devel)"}},
			"", "", Info{"(devel)", "unknown", "go1.27.3"}},
	} {
		if got := resolve(&tc.bi, tc.stampVersion, tc.stampCommit); got != tc.want {
			t.Errorf("%s: resolve = %+v, want %+v", tc.name, got, tc.want)
		}
	}
}

// A binary built as `make build` builds it where the go command records no
// VCS information prints the Makefile's stamps, not "(devel)".
func TestStampedBuild(t *testing.T) {
	if testing.Short() {
		t.Skip("builds snapctl")
	}
	bin := filepath.Join(t.TempDir(), "snapctl")
	const pkg = "github.com/snapcoord/snapcoord/cmd/internal/version"
	build := exec.Command("go", "build", "-buildvcs=false",
		"-ldflags", "-X "+pkg+".stampedVersion=v0.9.0-3-gabc1234-dirty -X "+pkg+".stampedCommit=abc1234def",
		"-o", bin, "../../snapctl")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("%v: %v\n%s", build.Args, err, out)
	}
	for _, arg := range []string{"--version", "version"} {
		out, err := exec.Command(bin, arg).Output()
		if err != nil {
			t.Fatalf("snapctl %s: %v", arg, err)
		}
		if got := string(out); !strings.HasPrefix(got, "snapctl v0.9.0-3-gabc1234-dirty (commit abc1234def, go1.") {
			t.Errorf("snapctl %s = %q, want the stamped version and commit", arg, got)
		}
	}
}
