// Package flagtext shows the flags of snapctl and snapcoord the way their
// documentation writes them, with two dashes: Go's flag package prints
// "-lease-ttl" in its help and its errors, though it takes both spellings.
package flagtext

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"regexp"
)

// PrintDefaults writes fs's flags for which keep returns true (every flag
// when keep is nil) as flag.PrintDefaults would, with two dashes.
func PrintDefaults(w io.Writer, fs *flag.FlagSet, keep func(*flag.Flag) bool) {
	fs.VisitAll(func(f *flag.Flag) {
		if keep != nil && !keep(f) {
			return
		}
		name, usage := flag.UnquoteUsage(f)
		line := "  --" + f.Name
		if name != "" {
			line += " " + name
		}
		fmt.Fprintf(w, "%s\n    \t%s", line, usage)
		if !isZero(f.DefValue) {
			fmt.Fprintf(w, " (default %s)", f.DefValue)
		}
		fmt.Fprintln(w)
	})
}

// isZero says whether a default is not worth showing, as flag.PrintDefaults
// leaves out zero values.
func isZero(def string) bool {
	switch def {
	case "", "0", "0s", "false":
		return true
	}
	return false
}

// flagErrors are the flag package's messages that name a flag, each with
// the rewrite that names it with two dashes.
var flagErrors = []struct {
	re      *regexp.Regexp
	rewrite string
}{
	{regexp.MustCompile(`^invalid value ("(?:[^"\\]|\\.)*") for flag -([^:]+): `), `--$2 $1: `},
	{regexp.MustCompile(`^invalid boolean value ("(?:[^"\\]|\\.)*") for -([^:]+): `), `--$2 $1: `},
	{regexp.MustCompile(`^flag provided but not defined: -+(.*)$`), `unknown flag --$1`},
	{regexp.MustCompile(`^flag needs an argument: -+(.*)$`), `--$1 needs a value`},
}

// Error rewrites an error of flag.FlagSet.Parse to name the flag with two
// dashes: `--lease-ttl "soon": ...` instead of `invalid value "soon" for
// flag -lease-ttl: ...`. Other errors, flag.ErrHelp included, are returned
// as they are.
func Error(err error) error {
	if err == nil || errors.Is(err, flag.ErrHelp) {
		return err
	}
	msg := err.Error()
	for _, fe := range flagErrors {
		if fe.re.MatchString(msg) {
			return errors.New(fe.re.ReplaceAllString(msg, fe.rewrite))
		}
	}
	return err
}
