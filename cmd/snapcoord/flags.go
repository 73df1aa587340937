package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/url"
	"strings"
	"time"

	"github.com/snapcoord/snapcoord/cmd/internal/durations"
	"github.com/snapcoord/snapcoord/cmd/internal/flagtext"
	"github.com/snapcoord/snapcoord/internal/loopback"
	"github.com/snapcoord/snapcoord/server/coordinator"
)

// envPrefix names the environment variable behind every flag: --lease-ttl
// is SNAPCOORD_LEASE_TTL. Launchers (Slurm scripts, systemd units) set the
// environment more easily than they rewrite command lines.
const envPrefix = "SNAPCOORD_"

// serveConfig is what `snapcoord serve` was asked to do: the
// coordinator's configuration and how to log.
type serveConfig struct {
	coordinator.Config
	logFormat string
	logLevel  slog.Level
	// The flag package has no uint32 flags; these are checked and copied
	// into Config by parseServe.
	maxHeaderListSize    uint
	maxConcurrentStreams uint
	// etcdEndpoints is --etcd-endpoints, split into Config by parseServe.
	etcdEndpoints string
	// tlsSelfSigned is --tls-self-signed: a directory where runServe makes
	// the CA and certificate that then fill TLSCert and TLSKey.
	tlsSelfSigned string
}

// adminTokenEnv holds one admin token. It is a variable, not a flag, so the
// secret never shows in the process list.
const adminTokenEnv = envPrefix + "ADMIN_TOKEN"

// newServeFlags binds the flags to cfg; their defaults are
// coordinator.Defaults().
func newServeFlags(cfg *serveConfig) *flag.FlagSet {
	def := coordinator.Defaults()
	c := &cfg.Config
	fs := flag.NewFlagSet("snapcoord serve", flag.ContinueOnError)
	fs.StringVar(&c.Listen, "listen", def.Listen, "gRPC `address` to listen on")
	fs.StringVar(&c.DataDir, "data-dir", def.DataDir, "`directory` holding the store file "+coordinator.StoreFile+" (created 0700 if missing); for --store bbolt")
	fs.StringVar((*string)(&c.Store), "store", string(def.Store), "where state is kept: bbolt (a file in --data-dir) or etcd (an etcd cluster shared by coordinators that elect a leader)")
	fs.StringVar(&cfg.etcdEndpoints, "etcd-endpoints", strings.Join(def.Etcd.Endpoints, ","), "etcd members for --store etcd, comma-separated `host:port` list")
	fs.StringVar(&c.Etcd.Prefix, "etcd-prefix", def.Etcd.Prefix, "etcd key `prefix` of this group of coordinators: their state and their election (<prefix>/leader)")
	fs.StringVar(&c.Etcd.CAFile, "etcd-ca-file", def.Etcd.CAFile, "PEM CA `file` to verify etcd's certificate: connects to etcd with TLS")
	fs.StringVar(&c.Etcd.CertFile, "etcd-cert-file", def.Etcd.CertFile, "PEM client certificate `file` for etcd (mutual TLS; with --etcd-key-file)")
	fs.StringVar(&c.Etcd.KeyFile, "etcd-key-file", def.Etcd.KeyFile, "PEM client private key `file` for etcd (with --etcd-cert-file)")
	fs.StringVar(&c.AdvertiseAddr, "advertise-addr", def.AdvertiseAddr, "`address` clients reach this coordinator at, which followers name as the leader's; default --listen (required when --listen is a wildcard)")
	fs.StringVar(&c.AdvertiseHTTP, "advertise-http", def.AdvertiseHTTP, "`URL` (or host:port) people reach this coordinator's status page at, to which the other coordinators' pages redirect while it leads; default http:// and --metrics-listen unless that is a wildcard")
	durations.Var(fs, &c.ElectionTTL, "election-ttl", def.ElectionTTL, durations.Options{WholeSeconds: true}, "lease of the leader election for --store etcd: a leader that stops renewing it is replaced this long after")
	durations.Var(fs, &c.HeartbeatInterval, "heartbeat-interval", def.HeartbeatInterval, durations.Options{}, "how often workers are told to heartbeat")
	durations.Var(fs, &c.LeaseTTL, "lease-ttl", def.LeaseTTL, durations.Options{}, "a worker silent this long is LOST")
	durations.Var(fs, &c.DrainTimeout, "drain-timeout", def.DrainTimeout, durations.Options{}, "on SIGINT/SIGTERM, how long in-flight RPCs may take to finish")
	durations.Var(fs, &c.LockTimeout, "lock-timeout", def.LockTimeout, durations.Options{}, "how long to wait for another process to release the data directory")
	fs.StringVar(&cfg.logFormat, "log-format", "text", "log `format`: text or json")
	fs.TextVar(&cfg.logLevel, "log-level", slog.LevelInfo, "log `level`: debug, info, warn or error")
	fs.StringVar((*string)(&c.LogCalls), "log-calls", string(def.LogCalls), "which successful calls of the fleet (steps, reports, heartbeats, polls) get an info line: slow (those slower than --slow-call) or all; other calls and failures always do, and --log-level debug shows every call")
	durations.Var(fs, &c.SlowCall, "slow-call", def.SlowCall, durations.Options{}, "a successful call of the fleet taking this long is logged at info (0: never)")

	fs.StringVar(&c.AdminTokenFile, "admin-token-file", def.AdminTokenFile, "`file` of admin tokens for RunService, one per line (several for rotation); with none here or in "+adminTokenEnv+", RunService is open")
	fs.StringVar(&c.ViewerTokenFile, "viewer-token-file", def.ViewerTokenFile, "`file` of viewer tokens, one per line: read-only access to the status page (HTTP basic auth, the token as password); refused by the gRPC API")
	fs.BoolVar(&c.Insecure, "insecure", def.Insecure, "allow listening on a non-loopback address with no admin token (RunService open to anyone who can connect), or --pprof on a non-loopback --metrics-listen")
	fs.StringVar(&c.TLSCert, "tls-cert", def.TLSCert, "PEM certificate `file` for TLS (with --tls-key)")
	fs.StringVar(&c.TLSKey, "tls-key", def.TLSKey, "PEM private key `file` for TLS (with --tls-cert)")
	fs.StringVar(&cfg.tlsSelfSigned, "tls-self-signed", "", "`directory` (the job's, on storage every client's node sees) where the coordinator makes a CA (reused while valid) and a certificate for this host's --listen address and names, keys 0600, and serves TLS with it; clients trust DIR/"+selfSignedCA+" (SNAPCOORD_CA_FILE). Excludes --tls-cert and --tls-key")
	fs.StringVar(&c.ClientCA, "client-ca", def.ClientCA, "PEM CA `file`: require client certificates signed by it (mutual TLS; needs --tls-cert)")
	durations.Var(fs, &c.CredentialsCheckInterval, "credentials-check-interval", def.CredentialsCheckInterval, durations.Options{}, "how often --admin-token-file, --viewer-token-file, --tls-cert, --tls-key and --client-ca are checked for changes and reloaded (0: only on SIGHUP, which always reloads them)")
	fs.StringVar((*string)(&c.Reflection), "reflection", string(def.Reflection), "server reflection: open, auth (admin token), off, or auto (open on a loopback --listen, auth otherwise)")

	fs.StringVar(&c.MetricsListen, "metrics-listen", def.MetricsListen, "HTTP `address` serving Prometheus /metrics (and /debug/pprof/ with --pprof); empty disables it")
	fs.BoolVar(&c.Pprof, "pprof", def.Pprof, "serve /debug/pprof/ on --metrics-listen")

	fs.IntVar(&c.MaxRecvMsgSize, "max-recv-msg-size", def.MaxRecvMsgSize, "largest request message accepted, in `bytes`; larger ones get RESOURCE_EXHAUSTED")
	fs.UintVar(&cfg.maxHeaderListSize, "max-header-list-size", uint(def.MaxHeaderListSize), "largest metadata (HTTP/2 header list, uncompressed) one call may carry, in `bytes`; a call with more is refused")
	fs.UintVar(&cfg.maxConcurrentStreams, "max-concurrent-streams", uint(def.MaxConcurrentStreams), "RPCs open at once on one client connection")
	fs.IntVar(&c.MaxRuns, "max-runs", def.MaxRuns, "runs the coordinator keeps; CreateRun beyond it gets RESOURCE_EXHAUSTED")
	fs.IntVar(&c.MaxWorkersPerRun, "max-workers-per-run", def.MaxWorkersPerRun, "workers one run may register; more get RESOURCE_EXHAUSTED")
	fs.IntVar(&c.MaxEventsPerRun, "max-events-per-run", def.MaxEventsPerRun, "events kept per run, on disk (the latest 256 also in memory); the oldest are deleted beyond it")
	durations.Var(fs, &c.FinishedRunRetention, "finished-run-retention", def.FinishedRunRetention, durations.Options{}, "delete a finished run (and all stored for it) this long after it ended, e.g. 720h; 0 keeps finished runs")
	durations.Var(fs, &c.RunMetricsRetention, "run-metrics-retention", def.RunMetricsRetention, durations.Options{}, "keep an ended run's snapcoord_run_* series on /metrics this long after it ended; 0 drops them when it ends")
	durations.Var(fs, &c.KeepaliveMinTime, "keepalive-min-time", def.KeepaliveMinTime, durations.Options{}, "shortest client keepalive ping interval tolerated; clients pinging more often are disconnected")
	fs.BoolVar(&c.PermitPingsWithoutStream, "keepalive-permit-without-stream", def.PermitPingsWithoutStream, "tolerate client keepalive pings on connections with no open RPC")
	durations.Var(fs, &c.KeepaliveTime, "keepalive-time", def.KeepaliveTime, durations.Options{}, "ping a client connection silent this long, to notice dead workers")
	durations.Var(fs, &c.KeepaliveTimeout, "keepalive-timeout", def.KeepaliveTimeout, durations.Options{}, "close a connection whose ping is not answered within this")
	durations.Var(fs, &c.MaxConnectionIdle, "max-connection-idle", def.MaxConnectionIdle, durations.Options{}, "close connections with no RPC for this long; 0 never does")
	return fs
}

// envName is the environment variable that sets a flag's default.
func envName(flagName string) string {
	return envPrefix + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// applyEnv names each flag's variable in its help text and applies the
// variables that are set. It runs before Parse, so a flag beats its variable.
func applyEnv(fs *flag.FlagSet, lookupEnv func(string) (string, bool)) error {
	var errs []error
	fs.VisitAll(func(f *flag.Flag) {
		name := envName(f.Name)
		f.Usage += " (env " + name + ")"
		if v, ok := lookupEnv(name); ok {
			if err := fs.Set(f.Name, v); err != nil {
				errs = append(errs, fmt.Errorf("%s=%q: %w", name, v, err))
			}
		}
	})
	return errors.Join(errs...)
}

// parseServe reads the configuration from the environment and args. The
// error is flag.ErrHelp for --help, otherwise a usage error.
func parseServe(args []string, lookupEnv func(string) (string, bool)) (serveConfig, *flag.FlagSet, error) {
	var cfg serveConfig
	fs := newServeFlags(&cfg)
	// Parse's own messages are dropped: runServe prints one error and the
	// usage to the stream that fits (stdout for --help, stderr otherwise).
	fs.SetOutput(io.Discard)
	if err := applyEnv(fs, lookupEnv); err != nil {
		return cfg, fs, err
	}
	if err := fs.Parse(args); err != nil {
		return cfg, fs, flagtext.Error(err)
	}
	if fs.NArg() > 0 {
		return cfg, fs, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	if cfg.etcdEndpoints != "" {
		cfg.Etcd.Endpoints = strings.Split(cfg.etcdEndpoints, ",")
	}
	if err := cfg.validate(); err != nil {
		return cfg, fs, err
	}
	if err := cfg.validateStore(); err != nil {
		return cfg, fs, err
	}
	cfg.MaxHeaderListSize, cfg.MaxConcurrentStreams = uint32(cfg.maxHeaderListSize), uint32(cfg.maxConcurrentStreams)
	return cfg, fs, nil
}

func (c serveConfig) validate() error {
	switch {
	case c.logFormat != "text" && c.logFormat != "json":
		return fmt.Errorf("--log-format (%s) must be text or json, not %q", envName("log-format"), c.logFormat)
	case c.HeartbeatInterval <= 0, c.LeaseTTL <= 0, c.DrainTimeout <= 0, c.LockTimeout <= 0:
		return errors.New("--heartbeat-interval, --lease-ttl, --drain-timeout and --lock-timeout must be positive durations")
	case c.LeaseTTL <= c.HeartbeatInterval:
		// A lease no longer than one heartbeat interval would lapse between
		// two punctual heartbeats.
		return fmt.Errorf("--lease-ttl (%s) must be longer than --heartbeat-interval (%s)", c.LeaseTTL, c.HeartbeatInterval)
	case (c.TLSCert == "") != (c.TLSKey == ""):
		return errors.New("--tls-cert and --tls-key must be given together")
	case c.tlsSelfSigned != "" && c.TLSCert != "":
		return fmt.Errorf("--tls-self-signed (%s) makes its own certificate: drop --tls-cert and --tls-key", envName("tls-self-signed"))
	case c.ClientCA != "" && c.TLSCert == "" && c.tlsSelfSigned == "":
		return errors.New("--client-ca (mutual TLS) needs --tls-cert and --tls-key")
	case c.Reflection != coordinator.ReflectionAuto && c.Reflection != coordinator.ReflectionOpen && c.Reflection != coordinator.ReflectionAuth && c.Reflection != coordinator.ReflectionOff:
		return fmt.Errorf("--reflection (%s) must be auto, open, auth or off, not %q", envName("reflection"), c.Reflection)
	case c.LogCalls != coordinator.LogCallsSlow && c.LogCalls != coordinator.LogCallsAll:
		return fmt.Errorf("--log-calls (%s) must be slow or all, not %q", envName("log-calls"), c.LogCalls)
	case c.SlowCall < 0:
		return fmt.Errorf("--slow-call (%s) must not be negative", envName("slow-call"))
	case c.Pprof && c.MetricsListen == "":
		return errors.New("--pprof needs --metrics-listen")
	case c.FinishedRunRetention < 0:
		return errors.New("--finished-run-retention must not be negative")
	case c.RunMetricsRetention < 0:
		return fmt.Errorf("--run-metrics-retention (%s) must not be negative", envName("run-metrics-retention"))
	case c.CredentialsCheckInterval < 0:
		return errors.New("--credentials-check-interval must not be negative")
	case c.MaxRecvMsgSize <= 0, c.MaxRuns <= 0, c.MaxWorkersPerRun <= 0, c.MaxEventsPerRun <= 0:
		return errors.New("--max-recv-msg-size, --max-runs, --max-workers-per-run and --max-events-per-run must be positive")
	case c.maxConcurrentStreams == 0 || c.maxConcurrentStreams > math.MaxUint32:
		return fmt.Errorf("--max-concurrent-streams must be between 1 and %d", uint32(math.MaxUint32))
	case c.maxHeaderListSize < 1024 || c.maxHeaderListSize > math.MaxUint32:
		// Below 1 KiB a token and the call's own headers no longer fit.
		return fmt.Errorf("--max-header-list-size must be between 1024 and %d", uint32(math.MaxUint32))
	case c.KeepaliveMinTime <= 0, c.KeepaliveTime <= 0, c.KeepaliveTimeout <= 0, c.MaxConnectionIdle < 0:
		return errors.New("--keepalive-min-time, --keepalive-time and --keepalive-timeout must be positive, --max-connection-idle not negative")
	}
	return nil
}

// validateStore checks --store and the flags that go with it.
func (c serveConfig) validateStore() error {
	switch c.Store {
	case coordinator.StoreBbolt:
		if c.DataDir == "" {
			return fmt.Errorf("--data-dir (%s) must not be empty", envName("data-dir"))
		}
		if len(c.Etcd.Endpoints) > 0 {
			// Meant for several coordinators, this one would run alone.
			return fmt.Errorf("--etcd-endpoints (%s) is set but --store (%s) is bbolt: add --store etcd, or drop the endpoints", envName("etcd-endpoints"), envName("store"))
		}
		return nil
	case coordinator.StoreEtcd:
	default:
		return fmt.Errorf("--store (%s) must be bbolt or etcd, not %q", envName("store"), c.Store)
	}
	for _, ep := range c.Etcd.Endpoints {
		if !validEndpoint(ep) {
			return fmt.Errorf("--etcd-endpoints (%s): %q is not host:port (or http(s)://host:port)", envName("etcd-endpoints"), ep)
		}
	}
	switch {
	case len(c.Etcd.Endpoints) == 0:
		return fmt.Errorf("--store etcd needs --etcd-endpoints (%s)", envName("etcd-endpoints"))
	case !strings.HasPrefix(c.Etcd.Prefix, "/") || strings.HasSuffix(c.Etcd.Prefix, "/"):
		return fmt.Errorf("--etcd-prefix (%s) must start with / and not end with one, not %q", envName("etcd-prefix"), c.Etcd.Prefix)
	case (c.Etcd.CertFile == "") != (c.Etcd.KeyFile == ""):
		return errors.New("--etcd-cert-file and --etcd-key-file must be given together")
	case c.ElectionTTL < time.Second:
		return fmt.Errorf("--election-ttl (%s) must be at least 1s", envName("election-ttl"))
	case c.AdvertiseAddr == "" && !coordinator.Reachable(c.Listen):
		return fmt.Errorf("--store etcd needs --advertise-addr (%s): --listen %s is no address a client can reach the leader at", envName("advertise-addr"), c.Listen)
	}
	return nil
}

// validEndpoint accepts what the etcd client dials: host:port, or a URL
// of that with scheme http or https.
func validEndpoint(ep string) bool {
	if u, err := url.Parse(ep); err == nil && (u.Scheme == "http" || u.Scheme == "https") {
		ep = u.Host
	}
	host, _, err := net.SplitHostPort(ep)
	return err == nil && host != ""
}

// checkExposure refuses to put an open RunService (no admin token) or
// pprof on a non-loopback address unless --insecure says that is meant.
func (c serveConfig) checkExposure(adminTokens int) error {
	if c.Insecure {
		return nil
	}
	if adminTokens == 0 && !loopback.Is(c.Listen) {
		return fmt.Errorf("refusing to listen on %s: no admin token is configured, so anyone who can reach that address "+
			"could create, change and cancel runs. Configure an admin token (--admin-token-file or %s), listen on a "+
			"loopback address (127.0.0.1, ::1, localhost), or pass --insecure to accept an open RunService", c.Listen, adminTokenEnv)
	}
	if c.Pprof && !loopback.Is(c.MetricsListen) {
		return fmt.Errorf("refusing to serve /debug/pprof/ on %s, a non-loopback address: profiles and the command line "+
			"would be open to anyone who can reach it. Use a loopback --metrics-listen or pass --insecure", c.MetricsListen)
	}
	return nil
}

func printServeUsage(w io.Writer, fs *flag.FlagSet) {
	fmt.Fprintf(w, "usage: snapcoord serve [flags]\n\nRuns the coordinator until SIGINT or SIGTERM.\n\nflags:\n")
	flagtext.PrintDefaults(w, fs, nil)
	fmt.Fprintf(w, `
environment:
  %s
	one admin token (in addition to --admin-token-file); kept out of the command line
  OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_EXPORTER_OTLP_TRACES_ENDPOINT
	export traces with OTLP/gRPC (off when neither is set); the other
	standard OTEL_EXPORTER_OTLP_* and OTEL_RESOURCE_ATTRIBUTES variables apply

signals:
  SIGINT, SIGTERM  drain in-flight calls, then stop
  SIGHUP           reload --admin-token-file, --viewer-token-file, --tls-cert, --tls-key and --client-ca
`, adminTokenEnv)
}
