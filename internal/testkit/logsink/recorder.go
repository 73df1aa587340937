package logsink

import (
	"context"
	"log/slog"
	"sync"
)

// Recorder is a slog.Handler that keeps every record, for tests that
// assert what a client logged and at which level. Attributes added with
// With are not kept: tests look at levels and messages.
type Recorder struct {
	mu      sync.Mutex
	records []slog.Record
}

// Logger is a logger that records into r.
func (r *Recorder) Logger() *slog.Logger { return slog.New(r) }

func (r *Recorder) Enabled(context.Context, slog.Level) bool { return true }
func (r *Recorder) WithAttrs([]slog.Attr) slog.Handler       { return r }
func (r *Recorder) WithGroup(string) slog.Handler            { return r }

func (r *Recorder) Handle(_ context.Context, rec slog.Record) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.records = append(r.records, rec.Clone())
	return nil
}

// At lists the messages logged at level, in order.
func (r *Recorder) At(level slog.Level) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var msgs []string
	for _, rec := range r.records {
		if rec.Level == level {
			msgs = append(msgs, rec.Message)
		}
	}
	return msgs
}
