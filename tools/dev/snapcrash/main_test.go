package main

import (
	"bytes"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
	"github.com/snapcoord/snapcoord/client"
	"github.com/snapcoord/snapcoord/internal/testkit/coordproc"
	"github.com/snapcoord/snapcoord/internal/testkit/etcdtest"
)

var snapcoordBin string

// TestMain builds the coordinator the loop kills.
func TestMain(m *testing.M) {
	os.Exit(coordproc.Main(m, &snapcoordBin))
}

func shortLoop(inject bool) config {
	return config{snapcoord: snapcoordBin, cycles: 2, runs: 1, ranks: 2, envs: 2,
		minUp: 100 * time.Millisecond, maxUp: 400 * time.Millisecond, seed: 1, resumeTimeout: 30 * time.Second, injectLoss: inject}
}

// Two kills lose nothing, and the report says so.
func TestCrashLoopPasses(t *testing.T) {
	var out bytes.Buffer
	ok, err := crashLoop(t.Context(), shortLoop(false), &out)
	if err != nil || !ok {
		t.Fatalf("crashLoop = %v, %v; want a pass:\n%s", ok, err, &out)
	}
	for _, want := range []string{"cycles:               2", "writes lost:          0", "bbolt checks failed:  0 of 2", "PASS"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, &out)
		}
	}
}

// The verification notices a lost write: one acknowledged snapshot report
// deleted from the file while the coordinator is down is reported, once,
// and fails the loop.
func TestCrashLoopCatchesALostWrite(t *testing.T) {
	var out bytes.Buffer
	ok, err := crashLoop(t.Context(), shortLoop(true), &out)
	if err != nil {
		t.Fatalf("crashLoop: %v\n%s", err, &out)
	}
	if ok {
		t.Fatalf("crashLoop passed with a write deleted from the file:\n%s", &out)
	}
	for _, want := range []string{"writes lost:          1", "was acknowledged but the coordinator has", "FAIL"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, &out)
		}
	}
}

// A read that fails leaves its writes unverified: reported once, apart
// from lost writes, and the loop fails.
func TestFailedReadsAreReportedApart(t *testing.T) {
	var out bytes.Buffer
	s := summary{lost: map[string]bool{}, unread: map[string]bool{}}
	var v verdict
	v.cannotRead("run %s: ListSnapshots: %s", "crash-0", "message too large")
	s.record(&out, v)
	s.record(&out, v) // seen again next cycle: not printed twice
	if ok := report(&out, s); ok {
		t.Errorf("report passed with a failed read:\n%s", &out)
	}
	got := out.String()
	for _, want := range []string{"writes lost:          0", "reads failed:         1", "FAIL"} {
		if !strings.Contains(got, want) {
			t.Errorf("output lacks %q:\n%s", want, got)
		}
	}
	if n := strings.Count(got, "could not read back: run crash-0: ListSnapshots"); n != 1 {
		t.Errorf("the failed read is printed %d times, want once:\n%s", n, got)
	}
}

// A write counts as verified only once the read that checks it succeeded:
// with the coordinator unreachable, nothing is verified, and every write
// is left unverified rather than reported as checked.
func TestNothingReadIsNothingVerified(t *testing.T) {
	addr, err := coordproc.FreePort() // nothing listens there
	if err != nil {
		t.Fatal(err)
	}
	admin, err := client.Dial(addr, client.WithInsecure())
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	log := newAcks()
	log.run("crash-0", 1)
	log.registered("crash-0", "w1", 1)
	log.decision("crash-0", "crash-0/rank-0", &v1.Decision{Step: 1})
	log.checkpointSaved("crash-0", "crash-0/rank-0", 1, 0)
	log.snapshotReported("crash-0", "crash-0/env-0", "snap-1", "w2", v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SAVED)
	v := verify(t.Context(), admin, &runWriters{id: "crash-0", log: log})
	if len(v.unread) == 0 || v.checked != 0 {
		t.Errorf("nothing read back: %d writes counted as verified, failed reads %v; want 0 and a failed read", v.checked, v.unread)
	}
}

// The HA loop on a real etcd cluster: the leader killed once and paused
// past its election TTL once loses nothing, the paused ex-leader refuses
// every write sent to it and stores none, and a failover time is reported
// for each.
func TestHALoopPasses(t *testing.T) {
	etcdtest.Require(t)
	cfg := shortLoop(false)
	cfg.ha, cfg.coordinators, cfg.electionTTL = true, 3, 2*time.Second
	var out bytes.Buffer
	ok, err := haLoop(t.Context(), cfg, &out)
	if err != nil || !ok {
		t.Fatalf("haLoop = %v, %v; want a pass:\n%s", ok, err, &out)
	}
	for _, want := range []string{"cycles:               2", "writes lost:          0",
		"failover after SIGKILL: p50 ", "failover after SIGSTOP: p50 ",
		fmt.Sprintf("deposed leaders:      %d writes sent, 0 acknowledged, 0 stored", probesPerPause+1), "PASS"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, &out)
		}
	}
}

// The gray cycles: the leader frozen 2× its TTL while snapshots are in
// flight, and etcd without quorum for 3 s, lose nothing, the writers go
// on, the frozen ex-leader steps down, and the stalls are reported.
func TestHALoopGrayCycles(t *testing.T) {
	etcdtest.Require(t)
	cfg := shortLoop(false)
	cfg.ha, cfg.coordinators, cfg.electionTTL = true, 3, 2*time.Second
	cfg.haSchedule = []cycleKind{cycleFreeze, cycleQuorum}
	var out bytes.Buffer
	ok, err := haLoop(t.Context(), cfg, &out)
	if err != nil || !ok {
		t.Fatalf("haLoop = %v, %v; want a pass:\n%s", ok, err, &out)
	}
	for _, want := range []string{"cycles:               2", "writes lost:          0", "failover after freeze:  p50 ",
		"writers resumed after freeze:", "writers resumed after quorum loss:", "0 did not step down", "PASS"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, &out)
		}
	}
	t.Log(out.String())
}

// A write a deposed leader acknowledged, or one found stored, fails the HA
// loop even with no acknowledged write lost; so does a leader that never
// stepped down.
func TestHAReportFailsOnFencing(t *testing.T) {
	for name, s := range map[string]haSummary{
		"acknowledged": {probes: 5, probeAcked: []string{"cycle 2: RegisterWorker fenced-2-0"}},
		"stored":       {probes: 5, probeStored: []string{"cycle 2: worker fenced-2-0"}},
		"not deposed":  {probes: 5, notDeposed: 1},
	} {
		var out bytes.Buffer
		s.summary = summary{lost: map[string]bool{}, unread: map[string]bool{}, failovers: true, cycles: 2}
		if ok := haReport(&out, s); ok {
			t.Errorf("%s: report passed:\n%s", name, &out)
		}
		if got := out.String(); !strings.Contains(got, "writes lost:          0") || !strings.HasSuffix(got, "FAIL\n") {
			t.Errorf("%s: want 0 lost and FAIL at the end:\n%s", name, got)
		}
	}
}
