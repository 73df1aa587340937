package coordinator_test

import (
	"go/parser"
	"go/token"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// serverImporters are the cmd/ binaries allowed to import server/ packages,
// and why. Everything else reaches the coordinator through this package
// (snapcoord, snapbench) or through the API (snapctl and the other clients
// show what the API returns).
var serverImporters = map[string]string{
	// The simulator replays server/deadline's policies on synthetic
	// workloads: running the coordinator's own rule is its purpose.
	"snapsim": "server/deadline",
}

// No cmd/ binary imports a server/ package, but the listed exceptions.
func TestNoCommandImportsServer(t *testing.T) {
	files, err := filepath.Glob("../cmd/*/*.go")
	if err != nil || len(files) == 0 {
		t.Fatalf("no cmd/ sources: %v", err)
	}
	const server = "github.com/snapcoord/snapcoord/server/"
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		parsed, err := parser.ParseFile(token.NewFileSet(), f, nil, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		cmd := filepath.Base(filepath.Dir(f))
		for _, imp := range parsed.Imports {
			path, _ := strconv.Unquote(imp.Path.Value)
			if rest, ok := strings.CutPrefix(path, server); ok && serverImporters[cmd] != "server/"+rest {
				t.Errorf("%s imports %s: go through package coordinator or the API", f, path)
			}
		}
	}
}
