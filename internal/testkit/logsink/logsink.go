// Package logsink collects the log of a server or a child process for
// tests that read it while it is still being written.
package logsink

import (
	"bytes"
	"encoding/json"
	"sync"
)

// Buffer is an io.Writer that may be written and read concurrently.
type Buffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// String returns everything written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// Watcher is a Buffer for a coordinator's JSON log that also reports the
// address of its "serving" line: the coordinator's own word that it is
// listening, and where; and, on request, the next line with a given
// message, so that a test waits for what the coordinator says it did
// instead of polling for its effect.
type Watcher struct {
	Buffer
	mu      sync.Mutex
	partial []byte
	serving chan string
	sent    bool
	waiters []waiter
}

// waiter is a Next call not answered yet.
type waiter struct {
	msg, what string
	done      chan struct{}
}

// NewWatcher returns an empty Watcher.
func NewWatcher() *Watcher { return &Watcher{serving: make(chan string, 1)} }

// Serving receives the address of the first "serving" line, once.
func (w *Watcher) Serving() <-chan string { return w.serving }

// Next returns a channel closed once a line with message msg (and, if what
// is not empty, a "what" attribute equal to it) is written after this call.
func (w *Watcher) Next(msg, what string) <-chan struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	done := make(chan struct{})
	w.waiters = append(w.waiters, waiter{msg: msg, what: what, done: done})
	return done
}

func (w *Watcher) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	_, _ = w.Buffer.Write(p)
	w.partial = append(w.partial, p...)
	for {
		line, rest, ok := bytes.Cut(w.partial, []byte("\n"))
		if !ok {
			return len(p), nil
		}
		w.partial = rest
		var rec struct{ Msg, Addr, What string }
		if json.Unmarshal(line, &rec) != nil {
			continue
		}
		if !w.sent && rec.Msg == "serving" {
			w.sent = true
			w.serving <- rec.Addr
		}
		w.answer(rec.Msg, rec.What)
	}
}

// answer closes and drops the waiters that the line (msg, what) matches.
func (w *Watcher) answer(msg, what string) {
	left := w.waiters[:0]
	for _, wt := range w.waiters {
		if wt.msg == msg && (wt.what == "" || wt.what == what) {
			close(wt.done)
			continue
		}
		left = append(left, wt)
	}
	w.waiters = left
}
