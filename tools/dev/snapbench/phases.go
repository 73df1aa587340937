package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"

	storagev1 "github.com/snapcoord/snapcoord/api/snapcoord/storage/v1"
	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
	"github.com/snapcoord/snapcoord/internal/testkit/coordproc"
)

// coord is a coordinator child process with its metrics address (for
// profiles) when --pprof is on.
type coord struct {
	*coordproc.Proc
	metrics  string
	profiles sync.WaitGroup
}

// startCoord starts snapcoord on a fresh data directory named for the
// phase. Leases are long: registering thousands of workers takes longer
// than the default 15 s lease, and lease expiry is not what is measured.
func (b *bench) startCoord(ctx context.Context, name string, extra ...string) (*coord, error) {
	dir := filepath.Join(b.tmp, name)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	c := &coord{}
	args := []string{"--lease-ttl", "10m"}
	if b.cfg.pprofDir != "" {
		addr, err := coordproc.FreePort()
		if err != nil {
			return nil, err
		}
		c.metrics = addr
		args = append(args, "--metrics-listen", addr, "--pprof")
	} else {
		args = append(args, "--metrics-listen", "")
	}
	args = append(append(args, extra...), b.cfg.serveArgs...)
	// Ready once it serves RunService: at once on bbolt, once elected on
	// etcd.
	p, err := coordproc.Start(ctx, coordproc.Config{
		Bin: b.cfg.snapcoord, DataDir: filepath.Join(dir, "data"), LogPath: filepath.Join(dir, "snapcoord.log"), Args: args,
		HealthService: v1.RunService_ServiceDesc.ServiceName,
	})
	if err != nil {
		return nil, err
	}
	c.Proc = p
	return c, nil
}

func (c *coord) stop() {
	c.profiles.Wait()
	_ = c.Stop(15 * time.Second)
}

// startFloor starts the no-op floor server (this binary, re-executed).
func (b *bench) startFloor(ctx context.Context, name string) (*coordproc.Proc, error) {
	return coordproc.Start(ctx, coordproc.Config{
		Bin: b.self, Command: floorServerCmd, LogPath: filepath.Join(b.tmp, name+"-floor.log"),
	})
}

// profileHook fetches a CPU profile of the coordinator over the window,
// when --pprof is on.
func (b *bench) profileHook(c *coord, name string, d time.Duration) func() {
	if c.metrics == "" {
		return func() {}
	}
	return func() {
		c.profiles.Go(func() {
			url := fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", c.metrics, max(1, int(d.Seconds())))
			path := filepath.Join(b.cfg.pprofDir, name+".cpu.pprof")
			if err := fetch(url, path); err != nil {
				b.logf("  profile %s: %v", name, err)
				return
			}
			b.logf("  profile: %s", path)
		})
	}
}

// heapHook saves the coordinator's heap profile and metrics, when --pprof
// is on: what the connected workers cost, by allocation site.
func (b *bench) heapHook(c *coord, name string) func() {
	if c.metrics == "" {
		return nil
	}
	return func() {
		for _, f := range []struct{ url, file string }{
			{"/debug/pprof/heap?gc=1", name + ".heap.pprof"}, // live objects only
			{"/debug/pprof/goroutine", name + ".goroutine.pprof"},
			{"/metrics", name + ".metrics.txt"},
		} {
			path := filepath.Join(b.cfg.pprofDir, f.file)
			if err := fetch("http://"+c.metrics+f.url, path); err != nil {
				b.logf("  %s: %v", f.url, err)
				continue
			}
			b.logf("  profile: %s", path)
		}
	}
}

func fetch(url, path string) error {
	resp, err := http.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	_, err = io.Copy(f, resp.Body)
	return errors.Join(err, f.Close())
}

// farBudget is a deadline the runs never reach: the rule is evaluated at
// every step, and says CONTINUE.
const farBudget = "30:00:00:00"

func runSpec(world int32, level v1.TargetLevel) *v1.RunSpec {
	return &v1.RunSpec{
		TrainerWorldSize: world,
		Checkpointing:    &v1.CheckpointingSpec{CheckpointMustSaveBy: farBudget},
		RolloutRecovery:  &v1.RolloutRecoverySpec{TargetLevel: level},
	}
}

func createRun(ctx context.Context, addr, id string, spec *v1.RunSpec) (string, error) {
	c, err := dial(addr)
	if err != nil {
		return "", err
	}
	defer c.close()
	resp, err := c.runs.CreateRun(ctx, &v1.CreateRunRequest{RunId: id, Spec: spec})
	if err != nil {
		return "", fmt.Errorf("CreateRun %s: %w", id, err)
	}
	return resp.RunToken, nil
}

func dialN(addr string, n int) ([]*conn, error) {
	cs := make([]*conn, n)
	for i := range cs {
		c, err := dial(addr)
		if err != nil {
			closeConns(cs)
			return nil, err
		}
		cs[i] = c
	}
	return cs, nil
}

func closeConns(cs []*conn) {
	for _, c := range cs {
		if c != nil {
			c.close()
		}
	}
}

func (b *bench) window() window { return window{warmup: b.cfg.warmup, dur: b.cfg.duration} }

// steps: CompleteStep back to back from runs × ranks trainer ranks, each
// with its own connection, against the same load on the no-op floor. The
// first rank to ask about a step makes the decision (a durable write of
// the step, an event and the run); the others get the stored decision.
func (b *bench) steps(ctx context.Context) error {
	n := b.cfg.stepRuns * b.cfg.stepRanks

	fcpu := &cpuWindow{}
	floorRes, err := b.floorLoop(ctx, "steps", n, fcpu, func(c *conn, ctx context.Context, k int64) error {
		_, err := c.workers.CompleteStep(ctx, &v1.CompleteStepRequest{RunId: "floor", WorkerId: "w", Step: k + 1, IterationSeconds: 10})
		return err
	})
	if err != nil {
		return err
	}

	res, cpu, _, err := b.stepLoop(ctx, "steps")
	if err != nil {
		return err
	}
	ok := ratio(res.rate(), floorRes.rate()) >= 0.6
	b.add(row{
		ID: "complete_step", Figure: fmt.Sprintf("CompleteStep, %d ranks (%d runs × %d)", n, b.cfg.stepRuns, b.cfg.stepRanks),
		Value: res.rate(), Unit: "/s", Lat: latOf(summarize(res.lats)),
		Floor: floorRes.rate(), FloorWhat: "no-op gRPC", FloorLat: latOf(summarize(floorRes.lats)),
		Target: "≥ 0.6 × floor", Met: met(ok),
		Note: fmt.Sprintf("%d new durable decisions/s (one per run and step; the other ranks get the stored one); coordinator CPU %.0f µs a call (floor %.0f µs)",
			int(res.rate())/b.cfg.stepRanks, cpu.perCall(res), fcpu.perCall(floorRes)),
	})
	return nil
}

// stepLoop starts a coordinator (with extra flags) and has runs × ranks
// trainer ranks call CompleteStep back to back for one window. It returns
// the coordinator's CPU time over the window and one decision it gave.
func (b *bench) stepLoop(ctx context.Context, name string, extra ...string) (loopResult, *cpuWindow, *v1.Decision, error) {
	n := b.cfg.stepRuns * b.cfg.stepRanks
	w := b.window()
	c, err := b.startCoord(ctx, name, extra...)
	if err != nil {
		return loopResult{}, nil, nil, err
	}
	defer c.stop()
	var ranks []*worker
	defer func() { closeWorkers(ranks) }()
	for r := range b.cfg.stepRuns {
		id := fmt.Sprintf("steps-%d", r)
		token, err := createRun(ctx, c.Addr, id, runSpec(int32(b.cfg.stepRanks), v1.TargetLevel_TARGET_LEVEL_SIBLING))
		if err != nil {
			return loopResult{}, nil, nil, err
		}
		ws, err := registerWorkers(ctx, c.Addr, id, token, v1.WorkerRole_WORKER_ROLE_TRAINER, b.cfg.stepRanks,
			func(i int) string { return "rank-" + strconv.Itoa(i) })
		if err != nil {
			return loopResult{}, nil, nil, err
		}
		ranks = append(ranks, ws...)
	}
	cpu := &cpuWindow{pid: c.Pid()}
	res, err := closedLoop(ctx, n, w, cpu.hooks(b.profileHook(c, name, w.dur)), func(_ context.Context, i int, k int64) error {
		wk := ranks[i]
		_, err := wk.c.workers.CompleteStep(wk.ctx, &v1.CompleteStepRequest{RunId: wk.runID, WorkerId: wk.id, Step: k + 1, IterationSeconds: 10})
		return err
	})
	if err != nil {
		return loopResult{}, nil, nil, err
	}
	// Step 1 was decided in the window: asked again, it is the stored one.
	wk := ranks[0]
	resp, err := wk.c.workers.CompleteStep(wk.ctx, &v1.CompleteStepRequest{RunId: wk.runID, WorkerId: wk.id, Step: 1, IterationSeconds: 10})
	if err != nil {
		return loopResult{}, nil, nil, err
	}
	return res, cpu, resp.Decision, nil
}

// floorLoop runs op back to back from n connections to a fresh floor
// server for one window, reading the floor's CPU time into cpu if not nil.
func (b *bench) floorLoop(ctx context.Context, name string, n int, cpu *cpuWindow, op func(c *conn, ctx context.Context, k int64) error) (loopResult, error) {
	fl, err := b.startFloor(ctx, name)
	if err != nil {
		return loopResult{}, err
	}
	defer fl.Stop(10 * time.Second)
	conns, err := dialN(fl.Addr, n)
	if err != nil {
		return loopResult{}, err
	}
	defer closeConns(conns)
	var h *hooks
	if cpu != nil {
		cpu.pid = fl.Pid()
		h = cpu.hooks(nil)
	}
	tctx := withToken(context.Background(), "floor-token")
	return closedLoop(ctx, n, b.window(), h, func(_ context.Context, i int, k int64) error {
		return op(conns[i], tctx, k)
	})
}

// reports: each of n trainer ranks of one run reports SAVED for steps 1,
// 2, 3, ... back to back: every report is a new durable write (the step
// record with one more saved rank; the last rank also publishes the
// checkpoint). The floor is raw bbolt on the same disk writing values of
// the step record's size.
func (b *bench) reports(ctx context.Context) error {
	w := b.window()
	top := 0
	for _, n := range b.cfg.reportWorkers {
		top = max(top, n)
	}
	for _, n := range b.cfg.reportWorkers {
		res, err := b.reportLoop(ctx, fmt.Sprintf("reports-%d", n), n, n == top)
		if err != nil {
			return err
		}
		size := stepRecordSize(n)
		path := filepath.Join(b.tmp, "bolt-floor.db")
		upd, err := boltFloor(ctx, path, n, size, false, w)
		if err != nil {
			return err
		}
		bat, err := boltFloor(ctx, path, n, size, true, w)
		if err != nil {
			return err
		}
		r := row{
			ID: fmt.Sprintf("reports_%d", n), Figure: fmt.Sprintf("durable reports, %d workers", n),
			Value: res.rate(), Unit: "/s", Lat: latOf(summarize(res.lats)),
			Floor: bat.rate(), FloorWhat: "bbolt Batch", FloorLat: latOf(summarize(bat.lats)),
			Note: fmt.Sprintf("%d-byte values; one bbolt Update per write: %.0f/s, p99 %s ms (ratio %.2f)",
				size, upd.rate(), fmtMS(latOf(summarize(upd.lats)).P99), ratio(res.rate(), upd.rate())),
		}
		if n == top {
			// The gRPC bound: the same reports answered at once, from
			// memory, by the no-op server, with nothing written.
			grpcFloor, err := b.floorLoop(ctx, "reports", n, nil, func(c *conn, ctx context.Context, k int64) error {
				_, err := c.workers.ReportCheckpoint(ctx, &v1.ReportCheckpointRequest{RunId: "floor", WorkerId: "w", Step: k + 1,
					Phase: v1.CheckpointPhase_CHECKPOINT_PHASE_SAVED, SaveSeconds: 1})
				return err
			})
			if err != nil {
				return err
			}
			r.Note += fmt.Sprintf("; no-op gRPC, nothing written: %.0f/s, p99 %s ms (ratio %.2f)",
				grpcFloor.rate(), fmtMS(latOf(summarize(grpcFloor.lats)).P99), ratio(res.rate(), grpcFloor.rate()))
		}
		if n == 256 {
			l := summarize(res.lats)
			r.Target, r.Met = "≥ 0.5 × floor, p99 ≤ 50 ms", met(ratio(res.rate(), bat.rate()) >= 0.5 && l.P99 <= 50*time.Millisecond)
		}
		b.add(r)
	}
	return nil
}

// reportLoop starts a coordinator named name (with extra flags) and has
// n ranks of one run report SAVED for steps 1, 2, 3 ... for one window.
func (b *bench) reportLoop(ctx context.Context, name string, n int, profile bool, extra ...string) (loopResult, error) {
	c, err := b.startCoord(ctx, name, extra...)
	if err != nil {
		return loopResult{}, err
	}
	defer c.stop()
	token, err := createRun(ctx, c.Addr, "reports", runSpec(int32(n), v1.TargetLevel_TARGET_LEVEL_SIBLING))
	if err != nil {
		return loopResult{}, err
	}
	ranks, err := registerWorkers(ctx, c.Addr, "reports", token, v1.WorkerRole_WORKER_ROLE_TRAINER, n,
		func(i int) string { return "rank-" + strconv.Itoa(i) })
	if err != nil {
		return loopResult{}, err
	}
	defer closeWorkers(ranks)
	h := &hooks{}
	if profile {
		h.begin = b.profileHook(c, name, b.cfg.duration)
	}
	return closedLoop(ctx, n, b.window(), h, func(_ context.Context, i int, k int64) error {
		wk := ranks[i]
		_, err := wk.c.workers.ReportCheckpoint(wk.ctx, &v1.ReportCheckpointRequest{
			RunId: wk.runID, WorkerId: wk.id, Step: k + 1, Phase: v1.CheckpointPhase_CHECKPOINT_PHASE_SAVED, SaveSeconds: 1,
		})
		return err
	})
}

// stepRecordSize is the average stored size of a step record while n
// ranks report it (key included): the size of the floor's writes.
func stepRecordSize(n int) int {
	rec := &storagev1.StepRecord{Step: 100000, MaxSaveSeconds: 1}
	for r := range (n + 1) / 2 {
		rec.SavedRanks = append(rec.SavedRanks, int32(r))
	}
	return proto.Size(rec) + len("reports") + 1 + 8
}

// heartbeats: n workers heartbeat back to back; the coordinator's CPU time
// is read from /proc over the window.
func (b *bench) heartbeats(ctx context.Context) error {
	n := b.cfg.heartbeatWorkers
	w := b.window()

	fl, err := b.startFloor(ctx, "heartbeats")
	if err != nil {
		return err
	}
	fconns, err := dialN(fl.Addr, n)
	if err != nil {
		fl.Stop(10 * time.Second)
		return err
	}
	fcpu := &cpuWindow{pid: fl.Pid()}
	tctx := withToken(context.Background(), "floor-token")
	floorRes, err := closedLoop(ctx, n, w, fcpu.hooks(nil), func(_ context.Context, i int, _ int64) error {
		_, err := fconns[i].workers.Heartbeat(tctx, &v1.HeartbeatRequest{RunId: "floor", WorkerId: "w"})
		return err
	})
	closeConns(fconns)
	_ = fl.Stop(10 * time.Second)
	if err != nil {
		return err
	}

	c, err := b.startCoord(ctx, "heartbeats")
	if err != nil {
		return err
	}
	defer c.stop()
	token, err := createRun(ctx, c.Addr, "heartbeats", runSpec(1, v1.TargetLevel_TARGET_LEVEL_TURN))
	if err != nil {
		return err
	}
	ws, err := registerWorkers(ctx, c.Addr, "heartbeats", token, v1.WorkerRole_WORKER_ROLE_ENVIRONMENT, n,
		func(i int) string { return "env-" + strconv.Itoa(i) })
	if err != nil {
		return err
	}
	defer closeWorkers(ws)
	cpu := &cpuWindow{pid: c.Pid()}
	res, err := closedLoop(ctx, n, w, cpu.hooks(b.profileHook(c, "heartbeats", w.dur)), func(_ context.Context, i int, _ int64) error {
		wk := ws[i]
		_, err := wk.c.workers.Heartbeat(wk.ctx, &v1.HeartbeatRequest{RunId: wk.runID, WorkerId: wk.id})
		return err
	})
	if err != nil {
		return err
	}
	b.add(row{
		ID: "heartbeats", Figure: fmt.Sprintf("heartbeats, %d workers", n),
		Value: res.rate(), Unit: "/s", Lat: latOf(summarize(res.lats)),
		Floor: floorRes.rate(), FloorWhat: "no-op gRPC", FloorLat: latOf(summarize(floorRes.lats)),
	})
	b.add(row{
		ID: "heartbeat_cpu", Figure: "coordinator CPU per 1,000 heartbeats",
		// µs a call ÷ 1,000 is seconds per 1,000 calls.
		Value: cpu.perCall(res) / 1000, Unit: "s", Floor: fcpu.perCall(floorRes) / 1000, FloorWhat: "no-op gRPC",
		Note: fmt.Sprintf("%.2f of %d cores busy in the coordinator at %.0f heartbeats/s; 10,000 workers at the default 5 s interval send 2,000/s",
			cpu.used.Seconds()/w.dur.Seconds(), cores(), res.rate()),
	})
	return nil
}

// cpuWindow reads a process's CPU time at the window's edges.
type cpuWindow struct {
	pid        int
	start      time.Duration
	used       time.Duration
	startError error
}

// perCall is the CPU time used per operation of r, in microseconds.
func (c *cpuWindow) perCall(r loopResult) float64 {
	if r.ops == 0 {
		return 0
	}
	return float64(c.used.Microseconds()) / float64(r.ops)
}

func (c *cpuWindow) hooks(also func()) *hooks {
	return &hooks{
		begin: func() {
			c.start, c.startError = coordproc.ProcessCPU(c.pid)
			if also != nil {
				also()
			}
		},
		end: func() {
			if end, err := coordproc.ProcessCPU(c.pid); err == nil && c.startError == nil {
				c.used = end - c.start
			}
		},
	}
}
