package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"runtime/debug"
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
  version   print the version

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
	case "version":
		fmt.Fprintln(stdout, versionString())
		return exitOK
	case "help", "-h", "-help", "--help":
		fmt.Fprint(stdout, usage)
		return exitOK
	default:
		fmt.Fprintf(stderr, "snapcoord: unknown command %q\n\n%s", args[0], usage)
		return exitUsage
	}
}

// version is set at release builds with -ldflags "-X main.version=v1.2.3";
// otherwise the module version from the build info is used.
var version = ""

func versionString() string {
	goVersion := "unknown"
	if bi, ok := debug.ReadBuildInfo(); ok {
		goVersion = bi.GoVersion
	}
	return fmt.Sprintf("snapcoord %s %s", moduleVersion(), goVersion)
}

// moduleVersion is the release version, the module version from the build
// info, or "(devel)".
func moduleVersion() string {
	v := version
	if bi, ok := debug.ReadBuildInfo(); ok && v == "" {
		v = bi.Main.Version
	}
	if v == "" {
		v = "(devel)"
	}
	return v
}
