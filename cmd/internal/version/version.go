// Package version says which build of snapctl or snapcoord is running:
// its version, its commit and the Go release that built it.
//
// The go command stamps the version and the commit into every build made in
// a git checkout (debug.ReadBuildInfo). A build without that information (a
// source tarball, -buildvcs=false) uses what `make build` stamps with
// -ldflags:
//
//	-X github.com/snapcoord/snapcoord/cmd/internal/version.stampedVersion=$(git describe --always --dirty)
//	-X github.com/snapcoord/snapcoord/cmd/internal/version.stampedCommit=$(git rev-parse HEAD)
package version

import (
	"fmt"
	"runtime"
	"runtime/debug"
)

// Set by `make build` with -ldflags -X; used only when the build info has
// no VCS information.
var stampedVersion, stampedCommit string

// Info is one build.
type Info struct {
	Version, Commit, GoVersion string
}

// String is the line `--version` prints: "snapctl v1.2.3 (commit 1a2b3c…, go1.27.3)".
func String(program string) string {
	i := Get()
	return fmt.Sprintf("%s %s (commit %s, %s)", program, i.Version, i.Commit, i.GoVersion)
}

// Get reads the running binary's build.
func Get() Info {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		bi = &debug.BuildInfo{GoVersion: runtime.Version()}
	}
	return resolve(bi, stampedVersion, stampedCommit)
}

// resolve prefers what the go command recorded and falls back to the
// stamps, then to "(devel)" and "unknown".
func resolve(bi *debug.BuildInfo, stampVersion, stampCommit string) Info {
	var revision string
	var modified bool
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			revision = s.Value
		case "vcs.modified":
			modified = s.Value == "true"
		}
	}
	i := Info{Version: bi.Main.Version, Commit: revision, GoVersion: bi.GoVersion}
	if modified {
		i.Commit += "-dirty"
	}
	if revision == "" {
		i.Commit = stampCommit
	}
	if i.Version == "" || i.Version == "(devel)" {
		i.Version = stampVersion
	}
	i.Version = orDefault(i.Version, "(devel)")
	i.Commit = orDefault(i.Commit, "unknown")
	i.GoVersion = orDefault(i.GoVersion, runtime.Version())
	return i
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}
