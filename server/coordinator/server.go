package coordinator

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/snapcoord/snapcoord/internal/loopback"
	"github.com/snapcoord/snapcoord/server/auth"
	"github.com/snapcoord/snapcoord/server/engine"
	"github.com/snapcoord/snapcoord/server/grpcserver"
	"github.com/snapcoord/snapcoord/server/statuspage"
	"github.com/snapcoord/snapcoord/server/telemetry"
)

// AdminTokens gathers the admin tokens: those in cfg.AdminTokenFile, then
// cfg.AdminTokens. Errors never quote a token.
func AdminTokens(cfg Config) ([]string, error) {
	var tokens []string
	if cfg.AdminTokenFile != "" {
		t, err := auth.ReadAdminTokens(cfg.AdminTokenFile)
		if err != nil {
			return nil, err
		}
		tokens = t
	}
	for _, tok := range cfg.AdminTokens {
		if err := auth.CheckAdminToken(strings.TrimSpace(tok)); err != nil {
			return nil, err
		}
		tokens = append(tokens, strings.TrimSpace(tok))
	}
	return tokens, nil
}

// ViewerTokens reads cfg.ViewerTokenFile; none without one.
func ViewerTokens(cfg Config) ([]string, error) {
	if cfg.ViewerTokenFile == "" {
		return nil, nil
	}
	return auth.ReadViewerTokens(cfg.ViewerTokenFile)
}

// buildServer puts authentication, TLS and telemetry around the engine.
func (c *Coordinator) buildServer() error {
	tokens, err := AdminTokens(c.cfg)
	if err != nil {
		return err
	}
	viewers, err := ViewerTokens(c.cfg)
	if err != nil {
		return err
	}
	serveReflection, openReflection := c.cfg.ReflectionAccess()
	if c.authn, err = auth.New(auth.Options{AdminTokens: tokens, ViewerTokens: viewers, Runs: c.gate, OpenReflection: openReflection}); err != nil {
		return err
	}
	if c.cfg.TLSCert != "" {
		if c.tlsr, err = auth.NewTLSReloader(c.cfg.TLSCert, c.cfg.TLSKey, c.cfg.ClientCA); err != nil {
			return err
		}
		reportExpiry(c.tel, c.tlsr)
	}
	c.adminTokens, c.viewerTokens = len(tokens), len(viewers)
	c.logSecurity(serveReflection, openReflection)
	if c.srv, err = grpcserver.New(c.serverConfig(serveReflection), c.gate, c.log); err != nil {
		return err
	}
	return c.tel.ObserveLive(telemetry.LiveView{
		Runs:    func() []engine.LiveRun { return c.gate.MetricRuns(c.cfg.RunMetricsRetention) },
		Serving: c.srv.Serving, Now: time.Now,
		CommitFailed: func() bool { return c.gate.Healthy() != nil },
		Leading:      func() bool { _, self := c.gate.Leader(); return self },
	})
}

// serverConfig fills grpcserver's slots; grpcserver.chain puts them in
// order.
func (c *Coordinator) serverConfig(serveReflection bool) grpcserver.Config {
	var opts []grpc.ServerOption
	if c.tlsr != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(c.tlsr.Config())))
	}
	return grpcserver.Config{
		MaxRecvMsgSize:           c.cfg.MaxRecvMsgSize,
		MaxHeaderListSize:        c.cfg.MaxHeaderListSize,
		MaxConcurrentStreams:     c.cfg.MaxConcurrentStreams,
		KeepaliveMinTime:         c.cfg.KeepaliveMinTime,
		RejectPingsWithoutStream: !c.cfg.PermitPingsWithoutStream,
		MaxConnectionIdle:        c.cfg.MaxConnectionIdle,
		KeepaliveTime:            c.cfg.KeepaliveTime,
		KeepaliveTimeout:         c.cfg.KeepaliveTimeout,
		DisableReflection:        !serveReflection,
		Telemetry:                c.tel.StatsHandler(),
		Outer:                    c.x.outer,
		Logging: grpcserver.Layer{
			Unary:  telemetry.RPCLoggingUnary(c.log, telemetry.CallLog{All: c.cfg.LogCalls == LogCallsAll, Slow: c.cfg.SlowCall}),
			Stream: telemetry.RPCLoggingStream(c.log, telemetry.CallLog{All: c.cfg.LogCalls == LogCallsAll})},
		Gate:          grpcserver.Layer{Unary: c.gate.UnaryServerInterceptor(), Stream: c.gate.StreamServerInterceptor()},
		Auth:          grpcserver.Layer{Unary: c.authn.UnaryServerInterceptor(), Stream: c.authn.StreamServerInterceptor()},
		ServerOptions: append(opts, c.x.server...),
	}
}

func (c *Coordinator) logSecurity(serveReflection, openReflection bool) {
	nAdminTokens := c.adminTokens
	tlsMode := "off"
	if c.tlsr != nil {
		tlsMode = "tls"
		if c.cfg.ClientCA != "" {
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
	c.log.Info("security", "admin_tokens", nAdminTokens, "viewer_tokens", c.viewerTokens, "tls", tlsMode, "reflection", reflectionMode,
		"traces_exported", c.tel.TracesExported())
	if nAdminTokens == 0 {
		c.log.Warn("no admin token configured: RunService is open to anyone who can connect")
	} else if tlsMode == "off" && !loopback.Is(c.cfg.Listen) {
		c.log.Warn("serving without TLS on a non-loopback address: tokens cross the network in clear text")
	}
}

// startMetrics serves /metrics, pprof and the status page on
// MetricsListen until release.
func (c *Coordinator) startMetrics() error {
	var page http.Handler
	if c.cfg.StatusPageAllowed(c.adminTokens + c.viewerTokens) {
		page = statuspage.New(statuspage.Options{Runs: c.gate, Admit: c.authn, Logger: c.log,
			LeaseTTL: c.cfg.LeaseTTL, Leader: c.pageLeader})
	} else {
		c.log.Warn("status page off: no admin or viewer token is configured and --metrics-listen is not loopback; configure one or pass --insecure")
	}
	if c.cfg.MetricsListen == "" {
		return nil
	}
	lis, err := net.Listen("tcp", c.cfg.MetricsListen)
	if err != nil {
		return fmt.Errorf("metrics listen: %w", err)
	}
	c.metricsAddr, c.pageOn = lis.Addr().String(), page != nil
	hs := &http.Server{
		Handler:           metricsMux(c.tel.Handler(c.cfg.Pprof), page),
		ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:          slog.NewLogLogger(c.log.Handler(), slog.LevelWarn),
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := hs.Serve(lis); err != nil && !errors.Is(err, http.ErrServerClosed) {
			c.log.Error("metrics server failed", "err", err)
		}
	}()
	c.log.Info("metrics listening", "addr", c.metricsAddr, "pprof", c.cfg.Pprof)
	c.defer_(func() {
		// Scrapes are short; a profile in progress is cut off.
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		if err := hs.Shutdown(ctx); err != nil {
			_ = hs.Close()
		}
		<-done
	})
	return nil
}

// pageLeader is where the status page sends people while this coordinator
// follows (statuspage.Options.Leader).
func (c *Coordinator) pageLeader() statuspage.Leader {
	if c.etcd == nil {
		return statuspage.Leader{Self: true}
	}
	_, self := c.gate.Leader()
	l := statuspage.Leader{Self: self}
	if p := c.leaderPage.Load(); p != nil {
		l.Known, l.PageURL = true, *p
	}
	return l
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
