package engine

import (
	"errors"
	"strings"
	"testing"
)

// Each list takes back the tokens it gave and refuses any other, naming
// page_token and itself: a token from another list, garbage, or one with a
// key of the right list altered.
func TestPageTokens(t *testing.T) {
	k := workerKey{role: 2, rank: 0, name: "env-7"}
	if got, err := decodeWorkerToken(encodeWorkerToken(k)); err != nil || *got != k {
		t.Errorf("worker token: got %v, %v; want %v", got, err, k)
	}
	if n, err := decodeSnapshotToken(encodePageToken(snapshotID(12))); err != nil || n != 12 {
		t.Errorf("snapshot token: got %d, %v; want 12", n, err)
	}
	if id, err := decodePageToken(encodePageToken("run-a"), "ListRuns", validRunID); err != nil || id != "run-a" {
		t.Errorf("run token: got %q, %v; want run-a", id, err)
	}
	refused := []struct {
		list   string
		decode func(string) error
		tok    string
	}{
		{"ListRuns", func(tok string) error { _, err := decodePageToken(tok, "ListRuns", validRunID); return err }, encodePageToken("Not A Run")},
		{"ListRuns", func(tok string) error { _, err := decodePageToken(tok, "ListRuns", validRunID); return err }, "!!"},
		{"ListWorkers", func(tok string) error { _, err := decodeWorkerToken(tok); return err }, encodePageToken(snapshotID(1))},
		{"ListWorkers", func(tok string) error { _, err := decodeWorkerToken(tok); return err }, encodePageToken("2 0 a b")},
		{"ListSnapshots", func(tok string) error { _, err := decodeSnapshotToken(tok); return err }, encodePageToken("run-a")},
		{"ListSnapshots", func(tok string) error { _, err := decodeSnapshotToken(tok); return err }, encodePageToken("snap-01")},
	}
	for _, c := range refused {
		err := c.decode(c.tok)
		if !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), "page_token") || !strings.Contains(err.Error(), c.list) {
			t.Errorf("%s token %q: got %v, want INVALID_ARGUMENT naming page_token and %s", c.list, c.tok, err, c.list)
		}
	}
}
