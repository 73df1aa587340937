package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/snapcoord/snapcoord/cmd/internal/durations"
)

// cli is the state one snapctl invocation shares between its flags and its
// command.
type cli struct {
	env
	conn     connConfig
	output   string          // -o
	outputs  []string        // what -o accepts for this command; first is the default
	setFlags map[string]bool // flags given on the command line, before the command or after it
	// jsonErrors: -o json, so errors are printed as JSON too.
	jsonErrors bool
	// lastUnavailable is the last attempt of a call that failed UNAVAILABLE.
	lastUnavailable attemptLog
}

// connConfig is how to reach the coordinator.
type connConfig struct {
	addr, token, tokenFile    string
	plaintext                 bool
	caFile, certFile, keyFile string
	serverName                string
	timeout                   time.Duration
	// connectTimeout bounds how long a new connection may go unanswered:
	// the handshakes and a first health check (see connect).
	connectTimeout time.Duration
	// Resolved by transport: whether the connection is plaintext, and
	// whether only because the address is loopback.
	plainInUse, plainByDefault bool
}

// connFlags are defined on every flag set, bound to the same variables:
// they may come before the command or after it.
var connFlags = map[string]bool{
	"addr": true, "token": true, "token-file": true, "plaintext": true, "ca-file": true,
	"cert-file": true, "key-file": true, "server-name": true, "timeout": true, "connect-timeout": true, "o": true, "output": true,
}

// envNames maps flags to the environment variables that set their
// defaults. A flag on the command line beats its variable.
var envNames = map[string]string{
	"addr": "SNAPCOORD_ADDR", "token": "SNAPCOORD_TOKEN", "token-file": "SNAPCOORD_TOKEN_FILE",
	"plaintext": "SNAPCOORD_PLAINTEXT", "ca-file": "SNAPCOORD_CA_FILE", "cert-file": "SNAPCOORD_CERT_FILE",
	"key-file": "SNAPCOORD_KEY_FILE", "server-name": "SNAPCOORD_SERVER_NAME", "timeout": "SNAPCOORD_TIMEOUT",
	"connect-timeout": "SNAPCOORD_CONNECT_TIMEOUT",
	// sidecar
	"run": "SNAPCOORD_RUN_ID", "run-token": "SNAPCOORD_RUN_TOKEN", "run-token-file": "SNAPCOORD_RUN_TOKEN_FILE",
	"name": "SNAPCOORD_WORKER_NAME", "on-snapshot": "SNAPCOORD_ON_SNAPSHOT", "on-stop": "SNAPCOORD_ON_STOP",
}

// newFlagSet defines the connection flags with their current values as
// defaults, so that defining them again for the command keeps what was
// given before it.
func (c *cli) newFlagSet(name string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard) // errors are printed once, by fail
	fs.StringVar(&c.conn.addr, "addr", c.conn.addr, "coordinator `address`, or a comma-separated list")
	fs.StringVar(&c.conn.token, "token", c.conn.token, "admin `token`")
	fs.StringVar(&c.conn.tokenFile, "token-file", c.conn.tokenFile, "read the admin token from `file`")
	fs.BoolVar(&c.conn.plaintext, "plaintext", c.conn.plaintext, "connect without TLS")
	fs.StringVar(&c.conn.caFile, "ca-file", c.conn.caFile, "CA bundle `file`")
	fs.StringVar(&c.conn.certFile, "cert-file", c.conn.certFile, "client certificate `file`")
	fs.StringVar(&c.conn.keyFile, "key-file", c.conn.keyFile, "client key `file`")
	fs.StringVar(&c.conn.serverName, "server-name", c.conn.serverName, "server `name` to verify")
	durations.Var(fs, &c.conn.timeout, "timeout", c.conn.timeout, durations.Options{}, "bound on each call")
	durations.Var(fs, &c.conn.connectTimeout, "connect-timeout", c.conn.connectTimeout, durations.Options{}, "how long a new connection may go unanswered")
	fs.StringVar(&c.output, "o", c.output, "output `format`")
	fs.StringVar(&c.output, "output", c.output, "output `format` (same as -o)")
	return fs
}

// applyEnv sets flags from their environment variables. The connection
// flags are set once, on the global flag set, so that a variable never
// overrides a connection flag given before the command.
func (c *cli) applyEnv(fs *flag.FlagSet) error {
	global := fs.Name() == "snapctl"
	var errs []error
	fs.VisitAll(func(f *flag.Flag) {
		name, ok := envNames[f.Name]
		if !ok || connFlags[f.Name] != global {
			return
		}
		f.Usage += " (env " + name + ")"
		if v, ok := c.lookup(name); ok && v != "" {
			// Value.Set, not fs.Set: the flag is not marked as given, so
			// that setFlags holds the command line alone and a flag there
			// can beat the variable of a flag it excludes (settle).
			if err := f.Value.Set(v); err != nil {
				errs = append(errs, fmt.Errorf("%s=%q: %w", name, v, err))
			}
		}
	})
	return errors.Join(errs...)
}

// parseInterleaved parses flags wherever they are among the arguments (the
// flag package stops at the first argument) and returns the arguments. "--"
// ends the flags.
func parseInterleaved(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		rest := fs.Args()
		if consumed := len(args) - len(rest); consumed > 0 && args[consumed-1] == "--" {
			return append(pos, rest...), nil
		}
		if len(rest) == 0 {
			return pos, nil
		}
		pos, args = append(pos, rest[0]), rest[1:]
	}
}

// checkOutput resolves -o against what the command accepts.
func (c *cli) checkOutput() error {
	if len(c.outputs) == 0 {
		c.outputs = []string{"table", "json"}
	}
	if c.output == "" {
		c.output = c.outputs[0]
	}
	for _, o := range c.outputs {
		if c.output == o {
			return nil
		}
	}
	return usageErr(fmt.Errorf("-o %q: want one of %v", c.output, c.outputs))
}

// wantArgs checks the number of positional arguments.
func wantArgs(args []string, names ...string) error {
	if len(args) != len(names) {
		return usageErr(fmt.Errorf("want %d argument(s) (%v), got %d", len(names), names, len(args)))
	}
	return nil
}

// settle decides between two groups of flags that exclude each other when
// both are in use (a and b name only the flags that are set). A flag on the
// command line beats its variable, and so also the variables of the flags it
// excludes: only the command line against itself, or the environment
// against itself, is refused. It reports whether a wins.
func (c *cli) settle(a, b []string, clash string) (bool, error) {
	onA, onB := c.anyGiven(a), c.anyGiven(b)
	switch {
	case onA != onB:
		return onA, nil
	case onA:
		return false, usageErr(errors.New(clash))
	}
	return false, usageErr(fmt.Errorf("%s and %s exclude each other and are both set: unset one, or choose with a flag",
		variables(a), variables(b)))
}

func (c *cli) anyGiven(names []string) bool {
	for _, n := range names {
		if c.setFlags[n] {
			return true
		}
	}
	return false
}

// variables names the environment variables of flags: "SNAPCOORD_CA_FILE,
// SNAPCOORD_SERVER_NAME".
func variables(flags []string) string {
	vars := make([]string, len(flags))
	for i, f := range flags {
		vars[i] = envNames[f]
	}
	return strings.Join(vars, ", ")
}
