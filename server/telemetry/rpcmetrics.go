package telemetry

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/semconv/v1.43.0/rpcconv"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/stats"
	"google.golang.org/grpc/status"
)

// rpcMetrics is the stats handler when no span leaves the process: it
// records otelgrpc's one metric, rpc.server.call.duration, with the same
// name, buckets and attributes, but from an attribute set built once per
// method and code. otelgrpc starts a (no-op) span, reads the propagation
// headers and builds a new attribute set for every call: 5-6 % of the
// coordinator's CPU in a deadline storm (docs/performance.md).
type rpcMetrics struct {
	duration metric.Float64Histogram
	// sets holds an attribute set per (method, code), built on first use,
	// up to maxSets of them: the method name is the client's, so one that
	// calls made-up methods must not grow it without end. Past the cap a
	// set is built per call, as otelgrpc does.
	sets  sync.Map
	nsets atomic.Int64
}

// maxSets is far above the API's methods times the codes they answer.
const maxSets = 1024

type methodKey struct{}

type setKey struct {
	method string
	code   codes.Code
}

func newRPCMetrics(meter metric.Meter) (*rpcMetrics, error) {
	// otelgrpc's buckets, so dashboards read the same series either way.
	d, err := rpcconv.NewServerCallDuration(meter, metric.WithExplicitBucketBoundaries(
		0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10))
	if err != nil {
		return nil, err
	}
	return &rpcMetrics{duration: d.Inst()}, nil
}

func (h *rpcMetrics) TagRPC(ctx context.Context, info *stats.RPCTagInfo) context.Context {
	return context.WithValue(ctx, methodKey{}, info.FullMethodName)
}

func (h *rpcMetrics) HandleRPC(ctx context.Context, s stats.RPCStats) {
	end, ok := s.(*stats.End)
	if !ok || end.Client {
		return
	}
	method, _ := ctx.Value(methodKey{}).(string)
	set := h.set(setKey{method: method, code: status.Code(end.Error)})
	h.duration.Record(ctx, end.EndTime.Sub(end.BeginTime).Seconds(), metric.WithAttributeSet(set))
}

func (h *rpcMetrics) set(k setKey) attribute.Set {
	if s, ok := h.sets.Load(k); ok {
		return s.(attribute.Set)
	}
	kv := []attribute.KeyValue{semconv.RPCMethod(strings.TrimPrefix(k.method, "/")), semconv.RPCSystemNameGRPC, semconv.RPCResponseStatusCode(canonicalCode(k.code))}
	if serverError(k.code) {
		kv = append(kv, semconv.ErrorTypeKey.String(canonicalCode(k.code)))
	}
	set := attribute.NewSet(kv...)
	if h.nsets.Load() >= maxSets {
		return set
	}
	if _, loaded := h.sets.LoadOrStore(k, set); !loaded {
		h.nsets.Add(1)
	}
	return set
}

func (*rpcMetrics) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context { return ctx }
func (*rpcMetrics) HandleConn(context.Context, stats.ConnStats)                       {}

// serverError is the semantic conventions' (and otelgrpc's) list of codes
// that are the server's failure, which carry error.type.
func serverError(c codes.Code) bool {
	switch c {
	case codes.Unknown, codes.DeadlineExceeded, codes.Unimplemented, codes.Internal, codes.Unavailable, codes.DataLoss:
		return true
	}
	return false
}

// canonicalCode is a code's name in the gRPC spec (and rpc.response.status_code).
func canonicalCode(c codes.Code) string {
	if int(c) < len(codeNames) {
		return codeNames[c]
	}
	return c.String()
}

var codeNames = [...]string{
	codes.OK: "OK", codes.Canceled: "CANCELLED", codes.Unknown: "UNKNOWN",
	codes.InvalidArgument: "INVALID_ARGUMENT", codes.DeadlineExceeded: "DEADLINE_EXCEEDED",
	codes.NotFound: "NOT_FOUND", codes.AlreadyExists: "ALREADY_EXISTS",
	codes.PermissionDenied: "PERMISSION_DENIED", codes.ResourceExhausted: "RESOURCE_EXHAUSTED",
	codes.FailedPrecondition: "FAILED_PRECONDITION", codes.Aborted: "ABORTED",
	codes.OutOfRange: "OUT_OF_RANGE", codes.Unimplemented: "UNIMPLEMENTED",
	codes.Internal: "INTERNAL", codes.Unavailable: "UNAVAILABLE", codes.DataLoss: "DATA_LOSS",
	codes.Unauthenticated: "UNAUTHENTICATED",
}
