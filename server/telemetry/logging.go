package telemetry

import (
	"context"
	"log/slog"
	"time"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/logging"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"

	"github.com/snapcoord/snapcoord/internal/apifacts"
)

// RPC log fields beyond go-grpc-middleware's own (grpc.service,
// grpc.method, grpc.code, grpc.time_ms, peer.address, ...).
const (
	FieldRunID    = "run_id"
	FieldWorkerID = "worker_id"
)

// slogLogger adapts slog to go-grpc-middleware's logging.Logger, as its
// examples do.
func slogLogger(l *slog.Logger) logging.Logger {
	return logging.LoggerFunc(func(ctx context.Context, lvl logging.Level, msg string, fields ...any) {
		l.Log(ctx, slog.Level(lvl), msg, fields...)
	})
}

// routineMethods are the fleet's calls (declared routine in the proto):
// every worker's every few seconds, every rank's at each step or save.
// Their successful lines go to debug: with thousands of workers they would
// bury everything else at info, and cost the coordinator more CPU than the
// calls themselves. Failures keep their level; slow calls reach info (see
// CallLog).
var routineMethods = apifacts.Set(apifacts.Routine)

// loggingOptions log one line per finished RPC. Payloads are never logged
// (a CreateRun response carries the run token), and neither is metadata
// (the authorization header): only the fields listed above and the ids
// taken from the request.
func loggingOptions(levels logging.CodeToLevel) []logging.Option {
	return []logging.Option{
		logging.WithLogOnEvents(logging.FinishCall),
		logging.WithLevels(levels),
		logging.WithFieldsFromContextAndCallMeta(func(ctx context.Context, c interceptors.CallMeta) logging.Fields {
			return append(replayedFields(ctx), requestFields(c.ReqOrNil)...)
		}),
	}
}

// rpcLevel is go-grpc-middleware's server mapping, except that a refused
// credential is a warning, like a refused permission: an operator watching
// warnings sees probing and misconfigured workers.
func rpcLevel(code codes.Code) logging.Level {
	if code == codes.Unauthenticated {
		return logging.LevelWarn
	}
	return logging.DefaultServerCodeToLevel(code)
}

// routineLevel is rpcLevel for routine methods: success is debug.
func routineLevel(code codes.Code) logging.Level {
	if code == codes.OK {
		return logging.LevelDebug
	}
	return rpcLevel(code)
}

// CallLog says which successful routine calls reach info (`snapcoord
// serve --log-calls` and --slow-call). Other calls, and failures, are
// always logged.
type CallLog struct {
	// All logs every successful routine call at info.
	All bool
	// Slow is the duration from which a successful routine call is logged
	// at info anyway; 0: never.
	Slow time.Duration
}

// RPCLoggingUnary logs each finished unary RPC: method, code, duration and
// the request's run_id and worker_id, except successful routine calls
// quicker than cl.Slow, which only debug shows.
//
// A routine call that succeeds while debug is off would build its line only
// for slog to drop it, and that costs a fifth of a heartbeat's CPU; so it
// runs without the logging interceptor. If it fails, or is slow, its line
// is written through the same interceptor afterwards, with the call's own
// start time and duration.
func RPCLoggingUnary(l *slog.Logger, cl CallLog) grpc.UnaryServerInterceptor {
	log := logging.UnaryServerInterceptor(slogLogger(l), loggingOptions(rpcLevel)...)
	logRoutine := logging.UnaryServerInterceptor(slogLogger(l), loggingOptions(routineLevel)...)
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if cl.All || !routineMethods[info.FullMethod] {
			return log(ctx, req, info, handler)
		}
		if l.Enabled(ctx, slog.LevelDebug) {
			return logRoutine(ctx, req, info, handler)
		}
		start := time.Now()
		resp, err := handler(ctx, req)
		took := time.Since(start)
		if err == nil && (cl.Slow <= 0 || took < cl.Slow) {
			return resp, nil
		}
		ctx = context.WithValue(ctx, timingKey{}, timing{start: start, took: took})
		return log(ctx, req, info, func(context.Context, any) (any, error) { return resp, err })
	}
}

// timing is a call's measured start and duration, and for a stream the ids
// of its first request, for a line written after the call ran.
type timing struct {
	start  time.Time
	took   time.Duration
	fields logging.Fields
}

type timingKey struct{}

// replayedFields returns the call's own start time and duration (and a
// stream's request ids) when its line is written after it ran.
// go-grpc-middleware puts these fields first and drops its own fields of
// the same names.
func replayedFields(ctx context.Context) logging.Fields {
	t, ok := ctx.Value(timingKey{}).(timing)
	if !ok {
		return nil
	}
	f := append(logging.Fields{"grpc.start_time", t.start.Format(time.RFC3339)}, logging.DefaultDurationToFields(t.took)...)
	return append(f, t.fields...)
}

// RPCLoggingStream logs each finished streaming RPC: method, code,
// duration and the ids of its first request.
//
// The line is written through the logging interceptor once the stream has
// ended, with the stream's own start time and duration. Run around the
// stream, the interceptor would hold its fields and wrappers for the
// stream's whole life: about 1 KiB of heap for each of thousands of parked
// command streams, which the garbage collector's headroom roughly doubles.
//
// A routine stream (every worker's command stream) that ends well is
// logged at debug, unless cl.All: thousands end together when their runs
// stop.
func RPCLoggingStream(l *slog.Logger, cl CallLog) grpc.StreamServerInterceptor {
	log := logging.StreamServerInterceptor(slogLogger(l), loggingOptions(rpcLevel)...)
	logRoutine := logging.StreamServerInterceptor(slogLogger(l), loggingOptions(routineLevel)...)
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		start := time.Now()
		rs := &firstRequestStream{ServerStream: ss}
		err := handler(srv, rs)
		write := log
		if !cl.All && routineMethods[info.FullMethod] {
			if err == nil && !l.Enabled(ss.Context(), slog.LevelDebug) {
				return nil
			}
			write = logRoutine
		}
		t := timing{start: start, took: time.Since(start), fields: rs.fields}
		ended := &contextStream{ServerStream: ss, ctx: context.WithValue(ss.Context(), timingKey{}, t)}
		return write(srv, ended, info, func(any, grpc.ServerStream) error { return err })
	}
}

// firstRequestStream keeps the ids of the stream's first request for its
// log line.
type firstRequestStream struct {
	grpc.ServerStream
	fields   logging.Fields
	received bool
}

func (s *firstRequestStream) RecvMsg(m any) error {
	err := s.ServerStream.RecvMsg(m)
	if err == nil && !s.received {
		s.received = true
		s.fields = requestFields(m)
	}
	return err
}

// contextStream is a stream with another context.
type contextStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s *contextStream) Context() context.Context { return s.ctx }

// maxFieldLen bounds a logged id: the logging interceptor runs before
// validation, so a hostile client could send a huge one.
const maxFieldLen = 160

func requestFields(req any) logging.Fields {
	var f logging.Fields
	if r, ok := req.(interface{ GetRunId() string }); ok && r.GetRunId() != "" {
		f = append(f, FieldRunID, truncate(r.GetRunId()))
	}
	if r, ok := req.(interface{ GetWorkerId() string }); ok && r.GetWorkerId() != "" {
		f = append(f, FieldWorkerID, truncate(r.GetWorkerId()))
	}
	return f
}

func truncate(s string) string {
	if len(s) <= maxFieldLen {
		return s
	}
	return s[:maxFieldLen] + "..."
}
