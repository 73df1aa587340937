package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"

	"github.com/snapcoord/snapcoord/server/engine"
	"github.com/snapcoord/snapcoord/server/grpcserver"
	"github.com/snapcoord/snapcoord/store"
)

// storeFile is the data file inside --data-dir.
const storeFile = "snapcoord.db"

func runServe(ctx context.Context, args []string, lookupEnv func(string) (string, bool), stdout, stderr io.Writer) int {
	cfg, fs, err := parseServe(args, lookupEnv)
	if errors.Is(err, flag.ErrHelp) {
		printServeUsage(stdout, fs)
		return exitOK
	}
	if err != nil {
		fmt.Fprintf(stderr, "snapcoord serve: %v\n\n", err)
		printServeUsage(stderr, fs)
		return exitUsage
	}
	if err := serve(ctx, cfg, newLogger(cfg, stderr)); err != nil {
		fmt.Fprintf(stderr, "snapcoord serve: %v\n", err)
		return exitFail
	}
	return exitOK
}

func newLogger(cfg serveConfig, w io.Writer) *slog.Logger {
	opts := &slog.HandlerOptions{Level: cfg.logLevel}
	if cfg.logFormat == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

// serve runs the coordinator until ctx ends, then drains it. Resources are
// released in reverse order of acquisition: server, engine, store.
func serve(ctx context.Context, cfg serveConfig, log *slog.Logger) error {
	db, err := openStore(cfg)
	if err != nil {
		return err
	}
	defer closeStore(db, log)
	eng, err := engine.New(ctx, db, engine.Options{
		Logger:            log,
		HeartbeatInterval: cfg.heartbeatInterval,
		LeaseTTL:          cfg.leaseTTL,
	})
	if err != nil {
		return fmt.Errorf("load state from %s: %w", cfg.dataDir, err)
	}
	defer eng.Close()
	srv, err := grpcserver.New(grpcserver.Config{}, eng, log)
	if err != nil {
		return err
	}
	lis, err := net.Listen("tcp", cfg.listen)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	return serveUntilDone(ctx, cfg, srv, lis, log)
}

// openStore opens the data file. A second coordinator on the same directory
// fails here within --lock-timeout, with an error naming the directory.
func openStore(cfg serveConfig) (*store.DB, error) {
	if err := os.MkdirAll(cfg.dataDir, 0o700); err != nil {
		return nil, fmt.Errorf("create data directory: %w", err)
	}
	db, err := store.Open(filepath.Join(cfg.dataDir, storeFile), store.Options{LockTimeout: cfg.lockTimeout})
	if err != nil {
		return nil, fmt.Errorf("open store: %w", err)
	}
	return db, nil
}

func closeStore(db *store.DB, log *slog.Logger) {
	if err := db.Close(); err != nil {
		log.Error("closing the store failed", "err", err)
	}
}

func serveUntilDone(ctx context.Context, cfg serveConfig, srv *grpcserver.Server, lis net.Listener, log *slog.Logger) error {
	log.Info("serving", "addr", lis.Addr().String(), "data_dir", cfg.dataDir)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(lis) }()
	var serveErr error
	select {
	case serveErr = <-served:
		served = nil
	case <-ctx.Done():
		log.Info("shutting down", "drain_timeout", cfg.drainTimeout)
	}
	// A fresh context: ctx is already done, and the drain gets its own bound.
	drainCtx, cancel := context.WithTimeout(context.Background(), cfg.drainTimeout)
	defer cancel()
	if err := srv.Shutdown(drainCtx); err != nil {
		log.Warn("drain timeout reached; remaining RPCs were cut off", "err", err)
	}
	if served != nil {
		serveErr = <-served
	}
	if serveErr != nil {
		return serveErr
	}
	log.Info("stopped")
	return nil
}
