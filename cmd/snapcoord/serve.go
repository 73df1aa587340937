package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/snapcoord/snapcoord/cmd/internal/version"
	"github.com/snapcoord/snapcoord/server/coordinator"
)

func runServe(ctx context.Context, args []string, lookupEnv func(string) (string, bool), stdout, stderr io.Writer) int {
	cfg, fs, err := parseServe(args, lookupEnv)
	if errors.Is(err, flag.ErrHelp) {
		printServeUsage(stdout, fs)
		return exitOK
	}
	if err != nil {
		// One line, not the 90 of the usage, which would push the error
		// off the screen (or out of a unit's journal excerpt).
		fmt.Fprintf(stderr, "snapcoord serve: %v; see 'snapcoord serve --help'\n", err)
		return exitUsage
	}
	nTokens, err := adminTokens(&cfg, lookupEnv)
	if err != nil {
		fmt.Fprintf(stderr, "snapcoord serve: %v\n", err)
		return exitUsage
	}
	if err := cfg.checkExposure(nTokens); err != nil {
		fmt.Fprintf(stderr, "snapcoord serve: %v\n", err)
		return exitUsage
	}
	log := newLogger(cfg, stderr)
	if cfg.tlsSelfSigned != "" {
		made, err := provisionSelfSigned(cfg.tlsSelfSigned, cfg.Listen, time.Now())
		if err != nil {
			fmt.Fprintf(stderr, "snapcoord serve: %v\n", err)
			return exitFail
		}
		cfg.TLSCert, cfg.TLSKey = made.CertFile, made.KeyFile
		log.Info("self-signed TLS", "ca_file", made.CAFile, "ca_reused", made.CAReused, "hosts", made.Hosts)
	}
	if err := serve(ctx, cfg, lookupEnv, log); err != nil {
		fmt.Fprintf(stderr, "snapcoord serve: %v\n", err)
		return exitFail
	}
	return exitOK
}

// adminTokens puts SNAPCOORD_ADMIN_TOKEN into cfg and counts the admin
// tokens there and in --admin-token-file. Errors never quote a token.
func adminTokens(cfg *serveConfig, lookupEnv func(string) (string, bool)) (int, error) {
	fromFile, err := coordinator.AdminTokens(coordinator.Config{AdminTokenFile: cfg.AdminTokenFile})
	if err != nil {
		return 0, err
	}
	if v, ok := lookupEnv(adminTokenEnv); ok && strings.TrimSpace(v) != "" {
		cfg.AdminTokens = []string{strings.TrimSpace(v)}
		if _, err := coordinator.AdminTokens(coordinator.Config{AdminTokens: cfg.AdminTokens}); err != nil {
			return 0, fmt.Errorf("%s: %w", adminTokenEnv, err)
		}
	}
	return len(fromFile) + len(cfg.AdminTokens), nil
}

func newLogger(cfg serveConfig, w io.Writer) *slog.Logger {
	opts := &slog.HandlerOptions{Level: cfg.logLevel}
	if cfg.logFormat == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

// serve runs the coordinator until ctx ends, then drains it; SIGHUP
// reloads the credential files.
func serve(ctx context.Context, cfg serveConfig, lookupEnv func(string) (string, bool), log *slog.Logger) error {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	c := cfg.Config
	c.ReloadSignals, c.Logger, c.LookupEnv, c.ServiceVersion = hup, log, lookupEnv, version.Get().Version
	coord, err := coordinator.New(ctx, c)
	if err != nil {
		return err
	}
	return coord.Run(ctx)
}
