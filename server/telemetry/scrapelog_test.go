package telemetry

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"syscall"
	"testing"
)

// brokenWriter is a response whose connection fails every write with err.
type brokenWriter struct {
	header http.Header
	err    error
}

func (w *brokenWriter) Header() http.Header       { return w.header }
func (w *brokenWriter) WriteHeader(int)           {}
func (w *brokenWriter) Write([]byte) (int, error) { return 0, w.err }

// A scraper that hangs up early (curl /metrics | head) is no warning; any
// other failure to write a scrape still is.
func TestScrapeClosedEarlyIsNotAWarning(t *testing.T) {
	for _, tc := range []struct {
		name     string
		err      error
		wantWarn bool
	}{
		{"broken pipe", &net.OpError{Op: "write", Net: "tcp", Err: os.NewSyscallError("write", syscall.EPIPE)}, false},
		{"reset by peer", &net.OpError{Op: "write", Net: "tcp", Err: os.NewSyscallError("write", syscall.ECONNRESET)}, false},
		{"another error", errors.New("disk on fire"), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var logs bytes.Buffer
			tel, err := New(t.Context(), Options{
				Logger:    slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
				LookupEnv: func(string) (string, bool) { return "", false },
			})
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = tel.Shutdown(context.Background()) }()
			tel.Handler(false).ServeHTTP(&brokenWriter{header: http.Header{}, err: tc.err},
				httptest.NewRequest(http.MethodGet, "/metrics", nil))
			out := logs.String()
			if !strings.Contains(out, "metrics scrape") {
				t.Fatalf("the failed write was not logged at all:\n%s", out)
			}
			if got := strings.Contains(out, "level=WARN"); got != tc.wantWarn {
				t.Errorf("logged at warn: %v, want %v:\n%s", got, tc.wantWarn, out)
			}
		})
	}
}

// A checkpoint saved by every rank lands in the checkpoint histogram.
func TestCheckpointDurationHistogram(t *testing.T) {
	tel := newTelemetry(t, nil)
	tel.CheckpointSaved(t.Context(), "r", 3, 4.5)
	tel.CheckpointSaved(t.Context(), "r", 6, 90)
	fams := scrape(t, tel.Handler(false))
	h := fams["snapcoord_checkpoint_duration_seconds"].GetMetric()
	if len(h) != 1 || h[0].GetHistogram().GetSampleCount() != 2 || h[0].GetHistogram().GetSampleSum() != 94.5 {
		t.Fatalf("snapcoord_checkpoint_duration_seconds = %v, want 2 samples summing to 94.5", h)
	}
}
