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
)

// pythonDir is the Python client, whose RETRIED_METHODS must be the Go
// client's retried list: the two clients of one coordinator repeat the same
// calls, both reading them from the API's (snapcoord.v1.rpc) options.
const pythonDir = "python"

// TestPythonRetryListMatchesGo imports the Python client with the Python
// that runs its tests (Debian's, see scripts/deps-python.sh) and fails when
// its RETRIED_METHODS and the retried map disagree, naming the methods only
// one of them lists: both are read from the same proto facts, by two
// runtimes that could read them differently.
func TestPythonRetryListMatchesGo(t *testing.T) {
	py := pythonRetryList(t)
	var goList []string
	for method, ok := range retried {
		if ok {
			goList = append(goList, method)
		}
	}
	slices.Sort(goList)
	if len(goList) == 0 {
		t.Fatal("the Go client retries no method: the proto's retry_safe facts were not read")
	}
	if onlyGo, onlyPy := missing(goList, py), missing(py, goList); len(onlyGo)+len(onlyPy) > 0 {
		t.Errorf("the Go and Python retry lists disagree:\n only in client/retry.go: %s\n only in %s: %s",
			strings.Join(onlyGo, ", "), pythonDir, strings.Join(onlyPy, ", "))
	}
}

// pythonRetryList returns the Python client's RETRIED_METHODS, sorted. It
// skips the test where the Python client cannot be imported at all (no
// Debian Python packages: its own tests cannot run there either); make test
// checks for them first.
func pythonRetryList(t *testing.T) []string {
	t.Helper()
	python := cmp.Or(os.Getenv("PYTHON"), "/usr/bin/python3")
	if err := exec.Command(python, "-c", "import grpc, google.protobuf").Run(); err != nil {
		t.Skipf("%s cannot import grpc and google.protobuf (%v): run scripts/deps-python.sh", python, err)
	}
	cmd := exec.Command(python, "-c", "import json, snapcoord; print(json.dumps(sorted(snapcoord.RETRIED_METHODS)))")
	cmd.Dir = pythonDir
	cmd.Env = append(os.Environ(), "PYTHONPATH=.", "PYTHONDONTWRITEBYTECODE=1")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("importing the Python client: %v\n%s", err, stderrOf(err))
	}
	var list []string
	if err := json.Unmarshal(out, &list); err != nil {
		t.Fatalf("the Python client's RETRIED_METHODS: %v in %q", err, out)
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
