package client

import (
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// pythonRetryList is the Python client's list of retried methods, which
// must be the Go client's: the two clients of one coordinator repeat the
// same calls, for the same reasons.
const pythonRetryList = "python/snapcoord/_retry.py"

// TestPythonRetryListMatchesGo fails when client/python's RETRIED_METHODS and
// the retried map disagree, naming the methods only one of them lists.
func TestPythonRetryListMatchesGo(t *testing.T) {
	src, err := os.ReadFile(pythonRetryList)
	if err != nil {
		t.Fatal(err)
	}
	// The frozenset literal: from its name to the first closing parenthesis
	// at the start of a line.
	block := regexp.MustCompile(`(?s)RETRIED_METHODS: frozenset\[str\] = frozenset\(\n(.*?)\n\)`).FindSubmatch(src)
	if block == nil {
		t.Fatalf("%s: no RETRIED_METHODS frozenset literal found", pythonRetryList)
	}
	var py []string
	for _, m := range regexp.MustCompile(`"(/[^"]+)"`).FindAllSubmatch(block[1], -1) {
		py = append(py, string(m[1]))
	}
	var goList []string
	for method, ok := range retried {
		if ok {
			goList = append(goList, method)
		}
	}
	slices.Sort(py)
	slices.Sort(goList)
	if len(py) == 0 {
		t.Fatalf("%s: RETRIED_METHODS lists no method", pythonRetryList)
	}
	if onlyGo, onlyPy := missing(goList, py), missing(py, goList); len(onlyGo)+len(onlyPy) > 0 {
		t.Errorf("the Go and Python retry lists disagree:\n only in client/retry.go: %s\n only in %s: %s",
			strings.Join(onlyGo, ", "), pythonRetryList, strings.Join(onlyPy, ", "))
	}
	if dup := len(py) - len(slices.Compact(slices.Clone(py))); dup > 0 {
		t.Errorf("%s lists %d method(s) twice", pythonRetryList, dup)
	}
}

// missing lists the elements of a that b lacks.
func missing(a, b []string) []string {
	var out []string
	for _, s := range a {
		if !slices.Contains(b, s) {
			out = append(out, s)
		}
	}
	return out
}
