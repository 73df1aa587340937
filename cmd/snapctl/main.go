// Command snapctl is snapcoord's operator CLI: create and inspect runs,
// follow their events, explain a decision, move or fire the deadline, and
// run `snapctl sidecar` beside an environment worker written in any
// language.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	// SIGTERM is how Slurm (and most supervisors) stop a sidecar: it
	// cancels ctx, so the sidecar deregisters before it exits.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], env{lookup: os.LookupEnv, stdout: os.Stdout, stderr: os.Stderr})
	stop()
	os.Exit(code)
}
