package coordinator_test

import (
	"go/parser"
	"go/token"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// serverImporters are the binaries (of cmd/ and tools/dev/) allowed to
// import server/ packages other than this one, and why. Everything else
// reaches the coordinator through this package, the server's assembly
// (snapcoord, snapbench), or through the API (snapctl and the other
// clients show what the API returns).
var serverImporters = map[string]string{
	// The simulator replays server/deadline's policies on synthetic
	// workloads: running the coordinator's own rule is its purpose.
	"snapsim": "server/deadline",
}

// No binary imports a server/ package but this one, and the listed
// exceptions.
func TestNoCommandImportsServer(t *testing.T) {
	var files []string
	for _, dir := range []string{"../../cmd/*/*.go", "../../tools/dev/*/*.go"} {
		found, err := filepath.Glob(dir)
		if err != nil || len(found) == 0 {
			t.Fatalf("no sources in %s: %v", dir, err)
		}
		files = append(files, found...)
	}
	const server = "github.com/snapcoord/snapcoord/server/"
	const assembly = server + "coordinator"
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
			if rest, ok := strings.CutPrefix(path, server); ok && path != assembly && serverImporters[cmd] != "server/"+rest {
				t.Errorf("%s imports %s: go through package coordinator or the API", f, path)
			}
		}
	}
}
