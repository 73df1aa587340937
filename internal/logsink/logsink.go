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
// listening, and where.
type Watcher struct {
	Buffer
	mu      sync.Mutex
	partial []byte
	serving chan string
	sent    bool
}

// NewWatcher returns an empty Watcher.
func NewWatcher() *Watcher { return &Watcher{serving: make(chan string, 1)} }

// Serving receives the address of the first "serving" line, once.
func (w *Watcher) Serving() <-chan string { return w.serving }

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
		var rec struct{ Msg, Addr string }
		if !w.sent && json.Unmarshal(line, &rec) == nil && rec.Msg == "serving" {
			w.sent = true
			w.serving <- rec.Addr
		}
	}
}
