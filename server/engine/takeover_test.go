package engine

import (
	"testing"
	"time"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
)

// A takeover (another coordinator loading the state, as a restart does)
// gives every LIVE worker a fresh lease before any lease timer can fire: a
// worker whose heartbeats sat on a frozen ex-leader for longer than its
// lease is not declared LOST the moment the new leader loads, but has the
// whole restart grace to reach it; one that never does is LOST after it.
func TestTakeoverRenewsEveryLeaseBeforeAnyExpiry(t *testing.T) {
	h := newHarness(t)
	h.create("r", turnSpec(1, "00:01:00:00"))
	ranks := h.trainers("r", 1)
	envs := h.envs("r", 2)
	ttl := h.e.opts.LeaseTTL
	h.close()
	h.clk.Advance(3 * ttl) // the old leader frozen: no heartbeat reached anyone
	h.open()

	grace := h.e.opts.RestartGrace
	h.clk.Advance(grace - time.Millisecond)
	h.settle("r")
	if lost := h.eventsOf("r", v1.RunEventType_RUN_EVENT_TYPE_WORKER_LOST); len(lost) != 0 {
		t.Fatalf("workers declared lost within the grace of a takeover: %v", lost)
	}
	alive := append(ranks, envs[0])
	h.beat("r", alive...) // they reach the new leader in time
	h.advance(ttl, "r", alive...)
	h.settle("r")
	lost := h.eventsOf("r", v1.RunEventType_RUN_EVENT_TYPE_WORKER_LOST)
	if len(lost) != 1 || lost[0].GetWorkerId() != envs[1] {
		t.Fatalf("lost after the grace: %v; want only %s, which never reached the new leader", lost, envs[1])
	}
}
