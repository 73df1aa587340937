// Command snapsim simulates whole training runs under a walltime and
// measures how much each deadline policy wastes, against an oracle that
// knows every future duration (issue 15; docs/simulation.md).
//
// A run of a workload: iterations, a regular checkpoint and snapshot after
// every SaveEvery-th step (blocking the next iteration), a decision at each
// completed step, the deadline save when a policy fires, and the walltime
// kill at B. A save that has not finished by B is a miss, and a miss loses
// everything since the last durable save. Runs are seeded, so the same flags
// print the same tables.
//
// Usage:
//
//	snapsim [--runs 3000] [--seed 15] [--workloads ABCDEFGH] [--doc docs/simulation.md]
package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/snapcoord/snapcoord/server/deadline"
)

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

type config struct {
	runs      int
	seed      uint64
	workloads string
	doc       string
	procs     int
	frontier  bool
}

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("snapsim", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var cfg config
	fs.IntVar(&cfg.runs, "runs", 3000, "runs per workload")
	fs.Uint64Var(&cfg.seed, "seed", 15, "seed; the same seed prints the same tables")
	fs.StringVar(&cfg.workloads, "workloads", "ABCDEFGH", "workloads to simulate, by letter")
	fs.StringVar(&cfg.doc, "doc", "", "also write the tables into this markdown file, between the markers <!-- snapsim:begin --> and <!-- snapsim:end --> (<!-- snapsim-frontier:... --> with --frontier)")
	fs.BoolVar(&cfg.frontier, "frontier", false, "compare ExpectedLoss settings instead (the worst of the workloads for each)")
	fs.IntVar(&cfg.procs, "procs", defaultProcs(), "goroutines simulating runs")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if cfg.runs < 1 {
		fmt.Fprintln(stderr, "snapsim: --runs must be at least 1")
		return 2
	}
	if i := strings.IndexFunc(cfg.workloads, func(r rune) bool { return !strings.ContainsRune(letters, r) }); i >= 0 || cfg.workloads == "" {
		fmt.Fprintf(stderr, "snapsim: --workloads %q: letters A to H\n", cfg.workloads)
		return 2
	}
	start := time.Now()
	var buf bytes.Buffer
	section := "snapsim"
	if cfg.frontier {
		section = "snapsim-frontier"
		frontier(&buf, cfg, chosen())
	} else {
		tables(&buf, cfg)
	}
	_, _ = stdout.Write(buf.Bytes())
	fmt.Fprintf(stderr, "snapsim: %d runs per workload in %.1f s\n", cfg.runs, time.Since(start).Seconds())
	if cfg.doc != "" {
		if err := spliceDoc(cfg.doc, section, buf.Bytes()); err != nil {
			fmt.Fprintln(stderr, "snapsim:", err)
			return 1
		}
	}
	return 0
}

// marginSeconds is M for every policy, as in the figures.
const marginSeconds = 60

// chosen is the default ExpectedLoss setting, as the frontier names it.
func chosen() lossPolicy {
	p := deadline.ExpectedLoss{}.Defaults()
	return lossPolicy{label: knobs(p, marginSeconds), margin: marginSeconds, p: p}
}

func policies() []policy {
	safety := deadline.ExpectedLoss{SafetySaves: true}
	return []policy{
		maxPolicy{margin: marginSeconds},
		maxPolicy{margin: marginSeconds, withSave: true},
		lossPolicy{label: "ExpectedLoss", margin: marginSeconds, p: deadline.ExpectedLoss{}},
		lossPolicy{label: "ExpectedLoss + safety saves", margin: marginSeconds, p: safety},
	}
}

// letters name the workloads, in order.
const letters = "ABCDEFGH"

// tables simulates the chosen workloads and prints a table for each.
func tables(out io.Writer, cfg config) {
	all := workloads()
	ps := policies()
	fmt.Fprintf(out, "%d runs per workload, seed %d; waste in minutes.\n\n", cfg.runs, cfg.seed)
	for _, letter := range cfg.workloads {
		i := strings.IndexRune(letters, letter)
		w := &all[i]
		writeTable(out, w, summarise(runAll(w, i, cfg.runs, cfg.seed, cfg.procs, ps), ps))
	}
}

// spliceDoc replaces what lies between the section's markers in path with
// tables.
func spliceDoc(path, section string, tables []byte) error {
	beginMark, endMark := "<!-- "+section+":begin -->", "<!-- "+section+":end -->"
	doc, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	before, rest, ok := bytes.Cut(doc, []byte(beginMark))
	_, after, ok2 := bytes.Cut(rest, []byte(endMark))
	if !ok || !ok2 {
		return errors.New(path + ": no " + beginMark + " ... " + endMark + " section to write the tables into")
	}
	var b bytes.Buffer
	b.Write(before)
	b.WriteString(beginMark + "\n\n")
	b.Write(tables)
	b.WriteString(endMark)
	b.Write(after)
	return os.WriteFile(path, b.Bytes(), 0o644)
}
