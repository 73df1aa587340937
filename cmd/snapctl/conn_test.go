package main

import (
	"crypto/x509"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/snapcoord/snapcoord/client"
	"github.com/snapcoord/snapcoord/internal/testkit/testpki"
)

// A flag beats its variable, and so also the variable of the flag it
// excludes: a user with SNAPCOORD_TOKEN_FILE in their profile can still
// pass --token. Each variable below holds a wrong value, so a success shows
// the flag was used.
func TestTokenFlagBeatsTheOtherVariable(t *testing.T) {
	s := startServer(t)
	s.createRun("r1", "--world-size", "1")
	good := writeFile(t, "admin.token", adminToken+"\n")
	wrong := writeFile(t, "wrong.token", "wrong-admin-token\n")
	for _, tc := range []struct {
		name string
		env  []string
		args []string
	}{
		{"--token-file over SNAPCOORD_TOKEN", []string{"SNAPCOORD_TOKEN=wrong-admin-token"}, []string{"run", "get", "r1", "--token-file", good}},
		{"--token over SNAPCOORD_TOKEN_FILE", []string{"SNAPCOORD_TOKEN=", "SNAPCOORD_TOKEN_FILE=" + wrong}, []string{"run", "get", "r1", "--token", adminToken}},
		{"--token before the command", []string{"SNAPCOORD_TOKEN=", "SNAPCOORD_TOKEN_FILE=" + wrong}, []string{"--token", adminToken, "run", "get", "r1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if r := s.snapctlEnv(tc.env, tc.args...); r.code != 0 {
				t.Errorf("snapctl %v with %v: exit %d: %s", tc.args, tc.env, r.code, r.stderr)
			}
		})
	}
}

// Two flags, or two variables, that exclude each other are still refused:
// nothing says which one the user meant.
func TestTokenFlagsOfOneSourceClash(t *testing.T) {
	s := startServer(t)
	s.createRun("r1", "--world-size", "1")
	file := writeFile(t, "admin.token", adminToken+"\n")
	r := s.snapctl("run", "get", "r1", "--token", adminToken, "--token-file", file)
	if r.code != exitUsage || !strings.Contains(r.stderr, "give --token or --token-file, not both") {
		t.Errorf("--token and --token-file: exit %d, want %d: %s", r.code, exitUsage, r.stderr)
	}
	r = s.snapctlEnv([]string{"SNAPCOORD_TOKEN_FILE=" + file}, "run", "get", "r1") // s.env sets SNAPCOORD_TOKEN
	if r.code != exitUsage || !strings.Contains(r.stderr, "SNAPCOORD_TOKEN_FILE and SNAPCOORD_TOKEN") {
		t.Errorf("SNAPCOORD_TOKEN and SNAPCOORD_TOKEN_FILE: exit %d, want %d naming both: %s", r.code, exitUsage, r.stderr)
	}
}

// --plaintext against TLS variables and a TLS flag against
// SNAPCOORD_PLAINTEXT: the flag decides.
func TestTransportFlagBeatsTheOtherVariable(t *testing.T) {
	plain := startServer(t)
	missing := filepath.Join(t.TempDir(), "missing-ca.pem") // read only if TLS were used
	if r := plain.snapctlEnv([]string{"SNAPCOORD_PLAINTEXT=", "SNAPCOORD_CA_FILE=" + missing}, "--plaintext", "run", "list"); r.code != 0 {
		t.Errorf("--plaintext with SNAPCOORD_CA_FILE: exit %d: %s", r.code, r.stderr)
	}

	dir := t.TempDir()
	ca := testpki.NewCA(t, dir, "ca")
	cert := ca.Issue(t, dir, "server", x509.ExtKeyUsageServerAuth)
	tls := startTLSServer(t, ca, cert)
	// tls.env sets SNAPCOORD_PLAINTEXT=1, as a user who exported it would.
	if r := tls.snapctl("run", "list", "--ca-file", ca.File); r.code != 0 {
		t.Errorf("--ca-file with SNAPCOORD_PLAINTEXT=1: exit %d: %s", r.code, r.stderr)
	}
	if r := tls.snapctl("run", "list", "--ca-file", ca.File, "--plaintext"); r.code != exitUsage {
		t.Errorf("--ca-file and --plaintext: exit %d, want %d: %s", r.code, exitUsage, r.stderr)
	}
}

// --token-file takes a file written like the coordinator's
// --admin-token-file, comments and blank lines included, as long as it
// holds one token: a client sends one.
func TestTokenFileInAdminTokenFormat(t *testing.T) {
	s := startServer(t)
	s.createRun("r1", "--world-size", "1")
	noToken := []string{"SNAPCOORD_TOKEN="}
	one := writeFile(t, "one", "# ops team, rotated 2026-11\n\n  "+adminToken+"  \n")
	if r := s.snapctlEnv(noToken, "run", "get", "r1", "--token-file", one); r.code != 0 {
		t.Errorf("--token-file with a comment and a blank line: exit %d: %s", r.code, r.stderr)
	}
	two := writeFile(t, "two", "# old\n"+adminToken+"\n# new\nnew-admin-token-xyz\n")
	r := s.snapctlEnv(noToken, "run", "get", "r1", "--token-file", two)
	if r.code != exitInvalid || !strings.Contains(r.stderr, "a client token file holds one") || strings.Contains(r.stderr, adminToken) {
		t.Errorf("--token-file with two tokens: exit %d, want %d saying it holds one, quoting no token: %s", r.code, exitInvalid, r.stderr)
	}
}

// The sidecar's --run-token-file beats SNAPCOORD_RUN_TOKEN, which
// eval "$(snapctl run create ...)" exports; and reads the same format.
func TestSidecarRunTokenFileBeatsTheVariable(t *testing.T) {
	s := startServer(t)
	tok := s.turnRun("r1")
	file := writeFile(t, "run.token", "# run r1\n"+tok+"\n")
	// s.sidecar exports its token argument as SNAPCOORD_RUN_TOKEN, and
	// returns once the worker registered.
	s.sidecar("r1", "wrong-run-token", "--run-token-file", file, "--on-snapshot", "true")
}

// client.ReadTokenFile, behind --token-file and --run-token-file, takes the
// coordinator's --admin-token-file format (blank lines, # comments,
// surrounding spaces) but only one token: a client sends one, and picking
// the first of several would hide a mistake. Its errors never quote a token.
func TestReadTokenFile(t *testing.T) {
	for _, tc := range []struct {
		name, content, want, wantErr string
	}{
		{"bare", "s3cr3t-1", "s3cr3t-1", ""},
		{"trailing newline", "s3cr3t-1\n", "s3cr3t-1", ""},
		{"admin token file format", "# ops\r\n\n  s3cr3t-1  \n# rotated 2026-11\n", "s3cr3t-1", ""},
		{"several tokens", "s3cr3t-1\n# next\ns3cr3t-2\n", "", "holds 2 tokens: a client token file holds one"},
		{"no token", "# nothing yet\n\n", "", "holds no token"},
		{"empty", "", "", "holds no token"},
		{"space inside", "s3cr3t 1\n", "", "printable ASCII without spaces"},
		{"control character", "s3cr3t\x011\n", "", "printable ASCII without spaces"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "token")
			if err := os.WriteFile(path, []byte(tc.content), 0o600); err != nil {
				t.Fatal(err)
			}
			got, err := client.ReadTokenFile(path)
			switch {
			case tc.wantErr == "" && (err != nil || got != tc.want):
				t.Errorf("ReadTokenFile(%q) = %q, %v; want %q", tc.content, got, err, tc.want)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr) || strings.Contains(err.Error(), "s3cr3t")):
				t.Errorf("ReadTokenFile(%q) = %q, %v; want an error saying %q, quoting no token", tc.content, got, err, tc.wantErr)
			}
		})
	}
}
