package engine

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// wallClock are the time package functions that read or wait on the wall
// clock; the engine must use its injected clock.Clock instead.
var wallClock = []string{"Now", "Since", "Until", "Sleep", "After", "Tick", "NewTimer", "NewTicker", "AfterFunc"}

// purityViolations reports, for one parsed file, every gRPC import and every
// reference to a wall-clock function of package time.
func purityViolations(fset *token.FileSet, f *ast.File) []string {
	var out []string
	timeNames := map[string]bool{}
	for _, imp := range f.Imports {
		path, _ := strconv.Unquote(imp.Path.Value)
		if path == "google.golang.org/grpc" || strings.HasPrefix(path, "google.golang.org/grpc/") {
			out = append(out, fset.Position(imp.Pos()).String()+": imports "+path)
		}
		if path != "time" {
			continue
		}
		switch {
		case imp.Name == nil:
			timeNames["time"] = true
		case imp.Name.Name == ".":
			out = append(out, fset.Position(imp.Pos()).String()+`: dot-imports "time"`)
		case imp.Name.Name != "_":
			timeNames[imp.Name.Name] = true
		}
	}
	ast.Inspect(f, func(n ast.Node) bool {
		sel, ok := n.(*ast.SelectorExpr)
		if !ok {
			return true
		}
		if id, ok := sel.X.(*ast.Ident); ok && timeNames[id.Name] && slices.Contains(wallClock, sel.Sel.Name) {
			out = append(out, fset.Position(sel.Pos()).String()+": uses time."+sel.Sel.Name)
		}
		return true
	})
	return out
}

// The engine imports no gRPC package and never reads the wall clock: both
// are checked on the package's source, not on the build graph.
func TestEngineIsPure(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	checked := 0
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		if f.Name.Name != "engine" {
			continue
		}
		checked++
		for _, v := range purityViolations(fset, f) {
			t.Error(v)
		}
	}
	if checked < 5 || !slices.Contains(files, "engine.go") {
		t.Fatalf("checked %d files of %v: not the engine package?", checked, files)
	}
}

// The checker itself finds what it must.
func TestPurityCheckerFindsViolations(t *testing.T) {
	const src = `package x

import (
	"google.golang.org/grpc/status"
	tm "time"
)

var f = tm.Now

func g() { tm.Sleep(tm.Second); _ = status.New; _ = tm.AfterFunc }
`
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "x.go", src, 0)
	if err != nil {
		t.Fatal(err)
	}
	got := purityViolations(fset, f)
	want := []string{"imports google.golang.org/grpc/status", "time.Now", "time.Sleep", "time.AfterFunc"}
	if len(got) != len(want) {
		t.Fatalf("violations %v, want %d", got, len(want))
	}
	for i, w := range want {
		if !strings.Contains(got[i], w) {
			t.Errorf("violation %d = %q, want %q", i, got[i], w)
		}
	}
}
