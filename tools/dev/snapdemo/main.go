// Command snapdemo is `make demo`: a coordinator on a temporary data
// directory, two trainer ranks through the Go client, three environment
// workers through `snapctl sidecar` with small shell hooks, and a budget of
// about 40 s, shown as a live timeline. It exits 0 only if the run ended
// STOPPED with its deadline snapshot saved before the deadline B.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"
)

type config struct {
	snapcoord, snapctl string
	budget             time.Duration
	timeout            time.Duration
}

func main() {
	var cfg config
	flag.StringVar(&cfg.snapcoord, "snapcoord", "bin/snapcoord", "the snapcoord `binary`")
	flag.StringVar(&cfg.snapctl, "snapctl", "bin/snapctl", "the snapctl `binary`")
	flag.DurationVar(&cfg.budget, "budget", 40*time.Second, "the run's budget (whole seconds)")
	flag.DurationVar(&cfg.timeout, "timeout", 90*time.Second, "give up after this long")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	ctx, cancel := context.WithTimeout(ctx, cfg.timeout)
	err := run(ctx, cfg)
	cancel()
	stop()
	if err != nil {
		fmt.Fprintf(os.Stderr, "demo: FAIL: %v\n", err)
		os.Exit(1)
	}
	fmt.Println("demo: OK")
}
