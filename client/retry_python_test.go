package client

import (
	"cmp"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
	"github.com/snapcoord/snapcoord/internal/apifacts"
)

// pythonDir is the Python client, which must read the API's facts as the
// Go client does: the same retried calls (the (snapcoord.v1.rpc) options)
// and the same terminal run states (the (snapcoord.v1.terminal) options).
const pythonDir = "python"

// TestPythonMethodFactsMatchGo imports the Python client with the Python
// that runs its tests (Debian's, see scripts/deps-python.sh) and fails when
// its lists of retried and of read-only methods and the Go client's
// disagree, naming the methods only one of them lists: both are read from
// the same proto facts, by two runtimes that could read them differently.
// (A read-only method's cut attempt is a plain failure; any other's is of
// unknown outcome.)
func TestPythonMethodFactsMatchGo(t *testing.T) {
	for _, c := range []struct {
		python string
		goSet  map[string]bool
	}{
		{"RETRIED_METHODS", retried},
		{"READ_ONLY_METHODS", readOnly},
	} {
		py := pythonList(t, "sorted(snapcoord._retry."+c.python+")")
		var goList []string
		for method, ok := range c.goSet {
			if ok {
				goList = append(goList, method)
			}
		}
		slices.Sort(goList)
		if len(goList) == 0 {
			t.Fatalf("%s: the Go client lists no method: the proto's facts were not read", c.python)
		}
		if onlyGo, onlyPy := missing(goList, py), missing(py, goList); len(onlyGo)+len(onlyPy) > 0 {
			t.Errorf("%s: the Go and Python lists disagree:\n only in client/retry.go: %s\n only in %s: %s",
				c.python, strings.Join(onlyGo, ", "), pythonDir, strings.Join(onlyPy, ", "))
		}
	}
}

// TestPythonTerminalStatesMatchGo fails when the Python client's
// RunState.terminal and apifacts.Terminal disagree: both read the
// (snapcoord.v1.terminal) option, and a client that took a terminal run for
// a live one would poll it forever.
func TestPythonTerminalStatesMatchGo(t *testing.T) {
	py := pythonList(t, "[s.name for s in snapcoord.types.RunState if s.terminal]")
	var goList []string
	for n := range v1.RunState_name {
		if s := v1.RunState(n); apifacts.Terminal(s) {
			goList = append(goList, apifacts.EnumName(s))
		}
	}
	slices.Sort(py)
	slices.Sort(goList)
	if len(goList) == 0 || !slices.Equal(py, goList) {
		t.Errorf("terminal run states: Go %v, Python %v; want the same, not empty", goList, py)
	}
}

// pythonList returns the list of strings the Python expression expr makes
// with the client imported as snapcoord. It skips the test where the Python client cannot be imported at all (no
// Debian Python packages: its own tests cannot run there either); make test
// checks for them first.
func pythonList(t *testing.T, expr string) []string {
	t.Helper()
	python := cmp.Or(os.Getenv("PYTHON"), "/usr/bin/python3")
	if err := exec.Command(python, "-c", "import grpc, google.protobuf").Run(); err != nil {
		t.Skipf("%s cannot import grpc and google.protobuf (%v): run scripts/deps-python.sh", python, err)
	}
	cmd := exec.Command(python, "-c", "import json, snapcoord, snapcoord._retry, snapcoord.types; print(json.dumps("+expr+"))")
	cmd.Dir = pythonDir
	cmd.Env = append(os.Environ(), "PYTHONPATH=.", "PYTHONDONTWRITEBYTECODE=1")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("importing the Python client: %v\n%s", err, stderrOf(err))
	}
	var list []string
	if err := json.Unmarshal(out, &list); err != nil {
		t.Fatalf("%s: %v in %q", expr, err, out)
	}
	return list
}

func stderrOf(err error) []byte {
	if ee := (*exec.ExitError)(nil); errors.As(err, &ee) {
		return ee.Stderr
	}
	return nil
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
