// Package grpcserver assembles snapcoord's gRPC server: the RunService and
// WorkerService handlers, request validation, panic recovery, health,
// reflection, limits and keepalive, and a bounded graceful shutdown.
package grpcserver

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"sync"
	"time"

	"buf.build/go/protovalidate"
	pvinterceptor "github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/protovalidate"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/recovery"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/reflection"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
	"github.com/snapcoord/snapcoord/server/transport"
)

// Health reports on "", the whole server, which is what most probes
// (grpc_health_probe, Kubernetes) ask about, and on leaderServices, which
// only the leader of a coordinator group serves.
var leaderServices = []string{v1.RunService_ServiceDesc.ServiceName, v1.WorkerService_ServiceDesc.ServiceName}

// Server is a gRPC server with its health state and shutdown.
type Server struct {
	grpc   *grpc.Server
	health *health.Server
	drain  *drainer
	log    *slog.Logger
	// endLongCalls ends the long calls the engine serves (see
	// engineLongCalls) when shutdown starts; the drainer ends the others.
	endLongCalls func()

	mu        sync.Mutex
	serving   bool // Serve was called
	leading   bool // SetLeading(true): RunService and WorkerService are served
	stopping  bool
	unhealthy bool // MarkUnhealthy was called: never SERVING again
	stopOnce  sync.Once
	stopped   chan struct{} // closed once the gRPC server has fully stopped
}

// Engines are the engines that answer RunService and WorkerService calls
// (leader.Gate): EndLongCalls ends the long calls of the current one and
// of any later one.
type Engines interface {
	transport.Engines
	EndLongCalls()
}

// New builds a server answering RunService and WorkerService from eng. It
// reports NOT_SERVING until Serve is called, and for those two services
// also until SetLeading(true).
func New(cfg Config, eng Engines, logger *slog.Logger) (*Server, error) {
	s, err := newServer(cfg, logger, func(r grpc.ServiceRegistrar) {
		v1.RegisterRunServiceServer(r, transport.NewRunServer(eng, logger))
		v1.RegisterWorkerServiceServer(r, transport.NewWorkerServer(eng, logger))
	})
	if err != nil {
		return nil, err
	}
	s.endLongCalls, s.drain.exempt = eng.EndLongCalls, engineLongCalls
	return s, nil
}

// newServer is New with the snapcoord services supplied by register, so
// tests can serve a handler that panics through the same chain.
func newServer(cfg Config, logger *slog.Logger, register func(grpc.ServiceRegistrar)) (*Server, error) {
	validator, err := protovalidate.New()
	if err != nil {
		return nil, fmt.Errorf("grpcserver: build request validator: %w", err)
	}
	s := &Server{health: health.NewServer(), drain: newDrainer(), log: logger, stopped: make(chan struct{})}
	s.grpc = grpc.NewServer(s.options(cfg, validator)...)
	register(s.grpc)
	healthpb.RegisterHealthServer(s.grpc, s.health)
	if !cfg.DisableReflection {
		reflection.Register(s.grpc)
	}
	s.updateHealth()
	return s, nil
}

func (s *Server) options(cfg Config, validator protovalidate.Validator) []grpc.ServerOption {
	unary, stream := interceptors(s.chain(cfg, validator))
	opts := []grpc.ServerOption{
		grpc.StatsHandler(&s.drain.calls),
		grpc.ChainUnaryInterceptor(unary...),
		grpc.ChainStreamInterceptor(stream...),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{
			MinTime:             cfg.KeepaliveMinTime,
			PermitWithoutStream: !cfg.RejectPingsWithoutStream,
		}),
		grpc.KeepaliveParams(keepalive.ServerParameters{
			MaxConnectionIdle: cfg.MaxConnectionIdle,
			Time:              cfg.KeepaliveTime,
			Timeout:           cfg.KeepaliveTimeout,
		}),
	}
	if cfg.Telemetry != nil {
		opts = append(opts, grpc.StatsHandler(cfg.Telemetry))
	}
	// Zero keepalive durations are grpc-go's defaults.
	opts = append(opts, cfg.sizeOptions()...)
	return append(opts, cfg.ServerOptions...)
}

// chain is every interceptor a call passes through, outermost first, as
// go-grpc-middleware's examples/server orders them (the stats handlers,
// telemetry and drain's call counter, see every call before and after
// them). Logging comes before the gate so a refused call is logged with
// its code; the gate before authentication, which needs the leader's
// engine for run tokens; drain turns shutdown cancellation into
// UNAVAILABLE; validation rejects bad input before any handler; recovery
// is innermost, so a panic becomes a status every outer layer observes.
func (s *Server) chain(cfg Config, validator protovalidate.Validator) []Layer {
	recoverOpt := recovery.WithRecoveryHandlerContext(s.recoverPanic)
	return slices.Concat(cfg.Outer, []Layer{
		cfg.Logging,
		cfg.Gate,
		cfg.Auth,
		{s.drain.unary, s.drain.stream},
		{pvinterceptor.UnaryServerInterceptor(validator), pvinterceptor.StreamServerInterceptor(validator)},
		{recovery.UnaryServerInterceptor(recoverOpt), recovery.StreamServerInterceptor(recoverOpt)},
	})
}

// interceptors splits layers into grpc-go's two chains, leaving out what
// a layer does not provide.
func interceptors(layers []Layer) (unary []grpc.UnaryServerInterceptor, stream []grpc.StreamServerInterceptor) {
	for _, l := range layers {
		if l.Unary != nil {
			unary = append(unary, l.Unary)
		}
		if l.Stream != nil {
			stream = append(stream, l.Stream)
		}
	}
	return unary, stream
}

// Serve reports SERVING and serves lis until Shutdown; it then returns nil.
func (s *Server) Serve(lis net.Listener) error {
	s.mu.Lock()
	if s.stopping {
		s.mu.Unlock()
		_ = lis.Close()
		return nil
	}
	s.serving = true
	s.updateHealth()
	s.mu.Unlock()
	err := s.grpc.Serve(lis)
	// ErrServerStopped means Shutdown won the race with the line above: the
	// server was told to stop before it began, which is not a failure.
	if err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		return fmt.Errorf("grpcserver: serve %s: %w", lis.Addr(), err)
	}
	return nil
}

// flushGrace is how long Shutdown lets the last answers be written before
// it cuts the streams that hold GracefulStop (see inFlight).
const flushGrace = time.Second

// Shutdown reports NOT_SERVING, ends long-lived RPCs (streams, long polls)
// with UNAVAILABLE so their clients reconnect elsewhere or later, and waits
// for the other RPCs to finish; then it cuts what is left, which cannot
// hold a write (see drainer.calls). When ctx ends first it cuts them all
// off and returns ctx's error. It is safe to call more than once and
// concurrently.
func (s *Server) Shutdown(ctx context.Context) error {
	s.stopOnce.Do(s.beginStop)
	// A ctx already done leaves no time to drain: checked first, because
	// when both are ready select picks at random.
	if ctx.Err() == nil {
		select {
		case <-s.stopped:
			return nil
		case <-s.drain.calls.quiet():
			// What is left is safe to cut (see inFlight), once the last
			// answers are on the wire: stats.End comes when an answer is
			// queued, and Stop drops what is not written yet. GracefulStop
			// ends here unless an uncounted stream is open.
			select {
			case <-s.stopped:
				return nil
			case <-time.After(flushGrace):
			case <-ctx.Done():
			}
			s.grpc.Stop()
			<-s.stopped
			return nil
		case <-ctx.Done():
		}
	}
	s.grpc.Stop()
	<-s.stopped
	return fmt.Errorf("grpcserver: drain cut short: %w", ctx.Err())
}

// beginStop reports NOT_SERVING, ends long-lived RPCs and starts the
// graceful stop, which closes s.stopped when every RPC has finished.
func (s *Server) beginStop() {
	s.mu.Lock()
	s.stopping = true
	// health.Shutdown also makes later SetServingStatus calls no-ops, so a
	// racing Serve cannot flip the status back.
	s.health.Shutdown()
	s.mu.Unlock()
	if s.endLongCalls != nil {
		s.endLongCalls()
	}
	s.drain.start()
	go func() {
		s.grpc.GracefulStop()
		close(s.stopped)
	}()
}

// MarkUnhealthy reports NOT_SERVING from now on, for good: the caller saw
// that the coordinator cannot do its job (its store cannot commit) and only
// a restart helps. RPCs keep being answered, with UNAVAILABLE from the
// engine, so clients are told why.
func (s *Server) MarkUnhealthy(cause error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.unhealthy {
		return
	}
	s.unhealthy = true
	s.updateHealth()
	s.log.Error("health: reporting NOT_SERVING until restarted", "err", cause)
}

// SetLeading says whether this coordinator leads its group, so serves
// RunService and WorkerService: their health follows it ("" does not, as
// a follower is a healthy process).
func (s *Server) SetLeading(leading bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.leading = leading
	s.updateHealth()
}

// updateHealth sets the serving status of every name from the state; the
// caller holds mu. After beginStop the health server ignores it.
func (s *Server) updateHealth() {
	up := s.serving && !s.unhealthy
	s.health.SetServingStatus("", servingStatus(up))
	for _, name := range leaderServices {
		s.health.SetServingStatus(name, servingStatus(up && s.leading))
	}
}

func servingStatus(up bool) healthpb.HealthCheckResponse_ServingStatus {
	if up {
		return healthpb.HealthCheckResponse_SERVING
	}
	return healthpb.HealthCheckResponse_NOT_SERVING
}

// Serving reports whether health checks are answered SERVING, for the
// health gauge.
func (s *Server) Serving() bool {
	resp, err := s.health.Check(context.Background(), &healthpb.HealthCheckRequest{})
	return err == nil && resp.GetStatus() == healthpb.HealthCheckResponse_SERVING
}
