package main

import (
	"bytes"
	"context"
	"flag"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/snapcoord/snapcoord/internal/testkit/logsink"
	"github.com/snapcoord/snapcoord/server/coordinator"
)

func noEnv(string) (string, bool) { return "", false }

func envMap(m map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

func TestServeHelpListsFlagsWithEnv(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if code := runServe(t.Context(), []string{"--help"}, noEnv, &stdout, &stderr); code != exitOK {
		t.Fatalf("serve --help: exit %d, stderr %q", code, stderr.String())
	}
	for _, flag := range []string{"listen", "data-dir", "heartbeat-interval", "lease-ttl", "drain-timeout", "lock-timeout", "log-format", "log-level"} {
		if !strings.Contains(stdout.String(), "--"+flag) || !strings.Contains(stdout.String(), envName(flag)) {
			t.Errorf("help lacks --%s or %s:\n%s", flag, envName(flag), stdout.String())
		}
	}
	if m := oneDashFlag.FindString(stdout.String()); m != "" {
		t.Errorf("help shows a flag with one dash (%q), where docs/operations.md writes two:\n%s", m, stdout.String())
	}
}

// oneDashFlag finds "-lease-ttl" (as Go's flag package prints it) but not
// "--lease-ttl" or "non-loopback".
var oneDashFlag = regexp.MustCompile(`(^|[\s(\[,'])-[a-z][a-z-]+`)

// Errors name flags as the help does.
func TestServeFlagErrorsUseTwoDashes(t *testing.T) {
	for _, args := range [][]string{{"--lease-ttl", "soon"}, {"-lease-ttl=soon"}, {"--nope"}, {"--listen"}} {
		var stdout, stderr bytes.Buffer
		if code := runServe(t.Context(), args, noEnv, &stdout, &stderr); code != exitUsage {
			t.Errorf("serve %q: exit %d, want %d", args, code, exitUsage)
		}
		first, _, _ := strings.Cut(stderr.String(), "\n")
		if !strings.Contains(first, " --") || oneDashFlag.MatchString(first) {
			t.Errorf("serve %q: error %q, want the flag named with two dashes", args, first)
		}
	}
}

func TestEnvSetsDefaultsAndFlagsWin(t *testing.T) {
	env := envMap(map[string]string{
		"SNAPCOORD_LISTEN":    "127.0.0.1:9999",
		"SNAPCOORD_LEASE_TTL": "42s",
		"SNAPCOORD_LOG_LEVEL": "debug",
	})
	cfg, _, err := parseServe([]string{"--listen", "127.0.0.1:1234"}, env)
	if err != nil {
		t.Fatalf("parseServe: %v", err)
	}
	if cfg.Listen != "127.0.0.1:1234" {
		t.Errorf("listen = %q, want the flag's value over the environment's", cfg.Listen)
	}
	if cfg.LeaseTTL != 42*time.Second || cfg.logLevel.String() != "DEBUG" {
		t.Errorf("lease TTL %v, log level %v; want 42s and DEBUG from the environment", cfg.LeaseTTL, cfg.logLevel)
	}
	if cfg.DataDir != "./data" || cfg.HeartbeatInterval != 5*time.Second || cfg.DrainTimeout != 10*time.Second {
		t.Errorf("defaults = %+v", cfg)
	}
}

func TestEtcdFlags(t *testing.T) {
	env := envMap(map[string]string{
		"SNAPCOORD_STORE":          "etcd",
		"SNAPCOORD_ETCD_ENDPOINTS": "10.0.0.1:2379,http://10.0.0.2:2379",
		"SNAPCOORD_ETCD_CA_FILE":   "ca.pem",
		"SNAPCOORD_ADVERTISE_HTTP": "https://coord-1.example/snapcoord",
	})
	cfg, _, err := parseServe([]string{"--listen", "0.0.0.0:7070", "--advertise-addr", "coord-1:7070", "--election-ttl", "3s", "--etcd-prefix", "/team-a"}, env)
	if err != nil {
		t.Fatalf("parseServe: %v", err)
	}
	want := coordinator.EtcdConfig{Endpoints: []string{"10.0.0.1:2379", "http://10.0.0.2:2379"}, Prefix: "/team-a", CAFile: "ca.pem"}
	if cfg.Store != coordinator.StoreEtcd || !reflect.DeepEqual(cfg.Etcd, want) || cfg.AdvertiseAddr != "coord-1:7070" || cfg.ElectionTTL != 3*time.Second {
		t.Errorf("store %q, etcd %+v, advertise %q, TTL %v", cfg.Store, cfg.Etcd, cfg.AdvertiseAddr, cfg.ElectionTTL)
	}
	if cfg.AdvertiseHTTP != "https://coord-1.example/snapcoord" {
		t.Errorf("advertised status page %q, want SNAPCOORD_ADVERTISE_HTTP's", cfg.AdvertiseHTTP)
	}
	def, _, err := parseServe(nil, noEnv)
	if err != nil || def.Store != coordinator.StoreBbolt || def.Etcd.Prefix != "/snapcoord" || def.ElectionTTL != 5*time.Second {
		t.Errorf("defaults: store %q, prefix %q, TTL %v, err %v; want bbolt, /snapcoord, 5s", def.Store, def.Etcd.Prefix, def.ElectionTTL, err)
	}
}

func TestEtcdFlagErrors(t *testing.T) {
	etcd := []string{"--store", "etcd", "--etcd-endpoints", "127.0.0.1:2379"}
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"unknown store", []string{"--store", "postgres"}, "--store (SNAPCOORD_STORE) must be bbolt or etcd"},
		{"endpoints without --store etcd", []string{"--etcd-endpoints", "127.0.0.1:2379"}, "add --store etcd"},
		{"no endpoints", []string{"--store", "etcd"}, "needs --etcd-endpoints (SNAPCOORD_ETCD_ENDPOINTS)"},
		{"endpoint without port", []string{"--store", "etcd", "--etcd-endpoints", "a:2379,b"}, `--etcd-endpoints (SNAPCOORD_ETCD_ENDPOINTS): "b"`},
		{"relative prefix", append(etcd, "--etcd-prefix", "snapcoord"), "--etcd-prefix"},
		{"cert without key", append(etcd, "--etcd-cert-file", "c.pem"), "--etcd-cert-file and --etcd-key-file"},
		{"fractional TTL", append(etcd, "--election-ttl", "1.5s"), "--election-ttl"},
		{"zero TTL", append(etcd, "--election-ttl", "0"), "--election-ttl"},
		{"wildcard listen", append(etcd, "--listen", ":7070", "--insecure"), "needs --advertise-addr"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := runServe(t.Context(), tt.args, noEnv, &stdout, &stderr)
			if code != exitUsage || !strings.Contains(stderr.String(), tt.want) {
				t.Errorf("exit %d, stderr %q; want %d mentioning %s", code, stderr.String(), exitUsage, tt.want)
			}
		})
	}
}

// serve's durations read the grammar of snapctl's (cmd/internal/durations).
func TestServeDurationGrammar(t *testing.T) {
	env := envMap(map[string]string{"SNAPCOORD_DRAIN_TIMEOUT": "1:30"})
	cfg, _, err := parseServe([]string{"--lease-ttl", "00:00:01:00", "--finished-run-retention", "30-00"}, env)
	if err != nil {
		t.Fatalf("parseServe: %v", err)
	}
	if cfg.LeaseTTL != time.Minute || cfg.DrainTimeout != 90*time.Second || cfg.FinishedRunRetention != 30*24*time.Hour {
		t.Errorf("lease TTL %v, drain timeout %v, retention %v; want 1m, 1m30s, 720h", cfg.LeaseTTL, cfg.DrainTimeout, cfg.FinishedRunRetention)
	}
	// The form docs/operations.md promises for every duration, DD:HH:MM:SS
	// included, for the one flag that was a Go-only flag.Duration.
	for _, v := range []string{"00:00:00:30", "0:30", "30s"} {
		cfg, _, err := parseServe([]string{"--credentials-check-interval", v}, noEnv)
		if err != nil || cfg.CredentialsCheckInterval != 30*time.Second {
			t.Errorf("--credentials-check-interval %s: %v, %v; want 30s", v, cfg.CredentialsCheckInterval, err)
		}
	}
	if _, _, err := parseServe([]string{"--lease-ttl", "15"}, noEnv); err == nil || !strings.Contains(err.Error(), "--lease-ttl") ||
		!strings.Contains(err.Error(), "write 15s or 15m") {
		t.Errorf("--lease-ttl 15: %v, want the flag named and the ambiguity explained", err)
	}
}

// Every duration flag of serve reads the common grammar, none the flag
// package's Go-only one.
func TestEveryServeDurationFlagTakesTheGrammar(t *testing.T) {
	var cfg serveConfig
	newServeFlags(&cfg).VisitAll(func(f *flag.Flag) {
		if g, ok := f.Value.(flag.Getter); ok {
			if _, goOnly := g.Get().(time.Duration); goOnly {
				t.Errorf("--%s is a flag.Duration: it refuses 00:00:00:30 and 1-00:00:00", f.Name)
			}
		}
	})
}

// A usage error is one line that says where the help is, not the usage:
// 90 lines that push the error off the screen.
func TestServeUsageErrorIsOneLine(t *testing.T) {
	for _, args := range [][]string{{"--nope"}, {"--lease-ttl", "soon"}, {"--log-format", "xml"}, {"now"}} {
		var stdout, stderr bytes.Buffer
		if code := runServe(t.Context(), args, noEnv, &stdout, &stderr); code != exitUsage {
			t.Errorf("serve %q: exit %d, want %d", args, code, exitUsage)
		}
		if n := strings.Count(stderr.String(), "\n"); n != 1 || !strings.HasSuffix(stderr.String(), "; see 'snapcoord serve --help'\n") {
			t.Errorf("serve %q: stderr has %d lines: %q; want one, ending \"see 'snapcoord serve --help'\"", args, n, stderr.String())
		}
	}
}

func TestServeUsageErrors(t *testing.T) {
	tests := []struct {
		name string
		args []string
		env  map[string]string
		want string // in stderr
	}{
		{"bad env duration", nil, map[string]string{"SNAPCOORD_LEASE_TTL": "soon"}, "SNAPCOORD_LEASE_TTL"},
		{"bad log format", []string{"--log-format", "xml"}, nil, "--log-format"},
		{"bad log level", []string{"--log-level", "loud"}, nil, "log-level"},
		{"bad log calls", []string{"--log-calls", "some"}, nil, "--log-calls (SNAPCOORD_LOG_CALLS) must be slow or all"},
		{"negative slow call", []string{"--slow-call", "-1s"}, nil, "--slow-call"},
		{"lease shorter than heartbeat", []string{"--heartbeat-interval", "10s", "--lease-ttl", "5s"}, nil, "--lease-ttl"},
		{"unknown flag", []string{"--nope"}, nil, "nope"},
		{"stray argument", []string{"now"}, nil, `"now"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := runServe(t.Context(), tt.args, envMap(tt.env), &stdout, &stderr)
			if code != exitUsage || !strings.Contains(stderr.String(), tt.want) {
				t.Errorf("exit %d, stderr %q; want %d mentioning %s", code, stderr.String(), exitUsage, tt.want)
			}
		})
	}
}

func TestCommands(t *testing.T) {
	tests := []struct {
		args     []string
		code     int
		inStdout string
	}{
		{[]string{"version"}, exitOK, "snapcoord "},
		{[]string{"--version"}, exitOK, " (commit "},
		{[]string{"-version"}, exitOK, " (commit "},
		{[]string{"--help"}, exitOK, "--version"},
		{[]string{"help"}, exitOK, "serve"},
		{nil, exitUsage, ""},
		{[]string{"frobnicate"}, exitUsage, ""},
	}
	for _, tt := range tests {
		var stdout, stderr bytes.Buffer
		code := run(t.Context(), tt.args, &stdout, &stderr)
		if code != tt.code || !strings.Contains(stdout.String(), tt.inStdout) {
			t.Errorf("run(%q) = %d, stdout %q; want %d with %q", tt.args, code, stdout.String(), tt.code, tt.inStdout)
		}
	}
}

// serve in-process, so the race detector sees its shutdown path; cancelling
// ctx stands in for the signal.
func TestServeInProcessStopsOnCancel(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	logs := logsink.NewWatcher()
	args := []string{"--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0", "--data-dir", t.TempDir(), "--log-format", "json"}
	done := make(chan int, 1)
	go func() { done <- runServe(ctx, args, noEnv, logs, logs) }()

	var addr string
	select {
	case addr = <-logs.Serving():
	case code := <-done:
		t.Fatalf("serve exited %d before serving:\n%s", code, logs)
	}
	resp, err := healthpb.NewHealthClient(dial(t, addr)).Check(t.Context(), &healthpb.HealthCheckRequest{})
	if err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("Check = %v, %v; want SERVING", resp.GetStatus(), err)
	}
	cancel()
	if code := <-done; code != exitOK {
		t.Errorf("serve exit %d after cancel, want 0:\n%s", code, logs)
	}
}
