package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/snapcoord/snapcoord/cmd/internal/flagtext"
	"github.com/snapcoord/snapcoord/cmd/internal/version"
)

// env is the process around a command: tests run commands with their own.
type env struct {
	lookup         func(string) (string, bool)
	stdout, stderr io.Writer
}

// command is one snapctl subcommand.
type command struct {
	name    string // "run get"
	args    string // positional arguments, for the usage line
	summary string
	// setup defines the command's own flags on fs and returns what runs it
	// once they are parsed, with the positional arguments.
	setup func(fs *flag.FlagSet, c *cli) func(ctx context.Context, args []string) error
}

// commands lists every subcommand, in the order help shows them.
var commands = []command{
	{"run create", "RUN_ID", "create a run; print its token once, for eval", setupRunCreate},
	{"run get", "RUN_ID", "show a run: state, deadline B, estimates", setupRunGet},
	{"run list", "", "list runs", setupRunList},
	{"run watch", "RUN_ID", "show a run's state and history, then follow its events until it ends (--from-now: no history); exit status by its final state", setupRunWatch},
	{"run explain", "RUN_ID", "explain the latest (or --step N) decision in plain words", setupRunExplain},
	{"run extend", "RUN_ID", "move the deadline B (--budget, --must-save-by or --add)", setupRunExtend},
	{"run trigger", "RUN_ID", "fire the deadline now", setupRunTrigger},
	{"run cancel", "RUN_ID", "cancel a run; every worker is told to stop", setupRunCancel},
	{"run reissue-token", "RUN_ID", "give a live run a new token (a requeued job); print it once, for eval", setupRunReissueToken},
	{"workers", "RUN_ID", "list a run's trainer ranks and environment workers", setupWorkers},
	{"snapshots", "RUN_ID", "list a run's environment snapshots", setupSnapshots},
	{"events", "RUN_ID", "print a run's events (--follow to keep following)", setupEvents},
	{"sidecar", "", "run beside an environment worker: a hook command per snapshot", setupSidecar},
}

const usageHead = `usage: snapctl [connection flags] <command> [flags] [arguments]

commands:
`

const usageTail = `  completion SHELL  print a completion script for bash, zsh or fish
  version           print the version and commit (also --version)
  help              print this help (also --help)

Flags may come before or after the arguments. Every command takes the
connection flags (and their environment variables):

  --addr HOST:PORT     coordinator address (SNAPCOORD_ADDR, default 127.0.0.1:7070);
                       a comma-separated list for coordinators that share
                       an etcd prefix: calls go to the leader
  --token TOKEN        admin token for run commands (SNAPCOORD_TOKEN)
  --token-file FILE    read the admin token from FILE (SNAPCOORD_TOKEN_FILE)
  --plaintext          no TLS: only for a coordinator on loopback or a trusted
                       network (SNAPCOORD_PLAINTEXT); the default for a
                       loopback address when no TLS flag is given
                       (--plaintext=false: TLS there too)
  --ca-file FILE       CA bundle that signs the coordinator's certificate;
                       default: the system roots (SNAPCOORD_CA_FILE)
  --cert-file FILE     client certificate, for mutual TLS (SNAPCOORD_CERT_FILE)
  --key-file FILE      its key (SNAPCOORD_KEY_FILE)
  --server-name NAME   name to verify in the coordinator's certificate
                       (SNAPCOORD_SERVER_NAME)
  --timeout DURATION   bound on each call, except following (SNAPCOORD_TIMEOUT,
                       default 30s)
  --connect-timeout DURATION
                       how long the coordinator may leave a new connection
                       unanswered before snapctl gives up and says so
                       (SNAPCOORD_CONNECT_TIMEOUT, default 1.5s)
  -o, --output table|json
                       output: human tables in local time (default), or
                       protojson (events: one JSON object per line); with
                       json, errors are one JSON object on stderr

Exit status:
  0   success
  1   unexpected failure (an internal error in the coordinator or in snapctl)
  2   usage: unknown command, bad flag, missing argument
  3   not found: no such run, worker or step
  4   conflict or wrong state: the run exists (run create shows a token only
      once), the deadline already fired, the run is over; sidecar: another
      process registered under the worker's name
  5   the coordinator is unreachable, shutting down, or did not answer in
      time; or the change's commit was not confirmed (it may still take
      effect: run the same command again to learn the outcome)
  6   authentication or permission: missing or wrong token
  7   invalid input: rejected by the coordinator, or a bad YAML file, time or
      Slurm variable
  8   a coordinator limit was reached
  9   run watch: the run ended FAILED or CANCELLED
  10  sidecar: the --on-stop hook failed
  11  run watch: interrupted (SIGINT or SIGTERM) before the run ended

Run 'snapctl <command> --help' for a command's flags.
`

func printUsage(w io.Writer) {
	fmt.Fprint(w, usageHead)
	for _, c := range commands {
		fmt.Fprintf(w, "  %-17s %s\n", c.name, c.summary)
	}
	fmt.Fprint(w, usageTail)
}

// run is main without the process.
func run(ctx context.Context, args []string, e env) int {
	c := &cli{env: e, conn: connConfig{addr: "127.0.0.1:7070", timeout: 30 * time.Second, connectTimeout: defaultConnectTimeout},
		jsonErrors: wantsJSONErrors(args)}
	global := c.newFlagSet("snapctl")
	showVersion := global.Bool("version", false, "print the version")
	if err := c.applyEnv(global); err != nil {
		return c.fail(usageErr(err))
	}
	if err := global.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			printUsage(e.stdout)
			return exitOK
		}
		return c.fail(usageErr(flagtext.Error(err)))
	}
	if *showVersion {
		fmt.Fprintln(e.stdout, version.String("snapctl"))
		return exitOK
	}
	c.setFlags = map[string]bool{}
	global.Visit(func(f *flag.Flag) { c.setFlags[f.Name] = true })
	args = global.Args()
	if len(args) == 0 {
		if c.jsonErrors {
			return c.fail(usageErr(errors.New("no command; run 'snapctl help'")))
		}
		printUsage(e.stderr)
		return exitUsage
	}
	switch args[0] {
	case "help", "-h", "--help":
		printUsage(e.stdout)
		return exitOK
	case "version":
		fmt.Fprintln(e.stdout, version.String("snapctl"))
		return exitOK
	case "completion":
		return c.fail(c.completion(args[1:]))
	}
	cmd, rest, ok := findCommand(args)
	if !ok {
		return c.groupOrUnknown(args)
	}
	return c.fail(c.execute(ctx, cmd, rest))
}

// groupOrUnknown answers args that name no command. The first word of a
// group of commands ("run") alone, or with --help, lists the group; with
// a word that is none of its commands, the error lists them too.
func (c *cli) groupOrUnknown(args []string) int {
	group := subcommands(args[0])
	if len(group) == 0 {
		return c.fail(usageErr(fmt.Errorf("unknown command %q; run 'snapctl help'", strings.Join(args[:min(2, len(args))], " "))))
	}
	if len(args) > 1 && slices.Contains([]string{"help", "-h", "--help"}, args[1]) {
		printGroup(c.stdout, args[0], group)
		return exitOK
	}
	switch {
	case c.jsonErrors && len(args) == 1:
		return c.fail(usageErr(fmt.Errorf("%q needs a command: %s", args[0], groupNames(group))))
	case c.jsonErrors:
		return c.fail(usageErr(fmt.Errorf("unknown command %q; the %s commands: %s", args[0]+" "+args[1], args[0], groupNames(group))))
	case len(args) > 1:
		c.fail(usageErr(fmt.Errorf("unknown command %q", args[0]+" "+args[1])))
	}
	printGroup(c.stderr, args[0], group)
	return exitUsage
}

// groupNames: "run create, run get, ...".
func groupNames(cmds []command) string {
	names := make([]string, len(cmds))
	for i, c := range cmds {
		names[i] = c.name
	}
	return strings.Join(names, ", ")
}

// subcommands are the commands whose first word is group, when they have
// a second.
func subcommands(group string) []command {
	var out []command
	for _, c := range commands {
		if first, _, ok := strings.Cut(c.name, " "); ok && first == group {
			out = append(out, c)
		}
	}
	return out
}

func printGroup(w io.Writer, group string, cmds []command) {
	fmt.Fprintf(w, "usage: snapctl %s <command> [flags] [arguments]\n\ncommands:\n", group)
	for _, c := range cmds {
		fmt.Fprintf(w, "  %-17s %s\n", c.name, c.summary)
	}
	fmt.Fprintf(w, "\nRun 'snapctl %s <command> --help' for a command's flags.\n", group)
}

// findCommand matches the longest command name at the start of args.
func findCommand(args []string) (command, []string, bool) {
	for _, c := range commands {
		words := strings.Fields(c.name)
		if len(args) >= len(words) && strings.Join(args[:len(words)], " ") == c.name {
			return c, args[len(words):], true
		}
	}
	return command{}, nil, false
}

func (c *cli) execute(ctx context.Context, cmd command, args []string) error {
	fs := c.newFlagSet("snapctl " + cmd.name)
	runFn := cmd.setup(fs, c)
	if err := c.applyEnv(fs); err != nil {
		return usageErr(err)
	}
	pos, err := parseInterleaved(fs, args)
	if errors.Is(err, flag.ErrHelp) {
		c.printCommandUsage(c.stdout, cmd, fs)
		return nil
	}
	if err != nil {
		return usageErr(flagtext.Error(err))
	}
	fs.Visit(func(f *flag.Flag) { c.setFlags[f.Name] = true })
	if err := c.checkOutput(); err != nil {
		return err
	}
	c.jsonErrors = c.output == "json"
	return runFn(ctx, pos)
}

func (c *cli) printCommandUsage(w io.Writer, cmd command, fs *flag.FlagSet) {
	fmt.Fprintf(w, "usage: snapctl %s [flags] %s\n\n%s\n\nflags (connection flags: see 'snapctl help'):\n", cmd.name, cmd.args, cmd.summary)
	flagtext.PrintDefaults(w, fs, func(f *flag.Flag) bool { return !connFlags[f.Name] })
}
