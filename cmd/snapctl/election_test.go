package main

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
	"github.com/snapcoord/snapcoord/client"
	"github.com/snapcoord/snapcoord/internal/testkit/coordproc"
	"github.com/snapcoord/snapcoord/internal/testkit/etcdtest"
	"github.com/snapcoord/snapcoord/internal/testkit/fakefollower"
)

// electionTTL is the coordinators' --election-ttl here: a failover takes
// seconds, and a loaded machine does not depose a healthy leader.
const electionTTL = 3 * time.Second

// haGroup is two coordinators on one prefix of a real 3-member etcd
// cluster, and a server whose address is the list of both.
func haGroup(t *testing.T) (*server, []*coordproc.Proc) {
	t.Helper()
	etcd := etcdtest.Start(t, 3)
	procs := make([]*coordproc.Proc, 2)
	for i := range procs {
		procs[i] = coordproc.ForTest(t, coordproc.Config{Bin: bin.snapcoord,
			LogPath: filepath.Join(t.TempDir(), fmt.Sprintf("snapcoord-%d.log", i)),
			Env:     []string{"SNAPCOORD_ADMIN_TOKEN=" + adminToken},
			Etcd:    coordproc.Etcd{Endpoints: etcd.Endpoints(), Prefix: "/snapctl", ElectionTTL: electionTTL},
			Args:    []string{"--metrics-listen", "", "--log-format", "json", "--lease-ttl", "1m"}})
	}
	return &server{t: t, addr: procs[0].Addr + "," + procs[1].Addr}, procs
}

// A command given every coordinator's address while they elect a leader
// (the leader was killed) waits for the election, saying so on stderr,
// and does its work at the new leader, instead of failing at once with
// advice to add an address the list holds.
func TestCommandWaitsForAnElection(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	s, procs := haGroup(t)
	old, _ := coordproc.LeaderForTest(ctx, t, procs, nil)
	s.turnRun("r1")
	if err := old.Kill(); err != nil {
		t.Fatal(err)
	}
	done := make(chan result, 1)
	go func() { done <- s.snapctl("run", "get", "r1") }()
	_, serving := coordproc.LeaderForTest(ctx, t, procs, old)
	r := <-done
	answered := time.Now()
	if r.code != 0 || !strings.Contains(r.stdout, "r1") {
		t.Fatalf("run get during the election: exit %d\nstdout: %s\nstderr: %s", r.code, r.stdout, r.stderr)
	}
	if want := "snapctl: electing a leader among " + s.addr + ": waiting up to --timeout 30s"; !strings.Contains(r.stderr, want) {
		t.Errorf("stderr %q lacks %q", r.stderr, want)
	}
	if late := answered.Sub(serving); late > electionTTL+time.Second {
		t.Errorf("run get ended %v after the new leader served, want within %v", late, electionTTL+time.Second)
	}
}

// Coordinators that all answer as followers and know no leader (etcd
// lost its quorum) make a command wait until --timeout, then fail naming
// the cause, in words.
func TestCommandGivesUpOnAnElectionAtTimeout(t *testing.T) {
	s := &server{t: t}
	f1 := fakefollower.Start(t, fakefollower.Options{})
	f2 := fakefollower.Start(t, fakefollower.Options{})
	s.addr = f1.Addr() + "," + f2.Addr()
	start := time.Now()
	r := s.wantExit(exitUnavailable, "run", "list", "--timeout", "2s")
	if took := time.Since(start); took < 2*time.Second || took > 2*time.Second+failFastBound {
		t.Errorf("gave up after %v, want --timeout 2s", took)
	}
	for _, want := range []string{
		"electing a leader among " + s.addr,
		"no leader at " + s.addr, "not the leader; no leader is known",
		"still none after --timeout 2s: the coordinators cannot reach etcd",
	} {
		if !strings.Contains(r.stderr, want) {
			t.Errorf("stderr lacks %q:\n%s", want, r.stderr)
		}
	}
	if strings.Contains(r.stderr, "Add ") || strings.Contains(r.stderr, "pickfirst") {
		t.Errorf("stderr advises adding an address, or speaks of the balancer:\n%s", r.stderr)
	}
}

// `run watch` given every address follows the run through a leader
// frozen by SIGSTOP (for 5× the election TTL): its event stream, open on
// the frozen leader, resumes at the next one as soon as it serves, and
// the run's end there is printed within the TTL + 1 s.
func TestRunWatchFollowsThroughAFrozenLeader(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	s, procs := haGroup(t)
	old, _ := coordproc.LeaderForTest(ctx, t, procs, nil)
	s.turnRun("r1")
	watch := startProc(t, s.env(), bin.snapctl, "run", "watch", "r1")
	watch.waitFor(t, "the run's state", func(out string) bool { return strings.Contains(out, "run r1 is ") })
	// The first event (the run's creation) is printed once the stream is open.
	watch.waitFor(t, "the run's first event", func(out string) bool { return strings.Contains(out, "    1  ") })

	if err := old.Pause(); err != nil {
		t.Fatal(err)
	}
	thaw := time.AfterFunc(5*electionTTL, func() { _ = old.Resume() })
	t.Cleanup(func() {
		if thaw.Stop() {
			_ = old.Resume()
		}
	})
	next, _ := coordproc.LeaderForTest(ctx, t, procs, old)
	direct, err := client.Dial(next.Addr, client.WithInsecure(), client.WithToken(adminToken))
	if err != nil {
		t.Fatal(err)
	}
	defer direct.Close()
	if _, err := direct.Runs.CancelRun(ctx, &v1.CancelRunRequest{RunId: "r1", Reason: "test"}); err != nil {
		t.Fatalf("CancelRun at the new leader: %v", err)
	}
	cancelled := time.Now()
	watch.waitFor(t, "the run's end", func(out string) bool { return strings.Contains(out, "run r1 ended CANCELLED") })
	if late := time.Since(cancelled); late > electionTTL+time.Second {
		t.Errorf("run watch printed the run's end %v after it was cancelled, want within %v", late, electionTTL+time.Second)
	}
	if code := watch.exitCode(t); code != exitRunFailed {
		t.Errorf("run watch exited %d, want %d (the run was cancelled)", code, exitRunFailed)
	}
}
