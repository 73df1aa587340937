package main

import (
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
)

// The README's way of moving `make run` is what the Makefile does: the
// variables it names become serve's flags, and unset they add none (so
// serve's defaults and SNAPCOORD_* variables still apply). The README's
// two set-up commands stay as they are.
func TestMakeRunMovesAsTheReadmeSays(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, block := range []string{"```\nmake run\n```\n", "```\nmake test\n```\n"} {
		if !strings.Contains(string(readme), block) {
			t.Errorf("README.md lost its set-up command %q", block)
		}
	}
	m := regexp.MustCompile("`make run ((?:[A-Z_]+=\\S+ ?)+)`").FindStringSubmatch(string(readme))
	if m == nil {
		t.Fatal("README.md does not say how to move make run's ports (`make run LISTEN=... METRICS_LISTEN=...`)")
	}
	vars := strings.Fields(m[1])
	want := map[string]string{"LISTEN": "--listen", "METRICS_LISTEN": "--metrics-listen", "DATA_DIR": "--data-dir"}
	serve := makeRunServeLine(t, vars...)
	for _, v := range vars {
		name, value, _ := strings.Cut(v, "=")
		if flag := want[name]; flag == "" || !strings.Contains(serve, flag+" '"+value+"'") {
			t.Errorf("make run %s: serve runs as %q, want %s '%s'", v, serve, want[name], value)
		}
	}
	for _, port := range []string{"LISTEN", "METRICS_LISTEN"} {
		if !strings.Contains(m[1], port+"=") {
			t.Errorf("README.md's make run line %q does not move %s", m[0], port)
		}
	}
	if plain := makeRunServeLine(t); plain != "./bin/snapcoord serve" {
		t.Errorf("make run with no variables runs %q, want ./bin/snapcoord serve alone", plain)
	}
}

// makeRunServeLine is the serve command `make -n run` would run.
func makeRunServeLine(t *testing.T, vars ...string) string {
	t.Helper()
	if _, err := exec.LookPath("make"); err != nil {
		t.Skip("no make on PATH")
	}
	cmd := exec.Command("make", append([]string{"-n", "-C", "../..", "run"}, vars...)...)
	cmd.Env = append(os.Environ(), "LISTEN=", "METRICS_LISTEN=", "DATA_DIR=")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("make -n run %v: %v\n%s", vars, err, out)
	}
	for line := range strings.Lines(string(out)) {
		if strings.HasPrefix(line, "./bin/snapcoord serve") {
			return strings.TrimSpace(line)
		}
	}
	t.Fatalf("make -n run %v runs no ./bin/snapcoord serve:\n%s", vars, out)
	return ""
}
