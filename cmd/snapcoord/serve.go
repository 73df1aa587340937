package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"

	"github.com/snapcoord/snapcoord/cmd/internal/loopback"
	"github.com/snapcoord/snapcoord/cmd/internal/version"
	"github.com/snapcoord/snapcoord/server/auth"
	"github.com/snapcoord/snapcoord/server/engine"
	"github.com/snapcoord/snapcoord/server/grpcserver"
	"github.com/snapcoord/snapcoord/server/statuspage"
	"github.com/snapcoord/snapcoord/server/telemetry"
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
	tokens, err := adminTokens(cfg, lookupEnv)
	if err != nil {
		fmt.Fprintf(stderr, "snapcoord serve: %v\n", err)
		return exitUsage
	}
	if err := cfg.checkExposure(len(tokens)); err != nil {
		fmt.Fprintf(stderr, "snapcoord serve: %v\n", err)
		return exitUsage
	}
	if err := serve(ctx, cfg, tokens, lookupEnv, newLogger(cfg, stderr)); err != nil {
		fmt.Fprintf(stderr, "snapcoord serve: %v\n", err)
		return exitFail
	}
	return exitOK
}

// adminTokens gathers the admin tokens from --admin-token-file and
// SNAPCOORD_ADMIN_TOKEN. Errors never quote a token.
func adminTokens(cfg serveConfig, lookupEnv func(string) (string, bool)) ([]string, error) {
	var tokens []string
	if cfg.adminTokenFile != "" {
		t, err := auth.ReadAdminTokens(cfg.adminTokenFile)
		if err != nil {
			return nil, err
		}
		tokens = t
	}
	if v, ok := lookupEnv(adminTokenEnv); ok && strings.TrimSpace(v) != "" {
		tok := strings.TrimSpace(v)
		if err := auth.CheckAdminToken(tok); err != nil {
			return nil, fmt.Errorf("%s: %w", adminTokenEnv, err)
		}
		tokens = append(tokens, tok)
	}
	return tokens, nil
}

func newLogger(cfg serveConfig, w io.Writer) *slog.Logger {
	opts := &slog.HandlerOptions{Level: cfg.logLevel}
	if cfg.logFormat == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

// serve runs the coordinator until ctx ends, then drains it. Resources are
// released in reverse order of acquisition: listeners and server, engine,
// store, telemetry (which the store and engine report to until closed).
func serve(ctx context.Context, cfg serveConfig, adminTokens []string, lookupEnv func(string) (string, bool), log *slog.Logger) error {
	tel, err := telemetry.New(ctx, telemetry.Options{Logger: log, ServiceVersion: version.Get().Version, LookupEnv: lookupEnv})
	if err != nil {
		return err
	}
	defer shutdownTelemetry(tel, log)
	db, err := openStore(cfg, tel.OnCommit)
	if err != nil {
		return err
	}
	defer closeStore(db, log)
	eng, err := engine.New(ctx, db, engine.Options{
		Logger:               log,
		HeartbeatInterval:    cfg.heartbeatInterval,
		LeaseTTL:             cfg.leaseTTL,
		MaxRuns:              cfg.maxRuns,
		MaxWorkersPerRun:     cfg.maxWorkersPerRun,
		MaxEventsPerRun:      cfg.maxEventsPerRun,
		FinishedRunRetention: cfg.finishedRetention,
		Observer:             tel,
	})
	if err != nil {
		return fmt.Errorf("load state from %s: %w", cfg.dataDir, err)
	}
	defer eng.Close()
	if err := tel.ObserveEngine(eng.Stats); err != nil {
		return err
	}
	serveReflection, openReflection := cfg.reflectionAccess()
	authn, err := auth.New(auth.Options{AdminTokens: adminTokens, Runs: eng, OpenReflection: openReflection})
	if err != nil {
		return err
	}
	var tlsr *auth.TLSReloader
	if cfg.tlsCert != "" {
		if tlsr, err = auth.NewTLSReloader(cfg.tlsCert, cfg.tlsKey, cfg.clientCA); err != nil {
			return err
		}
	}
	srv, err := newGRPCServer(cfg, serveReflection, authn, tlsr, len(adminTokens), eng, tel, log)
	if err != nil {
		return err
	}
	stopReload := startCredentialReload(cfg, lookupEnv, authn, tlsr, log)
	defer stopReload()
	if err := tel.ObserveLive(telemetry.LiveView{
		Runs: eng.LiveRuns, Serving: srv.Serving, Now: time.Now,
		CommitFailed: func() bool { return eng.Healthy() != nil },
	}); err != nil {
		return err
	}
	lis, err := net.Listen("tcp", cfg.listen)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	var page http.Handler
	if cfg.statusPageAllowed(len(adminTokens)) {
		page = statuspage.New(statuspage.Options{Runs: eng, Admit: authn, Logger: log})
	} else {
		log.Warn("status page off: no admin token is configured and --metrics-listen is not loopback; configure an admin token or pass --insecure")
	}
	stopMetrics, err := serveMetrics(cfg, metricsMux(tel.Handler(cfg.pprof), page), log)
	if err != nil {
		_ = lis.Close()
		return err
	}
	defer stopMetrics()
	ticker := time.NewTicker(healthPollInterval)
	defer ticker.Stop()
	stopHealth := startHealthWatch(eng, srv, ticker.C)
	defer stopHealth()
	return serveUntilDone(ctx, cfg, srv, lis, log)
}

// newGRPCServer assembles the interceptor chain around grpcserver's own
// (drain, validation, recovery), in go-grpc-middleware's examples/server
// order: the otelgrpc stats handler sees everything, then logging (so a
// refused call is logged with its code), then authentication.
func newGRPCServer(cfg serveConfig, serveReflection bool, authn *auth.Authenticator, tlsr *auth.TLSReloader, nAdminTokens int, eng *engine.Engine, tel *telemetry.Telemetry, log *slog.Logger) (*grpcserver.Server, error) {
	openReflection := authn.Access(reflectionpb.ServerReflection_ServerReflectionInfo_FullMethodName) == auth.Open
	opts := []grpc.ServerOption{grpc.StatsHandler(tel.StatsHandler())}
	tlsMode := "off"
	if tlsr != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(tlsr.Config())))
		tlsMode = "tls"
		if cfg.clientCA != "" {
			tlsMode = "mutual"
		}
	}
	reflectionMode := "off"
	if serveReflection {
		reflectionMode = auth.Admin.String()
		if openReflection {
			reflectionMode = auth.Open.String()
		}
	}
	log.Info("security", "admin_tokens", nAdminTokens, "tls", tlsMode, "reflection", reflectionMode,
		"traces_exported", tel.TracesExported())
	if nAdminTokens == 0 {
		log.Warn("no admin token configured: RunService is open to anyone who can connect")
	} else if tlsMode == "off" && !loopback.Is(cfg.listen) {
		log.Warn("serving without TLS on a non-loopback address: tokens cross the network in clear text")
	}
	return grpcserver.New(grpcserver.Config{
		MaxRecvMsgSize:           cfg.maxRecvMsgSize,
		MaxHeaderListSize:        uint32(cfg.maxHeaderListSize),
		MaxConcurrentStreams:     uint32(cfg.maxConcurrentStreams),
		KeepaliveMinTime:         cfg.keepaliveMinTime,
		RejectPingsWithoutStream: !cfg.permitPingsNoStream,
		MaxConnectionIdle:        cfg.maxConnectionIdle,
		KeepaliveTime:            cfg.keepaliveTime,
		KeepaliveTimeout:         cfg.keepaliveTimeout,
		DisableReflection:        !serveReflection,
		UnaryInterceptors:        []grpc.UnaryServerInterceptor{telemetry.RPCLoggingUnary(log), authn.UnaryServerInterceptor()},
		StreamInterceptors:       []grpc.StreamServerInterceptor{telemetry.RPCLoggingStream(log), authn.StreamServerInterceptor()},
		ServerOptions:            opts,
	}, eng, log)
}

// metricsMux puts the status page ("/" and "/runs/{id}") beside /metrics
// and pprof on the metrics listener; a nil page leaves them out.
func metricsMux(metrics, page http.Handler) http.Handler {
	mux := http.NewServeMux()
	if page != nil {
		mux.Handle("GET /{$}", page)
		mux.Handle("GET /runs/", page)
	}
	mux.Handle("/", metrics)
	return mux
}

// serveMetrics serves h (/metrics, pprof and the status page) on
// --metrics-listen until the returned function is called.
func serveMetrics(cfg serveConfig, h http.Handler, log *slog.Logger) (stop func(), err error) {
	if cfg.metricsListen == "" {
		return func() {}, nil
	}
	lis, err := net.Listen("tcp", cfg.metricsListen)
	if err != nil {
		return nil, fmt.Errorf("metrics listen: %w", err)
	}
	hs := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := hs.Serve(lis); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("metrics server failed", "err", err)
		}
	}()
	log.Info("metrics listening", "addr", lis.Addr().String(), "pprof", cfg.pprof)
	return func() {
		// Scrapes are short; a profile in progress is cut off.
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		if err := hs.Shutdown(ctx); err != nil {
			_ = hs.Close()
		}
		<-done
	}, nil
}

// startCredentialReload reloads the admin token and TLS files when they
// change (checked every --credentials-check-interval; 0: never) and on
// SIGHUP, until the returned function is called.
func startCredentialReload(cfg serveConfig, lookupEnv func(string) (string, bool), authn *auth.Authenticator, tlsr *auth.TLSReloader, log *slog.Logger) (stop func()) {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	var tick <-chan time.Time
	var ticker *time.Ticker
	if cfg.credentialsCheckInterval > 0 {
		ticker = time.NewTicker(cfg.credentialsCheckInterval)
		tick = ticker.C
	}
	stopLoop := newCredentialReloader(cfg, lookupEnv, authn, tlsr, log).start(tick, hup)
	return func() {
		stopLoop()
		signal.Stop(hup)
		if ticker != nil {
			ticker.Stop()
		}
	}
}

// healthPollInterval is how often serve asks the engine whether it can
// still commit.
const healthPollInterval = time.Second

// startHealthWatch turns NOT_SERVING for good once the engine reports that
// a store commit failed. It stops when the returned function is first called.
func startHealthWatch(eng interface{ Healthy() error }, srv interface{ MarkUnhealthy(error) }, tick <-chan time.Time) (stop func()) {
	return goUntilStopped(func(quit <-chan struct{}) {
		for {
			select {
			case <-quit:
				return
			case <-tick:
				if err := eng.Healthy(); err != nil {
					srv.MarkUnhealthy(err)
					return
				}
			}
		}
	})
}

// goUntilStopped runs loop in a goroutine; the returned function, first
// called, closes loop's quit channel and waits for loop to return.
func goUntilStopped(loop func(quit <-chan struct{})) (stop func()) {
	quit, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		loop(quit)
	}()
	return sync.OnceFunc(func() {
		close(quit)
		<-done
	})
}

func shutdownTelemetry(tel *telemetry.Telemetry, log *slog.Logger) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := tel.Shutdown(ctx); err != nil {
		log.Warn("telemetry shutdown", "err", err)
	}
}

// openStore opens the data file. A second coordinator on the same directory
// fails here within --lock-timeout, with an error naming the directory.
func openStore(cfg serveConfig, onCommit func(int, time.Duration)) (*store.DB, error) {
	if err := os.MkdirAll(cfg.dataDir, 0o700); err != nil {
		return nil, fmt.Errorf("create data directory: %w", err)
	}
	db, err := store.Open(filepath.Join(cfg.dataDir, storeFile), store.Options{LockTimeout: cfg.lockTimeout, OnCommit: onCommit})
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
