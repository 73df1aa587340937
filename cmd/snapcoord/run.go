package main

import (
	"context"
	"fmt"
	"io"
	"os"

	"github.com/snapcoord/snapcoord/cmd/internal/version"
)

// Exit codes: 2 for a usage error, as the flag package does.
const (
	exitOK    = 0
	exitFail  = 1
	exitUsage = 2
)

const usage = `usage: snapcoord <command> [flags]

commands:
  serve     run the coordinator
  version   print the version and commit (also --version)
  help      print this help (also --help)

Run 'snapcoord <command> --help' for a command's flags.
`

// run is main without the process: tests call it with their own arguments,
// output and a context they cancel in place of a signal.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return exitUsage
	}
	switch args[0] {
	case "serve":
		return runServe(ctx, args[1:], os.LookupEnv, stdout, stderr)
	case "version", "-version", "--version":
		fmt.Fprintln(stdout, version.String("snapcoord"))
		return exitOK
	case "help", "-h", "-help", "--help":
		fmt.Fprint(stdout, usage)
		return exitOK
	default:
		fmt.Fprintf(stderr, "snapcoord: unknown command %q\n\n%s", args[0], usage)
		return exitUsage
	}
}
