// Package coordinator assembles the whole snapcoord coordinator from one
// Config: telemetry, the store and the engine (a bbolt file, or etcd with
// a leader election and an engine per term led, see leader.Election), the
// follower gate, authentication, the gRPC server with its full interceptor
// chain, the metrics and status page listener, and the background loops
// (health watch, credential reload, election).
// It owns their order: New acquires them, Start listens, Shutdown drains
// the RPCs in flight and then releases everything in reverse.
//
// `snapcoord serve` is Run; the in-process tests use New, Start and
// Shutdown, so they run the production chain.
package coordinator

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/snapcoord/snapcoord/server/auth"
	"github.com/snapcoord/snapcoord/server/engine"
	"github.com/snapcoord/snapcoord/server/grpcserver"
	"github.com/snapcoord/snapcoord/server/leader"
	"github.com/snapcoord/snapcoord/server/telemetry"
	"github.com/snapcoord/snapcoord/store"
)

// StoreFile is the data file inside Config.DataDir.
const StoreFile = "snapcoord.db"

// Coordinator is an assembled coordinator.
type Coordinator struct {
	cfg Config
	x   extras // what the Options added
	log *slog.Logger
	tel *telemetry.Telemetry
	db  *store.DB      // nil with the etcd store
	eng *engine.Engine // the bbolt store's engine; with etcd, each term has its own
	// gate lets RunService and WorkerService calls through to the engine
	// while this coordinator leads; with bbolt it always does.
	gate  *leader.Gate
	etcd  *clientv3.Client // with the etcd store
	authn *auth.Authenticator
	tlsr  *auth.TLSReloader // nil without TLS
	srv   *grpcserver.Server
	// adminTokens and viewerTokens are how many there were at start.
	adminTokens, viewerTokens int

	// undo releases, in reverse, what New and Start acquired.
	undo   []func()
	lis    net.Listener
	served chan error // Serve's result; nil until Start
	addr   string
	// metricsAddr is the metrics listener's address; empty when off.
	metricsAddr string
	// leaderPage is the status page URL the leader published (etcd), ""
	// if none; nil while no leader is known.
	leaderPage atomic.Pointer[string]
	// pageOn is whether this coordinator serves a status page.
	pageOn bool
}

// New assembles a coordinator over cfg.DataDir without listening yet. On
// error, whatever it had acquired is released. opts are for tests.
func New(ctx context.Context, cfg Config, opts ...Option) (_ *Coordinator, err error) {
	c := &Coordinator{cfg: cfg, log: cfg.Logger}
	for _, o := range opts {
		o(&c.x)
	}
	if c.log == nil {
		c.log = slog.New(slog.DiscardHandler)
	}
	c.gate = leader.New(func(leading bool) { c.srv.SetLeading(leading) })
	defer func() {
		if err != nil {
			c.release()
		}
	}()
	if err := c.openTelemetry(ctx); err != nil {
		return nil, err
	}
	if c.cfg.Store == StoreEtcd {
		err = c.connectEtcd()
	} else {
		err = c.openBbolt(ctx)
	}
	if err != nil {
		return nil, err
	}
	if err := c.buildServer(); err != nil {
		return nil, err
	}
	if c.eng != nil {
		// A coordinator alone on its store leads it for good.
		c.gate.Lead(c.eng, c.cfg.Listen, nil)
	}
	return c, nil
}

// openTelemetry comes first: the store and engines report to telemetry
// until they close.
func (c *Coordinator) openTelemetry(ctx context.Context) error {
	lookupEnv := c.cfg.LookupEnv
	if lookupEnv == nil {
		lookupEnv = func(string) (string, bool) { return "", false }
	}
	tel, err := telemetry.New(ctx, telemetry.Options{Logger: c.log, ServiceVersion: c.cfg.ServiceVersion, LookupEnv: lookupEnv})
	if err != nil {
		return err
	}
	c.tel = tel
	c.defer_(c.shutdownTelemetry)
	return tel.ObserveEngine(c.gate.Stats)
}

// openBbolt opens the data file and loads the engine from it.
func (c *Coordinator) openBbolt(ctx context.Context) (err error) {
	if c.db, err = openStore(c.cfg, c.tel.OnCommit); err != nil {
		return err
	}
	c.defer_(c.closeStore)
	if c.eng, err = c.loadEngine(ctx, c.db); err != nil {
		return fmt.Errorf("load state from %s: %w", c.cfg.DataDir, err)
	}
	c.defer_(c.eng.Close)
	return nil
}

// loadEngine builds an engine over st, loading every run: at start with
// bbolt, at each term won with etcd, the same restart either way.
func (c *Coordinator) loadEngine(ctx context.Context, st store.Store) (*engine.Engine, error) {
	opts := engine.Options{
		Logger:               c.log,
		HeartbeatInterval:    c.cfg.HeartbeatInterval,
		LeaseTTL:             c.cfg.LeaseTTL,
		MaxRuns:              c.cfg.MaxRuns,
		MaxWorkersPerRun:     c.cfg.MaxWorkersPerRun,
		MaxEventsPerRun:      c.cfg.MaxEventsPerRun,
		FinishedRunRetention: c.cfg.FinishedRunRetention,
		Observer:             c.tel,
	}
	for _, edit := range c.x.engine {
		edit(&opts)
	}
	return engine.New(ctx, st, opts)
}

// openStore opens the data file. A second coordinator on the same directory
// fails here within LockTimeout, with an error naming the directory.
func openStore(cfg Config, onCommit func(int, time.Duration)) (*store.DB, error) {
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return nil, fmt.Errorf("create data directory: %w", err)
	}
	db, err := store.Open(filepath.Join(cfg.DataDir, StoreFile), store.Options{LockTimeout: cfg.LockTimeout, OnCommit: onCommit})
	if err != nil {
		return nil, fmt.Errorf("open store: %w", err)
	}
	return db, nil
}

// Start listens on Listen (and MetricsListen) and serves in the
// background until Shutdown. It logs "serving" with the address once the
// gRPC listener is open, after "metrics listening".
func (c *Coordinator) Start() error {
	lis, err := net.Listen("tcp", c.cfg.Listen)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	if err := c.startMetrics(); err != nil {
		_ = lis.Close()
		return err
	}
	c.startLoops()
	c.lis, c.addr, c.served = lis, lis.Addr().String(), make(chan error, 1)
	if c.etcd != nil {
		c.log.Info("serving", "addr", c.addr, "store", StoreEtcd, "etcd_prefix", c.cfg.Etcd.Prefix)
	} else {
		c.log.Info("serving", "addr", c.addr, "data_dir", c.cfg.DataDir)
	}
	go func() { c.served <- c.srv.Serve(lis) }()
	if c.etcd != nil {
		// Health, reflection and the metrics stay up on a follower.
		c.startElection(c.cfg.advertise(c.addr))
	}
	return nil
}

// Run serves until ctx ends or serving fails, then shuts down within
// DrainTimeout; a drain cut short is logged, not an error. It is
// `snapcoord serve`.
func (c *Coordinator) Run(ctx context.Context) error {
	if err := c.Start(); err != nil {
		c.release()
		return err
	}
	var serveErr error
	select {
	case serveErr = <-c.served:
		c.served = nil
	case <-ctx.Done():
		c.log.Info("shutting down", "drain_timeout", c.cfg.DrainTimeout)
	}
	// A fresh context: ctx is already done, and the drain gets its own bound.
	drainCtx, cancel := context.WithTimeout(context.Background(), c.cfg.DrainTimeout)
	defer cancel()
	drainErr, lateErr := c.shutdown(drainCtx)
	if drainErr != nil {
		c.log.Warn("drain timeout reached; remaining RPCs were cut off", "err", drainErr)
	}
	if err := errors.Join(serveErr, lateErr); err != nil {
		return err
	}
	c.log.Info("stopped")
	return nil
}

// Shutdown drains the gRPC server (long polls and streams end UNAVAILABLE;
// calls still running when ctx ends are cut off, and the error says so),
// then stops the loops and the metrics listener and closes the engine, the
// store and telemetry. A failure of Serve is returned too.
func (c *Coordinator) Shutdown(ctx context.Context) error {
	return errors.Join(c.shutdown(ctx))
}

func (c *Coordinator) shutdown(ctx context.Context) (drainErr, serveErr error) {
	drainErr = c.srv.Shutdown(ctx)
	if c.served != nil {
		serveErr = <-c.served
		c.served = nil
	}
	c.release()
	return drainErr, serveErr
}

// Addr is the gRPC address Start listens on.
func (c *Coordinator) Addr() string { return c.addr }

// MetricsAddr is the metrics listener's address; empty when it is off.
func (c *Coordinator) MetricsAddr() string { return c.metricsAddr }

// Engine is the coordinator's engine, for tests that inspect its state;
// with etcd, the current term's, nil while following.
func (c *Coordinator) Engine() *engine.Engine { return c.gate.Current() }

// Store is the coordinator's bbolt store, for tests that check what it
// holds; nil with etcd.
func (c *Coordinator) Store() *store.DB { return c.db }

// Leader is the address of its group's leader as this coordinator knows
// it, and whether that is itself.
func (c *Coordinator) Leader() (addr string, self bool) { return c.gate.Leader() }

// Server is the gRPC server, for tests of its health reporting.
func (c *Coordinator) Server() *grpcserver.Server { return c.srv }

// defer_ records a release step; release runs them last first.
func (c *Coordinator) defer_(f func()) { c.undo = append(c.undo, f) }

func (c *Coordinator) release() {
	for i := len(c.undo) - 1; i >= 0; i-- {
		c.undo[i]()
	}
	c.undo = nil
}

func (c *Coordinator) shutdownTelemetry() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.tel.Shutdown(ctx); err != nil {
		c.log.Warn("telemetry shutdown", "err", err)
	}
}

func (c *Coordinator) closeStore() {
	if err := c.db.Close(); err != nil {
		c.log.Error("closing the store failed", "err", err)
	}
}
