// Command snapcrash is a kill -9 crash loop for snapcoord. Writers (trainer
// ranks completing steps and saving checkpoints, environment workers
// reporting every snapshot they are sent, half of them streaming and half
// polling) drive the real `snapcoord serve` binary through the Go client
// and log every write the coordinator acknowledged. The coordinator is
// SIGKILLed at a random moment, the data file is checked with bbolt's
// consistency check while it is down, and it is restarted on the same data
// directory and address. After each restart every acknowledged write must
// be there (decisions asked again are identical, to the timestamp), and
// every writer must make progress again.
//
// It prints the cycles, the writes acknowledged and the writes lost, and
// exits 1 if any write was lost, could not be read back, a check failed or a
// writer did not resume.
//
// With --ha (ha.go) the same writers and verification run against a 3-member
// etcd cluster and three coordinators on one prefix, through every
// coordinator's address: the leader is SIGKILLed (and restarted, as a
// follower) or, every third cycle, SIGSTOPped past its election TTL while
// writes are sent to it, then SIGCONTed. Every acknowledged write must
// survive the failover, the paused ex-leader must refuse (and never store)
// every write it was sent, and the time from the leader's loss to the next
// leader's SERVING is reported.
//
//	snapcrash --snapcoord bin/snapcoord --cycles 20
//	snapcrash --snapcoord bin/snapcoord --ha --cycles 10
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/snapcoord/snapcoord/client"
	"github.com/snapcoord/snapcoord/internal/testkit/coordproc"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

type config struct {
	snapcoord     string
	dir           string
	keep          bool
	cycles        int
	runs          int
	ranks         int
	envs          int
	minUp, maxUp  time.Duration
	seed          uint64
	resumeTimeout time.Duration
	injectLoss    bool
	stepEvery     time.Duration
	// The HA loop (--ha, ha.go).
	ha           bool
	coordinators int
	electionTTL  time.Duration
	// haSchedule overrides the cycles' order (tests); empty: haSchedule.
	haSchedule []cycleKind
}

func parseFlags(args []string, stderr io.Writer) (config, error) {
	var c config
	fs := flag.NewFlagSet("snapcrash", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&c.snapcoord, "snapcoord", "bin/snapcoord", "the snapcoord `binary` (make build)")
	fs.StringVar(&c.dir, "dir", "", "parent `directory` of the temporary data directory (default: the system temp dir)")
	fs.BoolVar(&c.keep, "keep", false, "keep the data directory and the coordinator's log")
	fs.IntVar(&c.cycles, "cycles", 20, "SIGKILL and restart this many times")
	fs.IntVar(&c.runs, "runs", 2, "runs written to concurrently")
	fs.IntVar(&c.ranks, "ranks", 4, "trainer ranks per run")
	fs.IntVar(&c.envs, "envs", 4, "environment workers per run (half stream, half poll)")
	fs.DurationVar(&c.minUp, "min-up", 200*time.Millisecond, "shortest time the coordinator serves before it is killed")
	fs.DurationVar(&c.maxUp, "max-up", 1500*time.Millisecond, "longest time the coordinator serves before it is killed")
	fs.Uint64Var(&c.seed, "seed", 0, "seed for the kill moments (0: from the clock; printed, to repeat a run)")
	fs.DurationVar(&c.resumeTimeout, "resume-timeout", time.Minute, "how long every writer has to make progress after a restart")
	fs.DurationVar(&c.stepEvery, "step-every", 0, "pace the trainer ranks: a step at most this often (0: back to back). Every cycle verifies every write so far while the writers go on: unpaced, on a store slower to read back than to write (etcd), the writes between cycles, and each verification, grow several-fold a cycle")
	fs.BoolVar(&c.injectLoss, "inject-loss", false, "self-test: after the first kill, delete one acknowledged snapshot report from the data file; the loop must then report it lost and fail")
	fs.BoolVar(&c.ha, "ha", false, "the HA loop: a 3-member etcd cluster on loopback, --coordinators coordinators on one prefix; kill the leader, pause it past its election TTL, freeze it 2x its TTL or take etcd's quorum away for 3s, in turn, instead of killing the one bbolt coordinator")
	fs.IntVar(&c.coordinators, "coordinators", 3, "with --ha: coordinators sharing the etcd prefix")
	fs.DurationVar(&c.electionTTL, "election-ttl", 5*time.Second, "with --ha: the coordinators' --election-ttl")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	switch {
	case fs.NArg() > 0:
		return c, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	case c.cycles < 1 || c.runs < 1 || c.ranks < 1 || c.envs < 1:
		return c, errors.New("--cycles, --runs, --ranks and --envs must be positive")
	case c.stepEvery < 0:
		return c, errors.New("--step-every must not be negative")
	case c.minUp <= 0 || c.maxUp < c.minUp:
		return c, errors.New("--min-up must be positive and --max-up at least --min-up")
	case c.ha && (c.coordinators < 2 || c.electionTTL < time.Second):
		return c, errors.New("--ha needs at least 2 --coordinators and an --election-ttl of at least 1s")
	case c.ha && c.injectLoss:
		return c, errors.New("--inject-loss deletes from the bbolt file: not with --ha")
	}
	if c.seed == 0 {
		c.seed = uint64(time.Now().UnixNano())
	}
	return c, nil
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	cfg, err := parseFlags(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "snapcrash: %v\n", err)
		return 2
	}
	loop := crashLoop
	if cfg.ha {
		loop = haLoop
	}
	ok, err := loop(ctx, cfg, stdout)
	if err != nil {
		fmt.Fprintf(stderr, "snapcrash: %v\n", err)
		return 1
	}
	if !ok {
		return 1
	}
	return 0
}

// summary is what the loop found.
type summary struct {
	cycles        int
	checksFailed  int
	notResumed    int
	lost          map[string]bool // distinct writes found lost
	unread        map[string]bool // distinct reads that failed, their writes unverified
	violations    []string
	writerErrors  []string
	maxResume     time.Duration
	maxReady      time.Duration
	acknowledged  counts
	finalVerified int
	failovers     bool // the HA loop: no bbolt file, no restart of the one coordinator
}

func crashLoop(ctx context.Context, cfg config, out io.Writer) (bool, error) {
	bin, tmp, cleanup, err := prepare(cfg, "snapcrash-", out)
	if err != nil {
		return false, err
	}
	defer cleanup()
	dataDir := filepath.Join(tmp, "data")
	logPath := filepath.Join(tmp, "snapcoord.log")
	rng := rand.New(rand.NewPCG(cfg.seed, cfg.seed^0x9e3779b97f4a7c15))
	fmt.Fprintf(out, "snapcrash: %d cycles, %d runs × (%d ranks + %d environment workers), kill after %s..%s, seed %d\n",
		cfg.cycles, cfg.runs, cfg.ranks, cfg.envs, cfg.minUp, cfg.maxUp, cfg.seed)

	// The check that every checkpoint saved by all ranks was published reads
	// the run's events from the first: none may be dropped by
	// --max-events-per-run, which 20 cycles pass (every step is
	// checkpointed, about six events a step, 100,000 events a run).
	proc, err := coordproc.Start(ctx, coordproc.Config{Bin: bin, DataDir: dataDir, LogPath: logPath,
		Args: []string{"--metrics-listen", "", "--log-format", "json", "--max-events-per-run", "100000000"}})
	if err != nil {
		return false, err
	}
	defer func() { _ = proc.Stop(15 * time.Second) }()
	admin, err := client.Dial(proc.Addr, client.WithInsecure())
	if err != nil {
		return false, err
	}
	defer admin.Close()

	f, err := startFleet(ctx, proc.Addr, cfg)
	if err != nil {
		return false, err
	}
	defer f.close()

	s := summary{lost: map[string]bool{}, unread: map[string]bool{}}
	for cycle := 1; cycle <= cfg.cycles; cycle++ {
		up := cfg.minUp + time.Duration(rng.Int64N(int64(cfg.maxUp-cfg.minUp)+1))
		if err := serveFor(ctx, up, f.runs); err != nil {
			return false, err
		}
		if err := proc.Kill(); err != nil {
			return false, fmt.Errorf("cycle %d: %w", cycle, err)
		}
		ackedAtKill := f.log.counts().writes()
		checkErr := checkFile(filepath.Join(dataDir, "snapcoord.db"))
		if checkErr != nil {
			s.checksFailed++
		}
		if cfg.injectLoss && cycle == 1 {
			if err := injectLoss(filepath.Join(dataDir, "snapcoord.db"), f.log); err != nil {
				return false, fmt.Errorf("inject loss: %w", err)
			}
		}
		proc, err = proc.Restart(ctx)
		if err != nil {
			return false, fmt.Errorf("cycle %d: restart: %w", cycle, err)
		}
		restarted := time.Now()
		s.maxReady = max(s.maxReady, proc.Ready)
		resumed, silent, v := f.settle(ctx, admin, restarted, cfg.resumeTimeout, cycle, &s)
		status := "ok"
		if checkErr != nil || len(v.lost) > 0 || len(v.unread) > 0 || len(silent) > 0 {
			status = "FAILED"
		}
		fmt.Fprintf(out, "cycle %2d: killed after %4d ms with %6d writes acknowledged; bbolt check %s; SERVING in %4d ms; writers resumed in %4d ms%s; %6d writes verified, %d lost%s  %s\n",
			cycle, up.Milliseconds(), ackedAtKill, okOr(checkErr), proc.Ready.Milliseconds(), resumed.Milliseconds(), silentNote(silent),
			v.checked, len(v.lost), unreadNote(v.unread), status)
		s.record(out, v)
	}

	f.finish(ctx, admin, &s, out)
	return report(out, s), nil
}

// prepare checks the binary and makes the temporary directory; cleanup
// removes it, or names it with --keep.
func prepare(cfg config, prefix string, out io.Writer) (bin, tmp string, cleanup func(), err error) {
	if bin, err = filepath.Abs(cfg.snapcoord); err != nil {
		return "", "", nil, err
	}
	if _, err := os.Stat(bin); err != nil {
		return "", "", nil, fmt.Errorf("--snapcoord %s: %w (run make build)", cfg.snapcoord, err)
	}
	if tmp, err = os.MkdirTemp(cfg.dir, prefix); err != nil {
		return "", "", nil, err
	}
	return bin, tmp, func() {
		if cfg.keep {
			fmt.Fprintf(out, "kept %s\n", tmp)
			return
		}
		_ = os.RemoveAll(tmp)
	}, nil
}

// fleet is every run's writers and the log of what they were acknowledged.
type fleet struct {
	log  *acks
	runs []*runWriters
	stop context.CancelFunc
}

// startFleet creates cfg.runs runs through addr (one address, or several
// comma-separated) and starts their writers.
func startFleet(ctx context.Context, addr string, cfg config) (*fleet, error) {
	writeCtx, stop := context.WithCancel(ctx)
	f := &fleet{log: newAcks(), stop: stop}
	for i := range cfg.runs {
		r, err := startRun(ctx, addr, fmt.Sprintf("crash-%d", i), cfg.ranks, cfg.envs, f.log)
		if err != nil {
			f.close()
			return nil, err
		}
		r.stepEvery = cfg.stepEvery
		f.runs = append(f.runs, r)
		r.start(writeCtx)
	}
	return f, nil
}

func (f *fleet) close() {
	f.stop()
	for _, r := range f.runs {
		r.close()
	}
}

// settle waits until every writer made progress after since (or timeout),
// verifies every acknowledged write, and records cycle in s.
func (f *fleet) settle(ctx context.Context, admin *client.Client, since time.Time, timeout time.Duration, cycle int, s *summary) (time.Duration, []string, verdict) {
	resumed, silent := awaitResume(ctx, f.log, since, timeout, f.runs)
	v := verifyAll(ctx, admin, f.runs)
	if len(silent) > 0 {
		s.notResumed++
	}
	s.maxResume = max(s.maxResume, resumed)
	s.violations = append(s.violations, f.log.takeViolations()...)
	s.cycles = cycle
	return resumed, silent, v
}

// finish stops the writers at a step boundary, then verifies everything
// once more.
func (f *fleet) finish(ctx context.Context, admin *client.Client, s *summary, out io.Writer) {
	f.stop()
	for _, r := range f.runs {
		r.wait()
	}
	s.writerErrors = collectFatal(f.runs)
	final := verifyAll(ctx, admin, f.runs)
	s.record(out, final)
	s.finalVerified = final.checked
	s.acknowledged = f.log.counts()
}

// serveFor lets the writers work for d, or returns a writer's fatal error.
func serveFor(ctx context.Context, d time.Duration, runs []*runWriters) error {
	t := time.NewTimer(d)
	defer t.Stop()
	cases := make(chan error, 1)
	stop := make(chan struct{})
	defer close(stop)
	for _, r := range runs {
		go func() {
			select {
			case err := <-r.fatal:
				select {
				case cases <- err:
				default:
				}
			case <-stop:
			}
		}()
	}
	select {
	case <-t.C:
		return nil
	case err := <-cases:
		return fmt.Errorf("writer failed: %w", err)
	case <-ctx.Done():
		return ctx.Err()
	}
}

// checkFile runs bbolt's consistency check on the data file, opened read
// only so that the file the coordinator restarts on is exactly what the
// kill left behind.
func checkFile(path string) error {
	db, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true, Timeout: 5 * time.Second})
	if err != nil {
		return err
	}
	defer db.Close()
	return db.View(func(tx *bolt.Tx) error {
		var first error
		for err := range tx.Check() {
			if first == nil {
				first = err
			}
		}
		return first
	})
}

// injectLoss deletes one acknowledged snapshot report from the data file,
// as a lost write would look: it proves that the verification notices.
func injectLoss(path string, log *acks) error {
	key, ok := log.anySnapshotReport()
	if !ok {
		return errors.New("no snapshot report acknowledged yet")
	}
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: 5 * time.Second})
	if err != nil {
		return err
	}
	defer db.Close()
	return db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket([]byte("reports"))
		if b == nil || b.Get(key) == nil {
			return fmt.Errorf("report %q not in the file", key)
		}
		return b.Delete(key)
	})
}

func verifyAll(ctx context.Context, admin *client.Client, runs []*runWriters) verdict {
	var v verdict
	for _, r := range runs {
		v.add(verify(ctx, admin, r))
	}
	return v
}

// awaitResume waits until every writer had a write acknowledged (or, for
// an environment worker, a command delivered) after the restart.
func awaitResume(ctx context.Context, log *acks, since time.Time, timeout time.Duration, runs []*runWriters) (time.Duration, []string) {
	deadline := time.Now().Add(timeout)
	for {
		silent := log.silentSince(since)
		if len(silent) == 0 || time.Now().After(deadline) || ctx.Err() != nil {
			return time.Since(since), silent
		}
		select {
		case <-time.After(20 * time.Millisecond):
		case <-ctx.Done():
		}
	}
}

func collectFatal(runs []*runWriters) []string {
	var out []string
	for _, r := range runs {
		select {
		case err := <-r.fatal:
			out = append(out, err.Error())
		default:
		}
	}
	return out
}

func okOr(err error) string {
	if err == nil {
		return "ok"
	}
	return "FAILED (" + err.Error() + ")"
}

// record adds a verdict's findings, printing those not seen before.
func (s *summary) record(out io.Writer, v verdict) {
	for _, f := range []struct {
		found, seen map[string]bool
		what        string
	}{{v.lost, s.lost, "lost"}, {v.unread, s.unread, "could not read back"}} {
		for msg := range f.found {
			if !f.seen[msg] {
				f.seen[msg] = true
				fmt.Fprintf(out, "    %s: %s\n", f.what, msg)
			}
		}
	}
}

func unreadNote(unread map[string]bool) string {
	if len(unread) == 0 {
		return ""
	}
	return fmt.Sprintf(", %d reads failed", len(unread))
}

func silentNote(silent []string) string {
	if len(silent) == 0 {
		return ""
	}
	return " (NOT resumed: " + strings.Join(silent, ", ") + ")"
}

func report(out io.Writer, s summary) bool {
	ok := printSummary(out, s)
	printVerdict(out, ok)
	return ok
}

// printSummary prints what both loops find and says whether it passes.
func printSummary(out io.Writer, s summary) bool {
	c := s.acknowledged
	fmt.Fprintf(out, "\ncycles:               %d\n", s.cycles)
	fmt.Fprintf(out, "writes acknowledged:  %d (%d decisions, %d checkpoint reports, %d snapshot reports, %d registrations, %d runs; plus %d repeated decisions compared)\n",
		c.writes(), c.Decisions, c.CheckpointReports, c.SnapshotReports, c.Registrations, c.Runs, c.DecisionReads)
	fmt.Fprintf(out, "writes verified:      %d after the writers stopped\n", s.finalVerified)
	fmt.Fprintf(out, "writes lost:          %d\n", len(s.lost))
	if len(s.unread) > 0 {
		fmt.Fprintf(out, "reads failed:         %d (the writes they would have checked are unverified)\n", len(s.unread))
	}
	if s.failovers {
		fmt.Fprintf(out, "failovers not resumed: %d of %d (slowest: every writer acknowledged again %d ms after the next leader served)\n",
			s.notResumed, s.cycles, s.maxResume.Milliseconds())
	} else {
		fmt.Fprintf(out, "bbolt checks failed:  %d of %d\n", s.checksFailed, s.cycles)
		fmt.Fprintf(out, "restarts not resumed: %d of %d (slowest resume %d ms, slowest restart to SERVING %d ms)\n",
			s.notResumed, s.cycles, s.maxResume.Milliseconds(), s.maxReady.Milliseconds())
	}
	ok := len(s.lost) == 0 && len(s.unread) == 0 && s.checksFailed == 0 && s.notResumed == 0 && len(s.violations) == 0 && len(s.writerErrors) == 0
	for _, v := range s.violations {
		fmt.Fprintf(out, "decision mismatch:    %s\n", v)
	}
	for _, e := range s.writerErrors {
		fmt.Fprintf(out, "writer error:         %s\n", e)
	}
	return ok
}

func printVerdict(out io.Writer, ok bool) {
	if ok {
		fmt.Fprintln(out, "PASS")
	} else {
		fmt.Fprintln(out, "FAIL")
	}
}
