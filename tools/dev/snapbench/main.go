// Command snapbench measures a snapcoord coordinator under load and prints
// each figure next to a floor measured in the same run, with their ratio:
//
//  1. CompleteStep decisions/s and latency, against a no-op gRPC service
//     driven by the same client at the same concurrency;
//  2. durable reports/s (ReportCheckpoint, each a new write) at 1, 16 and
//     256 concurrent workers, against raw bbolt writes of the same size (one
//     Update per write, and db.Batch);
//  3. SaveAtDeadline fan-out from the trigger to receipt at N streaming and
//     N polling workers, against the same broadcast by the no-op service;
//  4. heartbeats/s and the coordinator's CPU seconds per 1,000 heartbeats;
//  5. resident memory per connected streaming worker;
//  6. restart time to SERVING with many runs, workers and events stored;
//  7. on etcd (--store etcd, a 3-member cluster on loopback): durable
//     decisions and durable reports, against raw etcd transactions of the
//     same size;
//  8. the deadline storm (--storm alone): many runs with the same B firing
//     within seconds, on bbolt and on etcd, against the same calls to the
//     no-op service.
//
// The coordinator is the real `snapcoord serve` binary in a child process on
// a temporary data directory, with its default flags except a long lease (so
// that registering thousands of workers cannot make early ones lapse) and no
// metrics listener (so that it never collides with a coordinator already on
// 127.0.0.1:7071). The no-op floor is this binary re-executed as a child
// process, so both sides of each ratio cross the same process boundary.
//
// Usage:
//
//	snapbench --snapcoord bin/snapcoord [--json] [--only steps,reports,...] [flags]
//	snapbench --snapcoord bin/snapcoord --storm [--storm-runs 200] [flags]
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == floorServerCmd {
		os.Exit(runFloorServer(os.Args[2:]))
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

type config struct {
	snapcoord string
	dir       string
	keep      bool
	json      bool
	jsonFile  string
	only      map[string]bool
	pprofDir  string
	serveArgs []string

	warmup, duration time.Duration

	stepRuns, stepRanks int
	reportWorkers       []int
	fanoutWorkers       int
	workersPerConn      int
	nodeWorkersPerConn  int
	fanoutTimeout       time.Duration
	heartbeatWorkers    int
	restartRuns         int
	restartWorkers      int
	restartSteps        int
	restartRepeat       int

	stormRuns, stormRanks, stormWorkers    int
	stormRanksPerConn, stormWorkersPerConn int
	stormStep, stormSave                   span
	stormLead, stormMargin, stormTimeout   time.Duration
	stormStores                            []string
}

var phases = []string{"steps", "reports", "fanout", "heartbeats", "restart", "etcd", "storm"}

func parseFlags(args []string, stderr io.Writer) (config, error) {
	var cfg config
	fs := flag.NewFlagSet("snapbench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&cfg.snapcoord, "snapcoord", "bin/snapcoord", "the snapcoord `binary` to measure (make build)")
	fs.StringVar(&cfg.dir, "dir", "", "parent `directory` of the temporary data directories (default: the system temp dir); use a real disk, not tmpfs")
	fs.BoolVar(&cfg.keep, "keep", false, "keep the temporary directory (data, coordinator logs)")
	fs.BoolVar(&cfg.json, "json", false, "print the results as JSON on stdout (the table goes to stderr)")
	fs.StringVar(&cfg.jsonFile, "json-file", "", "also write the JSON results to this `file`")
	only := fs.String("only", strings.Join(phases, ","), "comma-separated phases to run: "+strings.Join(phases, ", ")+" (fanout also measures memory per streaming worker)")
	fs.StringVar(&cfg.pprofDir, "pprof", "", "write CPU profiles of the coordinator during each phase, and of an in-process restart, into this `directory`")
	serveArgs := fs.String("serve-args", "", "extra `flags` for snapcoord serve, space-separated")
	fs.DurationVar(&cfg.warmup, "warmup", time.Second, "warm-up before each throughput window")
	fs.DurationVar(&cfg.duration, "duration", 4*time.Second, "length of each throughput window")
	fs.IntVar(&cfg.stepRuns, "step-runs", 8, "runs driven by CompleteStep")
	fs.IntVar(&cfg.stepRanks, "step-ranks", 8, "trainer ranks per run calling CompleteStep (concurrency = runs × ranks)")
	reports := fs.String("report-workers", "1,16,256", "concurrent workers for the durable-report figure, comma-separated")
	fs.IntVar(&cfg.fanoutWorkers, "fanout-workers", 10000, "streaming workers, and polling workers, receiving SaveAtDeadline, one connection each")
	fs.IntVar(&cfg.workersPerConn, "workers-per-conn", 1, "fan-out workers sharing one connection (1: a connection each, as separate processes have)")
	fs.IntVar(&cfg.nodeWorkersPerConn, "node-workers-per-conn", 100, "then the streaming fan-out again with this many workers sharing a connection, as workers hosted by one process on a node do (0: skip)")
	fs.DurationVar(&cfg.fanoutTimeout, "fanout-timeout", 30*time.Second, "how long after the trigger a command still counts as delivered")
	fs.IntVar(&cfg.heartbeatWorkers, "heartbeat-workers", 64, "workers heartbeating back to back")
	fs.IntVar(&cfg.restartRuns, "restart-runs", 1000, "runs in the data directory for the restart figure")
	fs.IntVar(&cfg.restartWorkers, "restart-workers", 100, "workers per run for the restart figure")
	fs.IntVar(&cfg.restartSteps, "restart-steps", 10, "completed steps per run for the restart figure")
	fs.IntVar(&cfg.restartRepeat, "restart-repeat", 3, "restarts measured (the median is reported)")
	storm := fs.Bool("storm", false, "run the deadline storm alone (--only storm)")
	fs.IntVar(&cfg.stormRuns, "storm-runs", 200, "storm: runs, all with the same B")
	fs.IntVar(&cfg.stormRanks, "storm-ranks", 8, "storm: trainer ranks per run, through the Go client")
	fs.IntVar(&cfg.stormWorkers, "storm-workers", 50, "storm: environment workers per run, streaming")
	fs.IntVar(&cfg.stormRanksPerConn, "storm-ranks-per-conn", 8, "storm: ranks sharing a client and its connection (the ranks of one node)")
	fs.IntVar(&cfg.stormWorkersPerConn, "storm-workers-per-conn", 10, "storm: environment workers sharing a connection (a node's sidecar)")
	step := fs.String("storm-step", "500ms-2s", "storm: each run's step time is drawn from this `range`; each rank's step ends up to a tenth of it later")
	save := fs.String("storm-save", "100ms-1s", "storm: each rank's checkpoint and each worker's snapshot takes a time drawn from this `range`")
	fs.DurationVar(&cfg.stormLead, "storm-lead", 15*time.Second, "storm: B is set this far ahead once every rank and worker registered")
	fs.DurationVar(&cfg.stormMargin, "storm-margin", 5*time.Second, "storm: each run's margin M, the slack its deadline save has before B")
	fs.DurationVar(&cfg.stormTimeout, "storm-timeout", time.Minute, "storm: how long after B every run must have stopped")
	stores := fs.String("storm-stores", "bbolt,etcd", "storm: the coordinator's stores to run it on, comma-separated: bbolt, etcd")
	if err := fs.Parse(args); err != nil {
		return cfg, err
	}
	if *storm {
		*only = "storm"
	}
	if err := cfg.parseStorm(*step, *save, *stores); err != nil {
		return cfg, err
	}
	if fs.NArg() > 0 {
		return cfg, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	cfg.only = map[string]bool{}
	for p := range strings.SplitSeq(*only, ",") {
		p = strings.TrimSpace(p)
		if p == "" {
			continue
		}
		if !contains(phases, p) {
			return cfg, fmt.Errorf("--only: unknown phase %q (phases: %s)", p, strings.Join(phases, ", "))
		}
		cfg.only[p] = true
	}
	for s := range strings.SplitSeq(*reports, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 {
			return cfg, fmt.Errorf("--report-workers: %q is not a positive number", s)
		}
		cfg.reportWorkers = append(cfg.reportWorkers, n)
	}
	cfg.serveArgs = strings.Fields(*serveArgs)
	switch {
	case cfg.duration <= 0 || cfg.warmup < 0:
		return cfg, errors.New("--duration must be positive and --warmup not negative")
	case cfg.stepRuns < 1 || cfg.stepRanks < 1 || cfg.fanoutWorkers < 1 || cfg.heartbeatWorkers < 1:
		return cfg, errors.New("--step-runs, --step-ranks, --fanout-workers and --heartbeat-workers must be positive")
	case cfg.restartRuns < 1 || cfg.restartWorkers < 1 || cfg.restartSteps < 0 || cfg.restartRepeat < 1:
		return cfg, errors.New("--restart-runs, --restart-workers and --restart-repeat must be positive, --restart-steps not negative")
	}
	return cfg, nil
}

func (cfg *config) parseStorm(step, save, stores string) error {
	var err1, err2 error
	cfg.stormStep, err1 = parseSpan(step)
	cfg.stormSave, err2 = parseSpan(save)
	switch {
	case err1 != nil:
		return fmt.Errorf("--storm-step: %w", err1)
	case err2 != nil:
		return fmt.Errorf("--storm-save: %w", err2)
	case cfg.stormStep.lo <= 0:
		return errors.New("--storm-step must be positive")
	case cfg.stormRuns < 1 || cfg.stormRanks < 1 || cfg.stormWorkers < 1 || cfg.stormRanksPerConn < 1 || cfg.stormWorkersPerConn < 1:
		return errors.New("--storm-runs, --storm-ranks, --storm-workers, --storm-ranks-per-conn and --storm-workers-per-conn must be positive")
	case cfg.stormLead <= 0 || cfg.stormTimeout <= 0 || cfg.stormMargin < 0:
		return errors.New("--storm-lead and --storm-timeout must be positive, --storm-margin not negative")
	}
	cfg.stormStores = nil
	for s := range strings.SplitSeq(stores, ",") {
		switch s = strings.TrimSpace(s); s {
		case "bbolt", "etcd":
			cfg.stormStores = append(cfg.stormStores, s)
		case "":
		default:
			return fmt.Errorf("--storm-stores: unknown store %q (bbolt, etcd)", s)
		}
	}
	return nil
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	cfg, err := parseFlags(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "snapbench: %v\n", err)
		return 2
	}
	b, err := newBench(cfg, stderr)
	if err != nil {
		fmt.Fprintf(stderr, "snapbench: %v\n", err)
		return 1
	}
	defer b.cleanup()
	err = b.runPhases(ctx)
	rep := b.report()
	table, out := stdout, stdout
	if cfg.json {
		table = stderr
	}
	rep.printTable(table)
	if cfg.json {
		if werr := rep.writeJSON(out); werr != nil {
			err = errors.Join(err, werr)
		}
	}
	if cfg.jsonFile != "" {
		f, ferr := os.Create(cfg.jsonFile)
		if ferr == nil {
			ferr = errors.Join(rep.writeJSON(f), f.Close())
		}
		err = errors.Join(err, ferr)
	}
	if err != nil {
		fmt.Fprintf(stderr, "snapbench: %v\n", err)
		return 1
	}
	return 0
}

// bench is one invocation: its temporary directory, the rows measured so
// far, and the machine's load when it started.
type bench struct {
	cfg     config
	log     io.Writer
	tmp     string
	self    string
	started time.Time
	loadBef string
	rows    []row
}

func newBench(cfg config, log io.Writer) (*bench, error) {
	bin, err := filepath.Abs(cfg.snapcoord)
	if err != nil {
		return nil, err
	}
	if _, err := os.Stat(bin); err != nil {
		return nil, fmt.Errorf("--snapcoord %s: %w (run make build)", cfg.snapcoord, err)
	}
	cfg.snapcoord = bin
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	tmp, err := os.MkdirTemp(cfg.dir, "snapbench-")
	if err != nil {
		return nil, err
	}
	if cfg.pprofDir != "" {
		if err := os.MkdirAll(cfg.pprofDir, 0o755); err != nil {
			return nil, err
		}
	}
	return &bench{cfg: cfg, log: log, tmp: tmp, self: self, started: time.Now(), loadBef: loadAvg()}, nil
}

func (b *bench) cleanup() {
	if b.cfg.keep {
		fmt.Fprintf(b.log, "snapbench: kept %s\n", b.tmp)
		return
	}
	_ = os.RemoveAll(b.tmp)
}

func (b *bench) logf(format string, args ...any) {
	fmt.Fprintf(b.log, "[%5.1fs] "+format+"\n", append([]any{time.Since(b.started).Seconds()}, args...)...)
}

func (b *bench) runPhases(ctx context.Context) error {
	steps := []struct {
		name string
		fn   func(context.Context) error
	}{
		{"steps", b.steps},
		{"reports", b.reports},
		{"fanout", b.fanout},
		{"heartbeats", b.heartbeats},
		{"restart", b.restart},
		{"etcd", b.etcd},
		{"storm", b.storm},
	}
	for _, s := range steps {
		if !b.cfg.only[s.name] {
			continue
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		b.logf("phase %s", s.name)
		if err := s.fn(ctx); err != nil {
			return fmt.Errorf("phase %s: %w", s.name, err)
		}
	}
	return nil
}

// loadAvg is /proc/loadavg's first three fields.
func loadAvg() string {
	raw, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(raw))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}

func cores() int { return runtime.NumCPU() }
