package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"
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
}

func newServeFlags(cfg *serveConfig) *flag.FlagSet {
	fs := flag.NewFlagSet("snapcoord serve", flag.ContinueOnError)
	fs.StringVar(&cfg.listen, "listen", "127.0.0.1:7070", "gRPC `address` to listen on")
	fs.StringVar(&cfg.dataDir, "data-dir", "./data", "`directory` holding the store file snapcoord.db (created 0700 if missing)")
	fs.DurationVar(&cfg.heartbeatInterval, "heartbeat-interval", 5*time.Second, "how often workers are told to heartbeat")
	fs.DurationVar(&cfg.leaseTTL, "lease-ttl", 15*time.Second, "a worker silent this long is LOST")
	fs.DurationVar(&cfg.drainTimeout, "drain-timeout", 10*time.Second, "on SIGINT/SIGTERM, how long in-flight RPCs may take to finish")
	fs.DurationVar(&cfg.lockTimeout, "lock-timeout", time.Second, "how long to wait for another process to release the data directory")
	fs.StringVar(&cfg.logFormat, "log-format", "text", "log `format`: text or json")
	fs.TextVar(&cfg.logLevel, "log-level", slog.LevelInfo, "log `level`: debug, info, warn or error")
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
		return cfg, fs, err
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
	}
	return nil
}

func printServeUsage(w io.Writer, fs *flag.FlagSet) {
	fmt.Fprintf(w, "usage: snapcoord serve [flags]\n\nRuns the coordinator until SIGINT or SIGTERM.\n\nflags:\n")
	fs.SetOutput(w)
	fs.PrintDefaults()
	fs.SetOutput(io.Discard)
}
