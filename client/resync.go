package client

import (
	"hash/maphash"

	"google.golang.org/protobuf/proto"
)

// seenLog remembers what a reader of a log (commands, events) delivered,
// by seq, so that it can read the log again from the start without acting
// twice on anything.
//
// A coordinator answers OUT_OF_RANGE to a cursor past the end of its log:
// the reader saw a log the coordinator no longer has, its state having
// been restored from a backup or replaced. The reader then reads it again
// from 0, and an entry it delivered before is skipped when it is the same
// entry at the same seq, to the byte (a restored log is an older copy of
// the one read: same seqs, same entries, issued_at included). Anything
// else is new to the reader and delivered: the entries issued since the
// restore (a SaveAtDeadline among them), which reuse the seqs of entries
// the lost part of the log held, and all of a replaced log, which the
// reader never saw. Comparing content rather than seqs or times is what
// tells the two apart: a seq is reused, and the new coordinator's clock
// may lag the old one's. It costs a small hash per delivered entry for
// the reader's lifetime. Not safe for concurrent use: each reader has one
// goroutine that delivers.
type seenLog struct {
	seed maphash.Seed
	sums map[int64]uint64
}

func newSeenLog() *seenLog { return &seenLog{seed: maphash.MakeSeed(), sums: map[int64]uint64{}} }

func (s *seenLog) sum(m proto.Message) uint64 {
	b, _ := proto.MarshalOptions{Deterministic: true}.Marshal(m)
	return maphash.Bytes(s.seed, b)
}

// add records m, delivered at seq.
func (s *seenLog) add(seq int64, m proto.Message) {
	s.sums[seq] = s.sum(m)
}

// has reports whether m, at seq, was delivered before.
func (s *seenLog) has(seq int64, m proto.Message) bool {
	got, ok := s.sums[seq]
	return ok && got == s.sum(m)
}
