package telemetry

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"google.golang.org/grpc"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
)

// Without trace export the coordinator records RPC durations itself, and a
// dashboard or alert must not tell: the same calls give the same
// rpc_server_call_duration_seconds series (names, labels, buckets, counts)
// as otelgrpc's handler, which records them when traces are exported.
func TestRPCMetricsAreOtelgrpcs(t *testing.T) {
	ours := newTelemetry(t, nil)
	if _, ok := ours.StatsHandler().(*rpcMetrics); !ok {
		t.Fatalf("without trace export the stats handler is %T, want *rpcMetrics", ours.StatsHandler())
	}
	ref := newTelemetry(t, nil)
	ref.stats = otelgrpc.NewServerHandler(otelgrpc.WithMeterProvider(ref.metrics.provider))

	got, want := rpcSeries(t, ours), rpcSeries(t, ref)
	if len(want) < 4 {
		t.Fatalf("otelgrpc recorded %d series, want one per method and code: %v", len(want), want)
	}
	if !maps.Equal(got, want) {
		t.Errorf("rpc_server_call_duration_seconds:\n ours     %v\n otelgrpc %v", got, want)
	}
}

// rpcSeries makes the same calls through tel's stats handler (OK,
// FAILED_PRECONDITION, UNIMPLEMENTED, a stream) and returns each series of
// rpc_server_call_duration_seconds (its labels and buckets) with its count.
func rpcSeries(t *testing.T, tel *Telemetry) map[string]uint64 {
	t.Helper()
	c, stop := serveWorkers(t, grpc.StatsHandler(tel.StatsHandler()))
	for range 2 {
		if _, err := c.Heartbeat(t.Context(), &v1.HeartbeatRequest{}); err != nil {
			t.Fatal(err)
		}
	}
	_, _ = c.CompleteStep(t.Context(), &v1.CompleteStepRequest{})
	_, _ = c.RegisterWorker(t.Context(), &v1.RegisterWorkerRequest{})
	stream, err := c.StreamCommands(t.Context(), &v1.StreamCommandsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for err == nil {
		_, err = stream.Recv()
	}
	if err != io.EOF {
		t.Fatalf("stream ended with %v", err)
	}
	stop() // every RPC's End is recorded
	series := map[string]uint64{}
	for _, m := range scrape(t, tel.Handler(false))["rpc_server_call_duration_seconds"].GetMetric() {
		series[seriesKey(m)] = m.GetHistogram().GetSampleCount()
	}
	return series
}

func seriesKey(m *dto.Metric) string {
	var labels, buckets []string
	for _, lp := range m.GetLabel() {
		labels = append(labels, lp.GetName()+"="+lp.GetValue())
	}
	for _, b := range m.GetHistogram().GetBucket() {
		buckets = append(buckets, fmt.Sprint(b.GetUpperBound()))
	}
	slices.Sort(labels)
	return strings.Join(labels, ",") + " le{" + strings.Join(buckets, ",") + "}"
}

// A client calling made-up methods cannot grow the cache of attribute sets
// without end; past the cap each such call still gets its series.
func TestRPCMetricsCacheIsBounded(t *testing.T) {
	h, err := newRPCMetrics(newTelemetry(t, nil).metrics.provider.Meter(scope))
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 * maxSets {
		method := fmt.Sprintf("/probe.Service/M%d", i)
		if got := h.set(setKey{method: method}); got.Len() == 0 {
			t.Fatalf("%s: empty attribute set", method)
		}
	}
	n := 0
	h.sets.Range(func(any, any) bool { n++; return true })
	if n > maxSets {
		t.Errorf("%d attribute sets cached, want at most %d", n, maxSets)
	}
}
