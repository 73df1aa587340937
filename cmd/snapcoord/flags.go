package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"strings"
	"time"

	"github.com/snapcoord/snapcoord/cmd/internal/durations"
	"github.com/snapcoord/snapcoord/cmd/internal/flagtext"
	"github.com/snapcoord/snapcoord/cmd/internal/loopback"
)

// envPrefix names the environment variable behind every flag: --lease-ttl
// is SNAPCOORD_LEASE_TTL. Launchers (Slurm scripts, systemd units) set the
// environment more easily than they rewrite command lines.
const envPrefix = "SNAPCOORD_"

// serveConfig is what `snapcoord serve` was asked to do.
type serveConfig struct {
	listen            string
	dataDir           string
	heartbeatInterval time.Duration
	leaseTTL          time.Duration
	drainTimeout      time.Duration
	lockTimeout       time.Duration
	logFormat         string
	logLevel          slog.Level

	// Security.
	adminTokenFile string
	insecure       bool
	tlsCert        string
	tlsKey         string
	clientCA       string
	reflection     string
	// credentialsCheckInterval is how often the token and TLS files are
	// checked for changes (0: only on SIGHUP).
	credentialsCheckInterval time.Duration

	// Operability.
	metricsListen string
	pprof         bool

	// Limits.
	maxRecvMsgSize       int
	maxHeaderListSize    uint
	maxConcurrentStreams uint
	maxRuns              int
	maxWorkersPerRun     int
	maxEventsPerRun      int
	finishedRetention    time.Duration
	keepaliveMinTime     time.Duration
	keepaliveTime        time.Duration
	keepaliveTimeout     time.Duration
	maxConnectionIdle    time.Duration
	permitPingsNoStream  bool
}

// adminTokenEnv holds one admin token. It is a variable, not a flag, so the
// secret never shows in the process list.
const adminTokenEnv = envPrefix + "ADMIN_TOKEN"

// Values of --reflection.
const (
	reflectionAuto = "auto" // open on a loopback address, admin elsewhere
	reflectionOpen = "open"
	reflectionAuth = "auth"
	reflectionOff  = "off"
)

func newServeFlags(cfg *serveConfig) *flag.FlagSet {
	fs := flag.NewFlagSet("snapcoord serve", flag.ContinueOnError)
	fs.StringVar(&cfg.listen, "listen", "127.0.0.1:7070", "gRPC `address` to listen on")
	fs.StringVar(&cfg.dataDir, "data-dir", "./data", "`directory` holding the store file snapcoord.db (created 0700 if missing)")
	durations.Var(fs, &cfg.heartbeatInterval, "heartbeat-interval", 5*time.Second, durations.Options{}, "how often workers are told to heartbeat")
	durations.Var(fs, &cfg.leaseTTL, "lease-ttl", 15*time.Second, durations.Options{}, "a worker silent this long is LOST")
	durations.Var(fs, &cfg.drainTimeout, "drain-timeout", 10*time.Second, durations.Options{}, "on SIGINT/SIGTERM, how long in-flight RPCs may take to finish")
	durations.Var(fs, &cfg.lockTimeout, "lock-timeout", time.Second, durations.Options{}, "how long to wait for another process to release the data directory")
	fs.StringVar(&cfg.logFormat, "log-format", "text", "log `format`: text or json")
	fs.TextVar(&cfg.logLevel, "log-level", slog.LevelInfo, "log `level`: debug, info, warn or error")

	fs.StringVar(&cfg.adminTokenFile, "admin-token-file", "", "`file` of admin tokens for RunService, one per line (several for rotation); with none here or in "+adminTokenEnv+", RunService is open")
	fs.BoolVar(&cfg.insecure, "insecure", false, "allow listening on a non-loopback address with no admin token (RunService open to anyone who can connect), or --pprof on a non-loopback --metrics-listen")
	fs.StringVar(&cfg.tlsCert, "tls-cert", "", "PEM certificate `file` for TLS (with --tls-key)")
	fs.StringVar(&cfg.tlsKey, "tls-key", "", "PEM private key `file` for TLS (with --tls-cert)")
	fs.StringVar(&cfg.clientCA, "client-ca", "", "PEM CA `file`: require client certificates signed by it (mutual TLS; needs --tls-cert)")
	fs.DurationVar(&cfg.credentialsCheckInterval, "credentials-check-interval", 10*time.Second, "how often --admin-token-file, --tls-cert, --tls-key and --client-ca are checked for changes and reloaded (0: only on SIGHUP, which always reloads them)")
	fs.StringVar(&cfg.reflection, "reflection", reflectionAuto, "server reflection: open, auth (admin token), off, or auto (open on a loopback --listen, auth otherwise)")

	fs.StringVar(&cfg.metricsListen, "metrics-listen", "127.0.0.1:7071", "HTTP `address` serving Prometheus /metrics (and /debug/pprof/ with --pprof); empty disables it")
	fs.BoolVar(&cfg.pprof, "pprof", false, "serve /debug/pprof/ on --metrics-listen")

	fs.IntVar(&cfg.maxRecvMsgSize, "max-recv-msg-size", 1<<20, "largest request message accepted, in `bytes`; larger ones get RESOURCE_EXHAUSTED")
	fs.UintVar(&cfg.maxHeaderListSize, "max-header-list-size", 32<<10, "largest metadata (HTTP/2 header list, uncompressed) one call may carry, in `bytes`; a call with more is refused")
	fs.UintVar(&cfg.maxConcurrentStreams, "max-concurrent-streams", 1024, "RPCs open at once on one client connection")
	fs.IntVar(&cfg.maxRuns, "max-runs", 10000, "runs the coordinator keeps; CreateRun beyond it gets RESOURCE_EXHAUSTED")
	fs.IntVar(&cfg.maxWorkersPerRun, "max-workers-per-run", 10000, "workers one run may register; more get RESOURCE_EXHAUSTED")
	fs.IntVar(&cfg.maxEventsPerRun, "max-events-per-run", 100000, "events kept per run, on disk (the latest 256 also in memory); the oldest are deleted beyond it")
	durations.Var(fs, &cfg.finishedRetention, "finished-run-retention", 0, durations.Options{}, "delete a finished run (and all stored for it) this long after it ended, e.g. 720h; 0 keeps finished runs")
	durations.Var(fs, &cfg.keepaliveMinTime, "keepalive-min-time", 10*time.Second, durations.Options{}, "shortest client keepalive ping interval tolerated; clients pinging more often are disconnected")
	fs.BoolVar(&cfg.permitPingsNoStream, "keepalive-permit-without-stream", true, "tolerate client keepalive pings on connections with no open RPC")
	durations.Var(fs, &cfg.keepaliveTime, "keepalive-time", 30*time.Second, durations.Options{}, "ping a client connection silent this long, to notice dead workers")
	durations.Var(fs, &cfg.keepaliveTimeout, "keepalive-timeout", 10*time.Second, durations.Options{}, "close a connection whose ping is not answered within this")
	durations.Var(fs, &cfg.maxConnectionIdle, "max-connection-idle", 0, durations.Options{}, "close connections with no RPC for this long; 0 never does")
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
	return cfg, fs, cfg.validate()
}

func (c serveConfig) validate() error {
	switch {
	case c.logFormat != "text" && c.logFormat != "json":
		return fmt.Errorf("--log-format (%s) must be text or json, not %q", envName("log-format"), c.logFormat)
	case c.heartbeatInterval <= 0, c.leaseTTL <= 0, c.drainTimeout <= 0, c.lockTimeout <= 0:
		return errors.New("--heartbeat-interval, --lease-ttl, --drain-timeout and --lock-timeout must be positive durations")
	case c.leaseTTL <= c.heartbeatInterval:
		// A lease no longer than one heartbeat interval would lapse between
		// two punctual heartbeats.
		return fmt.Errorf("--lease-ttl (%s) must be longer than --heartbeat-interval (%s)", c.leaseTTL, c.heartbeatInterval)
	case c.dataDir == "":
		return fmt.Errorf("--data-dir (%s) must not be empty", envName("data-dir"))
	case (c.tlsCert == "") != (c.tlsKey == ""):
		return errors.New("--tls-cert and --tls-key must be given together")
	case c.clientCA != "" && c.tlsCert == "":
		return errors.New("--client-ca (mutual TLS) needs --tls-cert and --tls-key")
	case c.reflection != reflectionAuto && c.reflection != reflectionOpen && c.reflection != reflectionAuth && c.reflection != reflectionOff:
		return fmt.Errorf("--reflection (%s) must be auto, open, auth or off, not %q", envName("reflection"), c.reflection)
	case c.pprof && c.metricsListen == "":
		return errors.New("--pprof needs --metrics-listen")
	case c.finishedRetention < 0:
		return errors.New("--finished-run-retention must not be negative")
	case c.credentialsCheckInterval < 0:
		return errors.New("--credentials-check-interval must not be negative")
	case c.maxRecvMsgSize <= 0, c.maxRuns <= 0, c.maxWorkersPerRun <= 0, c.maxEventsPerRun <= 0:
		return errors.New("--max-recv-msg-size, --max-runs, --max-workers-per-run and --max-events-per-run must be positive")
	case c.maxConcurrentStreams == 0 || c.maxConcurrentStreams > math.MaxUint32:
		return fmt.Errorf("--max-concurrent-streams must be between 1 and %d", uint32(math.MaxUint32))
	case c.maxHeaderListSize < 1024 || c.maxHeaderListSize > math.MaxUint32:
		// Below 1 KiB a token and the call's own headers no longer fit.
		return fmt.Errorf("--max-header-list-size must be between 1024 and %d", uint32(math.MaxUint32))
	case c.keepaliveMinTime <= 0, c.keepaliveTime <= 0, c.keepaliveTimeout <= 0, c.maxConnectionIdle < 0:
		return errors.New("--keepalive-min-time, --keepalive-time and --keepalive-timeout must be positive, --max-connection-idle not negative")
	}
	return nil
}

// checkExposure refuses to put an open RunService (no admin token) or
// pprof on a non-loopback address unless --insecure says that is meant.
func (c serveConfig) checkExposure(adminTokens int) error {
	if c.insecure {
		return nil
	}
	if adminTokens == 0 && !loopback.Is(c.listen) {
		return fmt.Errorf("refusing to listen on %s: no admin token is configured, so anyone who can reach that address "+
			"could create, change and cancel runs. Configure an admin token (--admin-token-file or %s), listen on a "+
			"loopback address (127.0.0.1, ::1, localhost), or pass --insecure to accept an open RunService", c.listen, adminTokenEnv)
	}
	if c.pprof && !loopback.Is(c.metricsListen) {
		return fmt.Errorf("refusing to serve /debug/pprof/ on %s, a non-loopback address: profiles and the command line "+
			"would be open to anyone who can reach it. Use a loopback --metrics-listen or pass --insecure", c.metricsListen)
	}
	return nil
}

// statusPageAllowed applies RunService's exposure rule to the status page:
// with no admin token it is open, so it is served only on a loopback
// --metrics-listen, unless --insecure says an open page is meant. (/metrics
// itself stays open, as Prometheus scrapes it.)
func (c serveConfig) statusPageAllowed(adminTokens int) bool {
	return adminTokens > 0 || c.insecure || loopback.Is(c.metricsListen)
}

// reflectionAccess resolves --reflection: whether to serve reflection and
// whether anyone may use it.
func (c serveConfig) reflectionAccess() (serve, open bool) {
	switch c.reflection {
	case reflectionOff:
		return false, false
	case reflectionAuth:
		return true, false
	case reflectionOpen:
		return true, true
	default:
		return true, loopback.Is(c.listen)
	}
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
  SIGHUP           reload --admin-token-file, --tls-cert, --tls-key and --client-ca
`, adminTokenEnv)
}
