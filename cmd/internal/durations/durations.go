// Package durations reads every duration that snapctl and snapcoord take on
// the command line, in one grammar, so that a budget copied from a Slurm
// script, a NeMo RL config or a Go program means the same everywhere:
//
//   - Go durations: 3h45m, 30s, 1.5h, 500ms
//   - Slurm's --time forms: HH:MM:SS, MM:SS, D-HH, D-HH:MM, D-HH:MM:SS
//   - NeMo RL's DD:HH:MM:SS (checkpoint_must_save_by)
//   - a bare number as seconds (90, 0.5), only where the flag counts in
//     seconds (Options.BareSeconds); elsewhere only 0 is taken bare
//
// Slurm also reads a bare number as minutes; a flag that does not count in
// seconds refuses one, rather than guess which of the two was meant. Clock
// fields are not range-checked (90:00 is ninety minutes), as neither Slurm
// nor the coordinator's DD:HH:MM:SS checks them.
package durations

import (
	"errors"
	"flag"
	"fmt"
	"math"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// Options say which readings a flag allows beyond the common grammar.
type Options struct {
	// BareSeconds reads a bare number as seconds (--margin 30).
	BareSeconds bool
	// Negative allows a leading "-" (--add -10m moves B earlier).
	Negative bool
	// WholeSeconds refuses a fraction of a second, for values sent as
	// integer seconds or as DD:HH:MM:SS.
	WholeSeconds bool
}

// Parse reads s in any accepted form. Its errors do not quote s: the flag
// package and the callers that name an environment variable do.
func Parse(s string, o Options) (time.Duration, error) {
	t := strings.TrimSpace(s)
	neg := false
	if rest, ok := strings.CutPrefix(t, "-"); ok {
		if !o.Negative {
			return 0, errors.New("must not be negative")
		}
		neg, t = true, rest
	}
	d, err := parseUnsigned(t, o.BareSeconds)
	if err != nil {
		return 0, fmt.Errorf("%w; %s", err, Forms(o))
	}
	if o.WholeSeconds && d%time.Second != 0 {
		return 0, errors.New("must be whole seconds")
	}
	if neg {
		d = -d
	}
	return d, nil
}

// Forms lists an example of each accepted form, for error messages.
func Forms(o Options) string {
	s := "want a Go duration (3h45m, 30s), Slurm's [D-]HH:MM:SS (1-12:00:00, 12:00:00, 45:00 for MM:SS, 2-06 for D-HH) or DD:HH:MM:SS (00:03:45:00)"
	if o.BareSeconds {
		s += ", or a number of seconds (90)"
	}
	return s
}

var (
	bareNumber = regexp.MustCompile(`^(\d+\.?\d*|\.\d+)$`)
	errTooLong = errors.New("too long")
)

func parseUnsigned(s string, bareSeconds bool) (time.Duration, error) {
	switch {
	case s == "":
		return 0, errors.New("empty")
	case strings.ContainsAny(s, ":-"):
		return parseClock(s)
	case bareNumber.MatchString(s):
		return parseBare(s, bareSeconds)
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 {
		return 0, errors.New("not a duration")
	}
	return d, nil
}

func parseBare(s string, bareSeconds bool) (time.Duration, error) {
	f, err := strconv.ParseFloat(s, 64)
	switch {
	case err != nil:
		return 0, errors.New("not a number")
	case f == 0:
		return 0, nil
	case !bareSeconds:
		// Go reads no bare number but 0, Slurm reads minutes: ask.
		return 0, fmt.Errorf("a bare number is ambiguous here (Slurm reads it as minutes): write %ss or %sm", s, s)
	case f*float64(time.Second) > math.MaxInt64:
		return 0, errTooLong
	}
	return time.Duration(math.Round(f * float64(time.Second))), nil
}

// parseClock reads D-HH[:MM[:SS]], MM:SS, HH:MM:SS and DD:HH:MM:SS.
func parseClock(s string) (time.Duration, error) {
	day, clock, hasDay := strings.Cut(s, "-")
	if !hasDay {
		clock = s
	}
	fields := strings.Split(clock, ":")
	var units []time.Duration
	switch {
	case hasDay && len(fields) <= 3:
		fields = append([]string{day}, fields...)
		units = []time.Duration{24 * time.Hour, time.Hour, time.Minute, time.Second}[:len(fields)]
	case hasDay:
		return 0, errors.New("D-HH:MM:SS has at most three fields after the dash")
	case len(fields) == 2:
		units = []time.Duration{time.Minute, time.Second}
	case len(fields) == 3:
		units = []time.Duration{time.Hour, time.Minute, time.Second}
	case len(fields) == 4:
		units = []time.Duration{24 * time.Hour, time.Hour, time.Minute, time.Second}
	default:
		return 0, errors.New("too many fields")
	}
	var total time.Duration
	for i, f := range fields {
		n, err := clockField(f)
		if err != nil {
			return 0, err
		}
		if n > int64(math.MaxInt64/units[i]) || total > math.MaxInt64-time.Duration(n)*units[i] {
			return 0, errTooLong
		}
		total += time.Duration(n) * units[i]
	}
	return total, nil
}

func clockField(f string) (int64, error) {
	if f == "" || len(f) > 12 || strings.Trim(f, "0123456789") != "" {
		return 0, fmt.Errorf("field %q is not a non-negative integer", f)
	}
	return strconv.ParseInt(f, 10, 64)
}

// Format shows d as a Go duration without zero tails: "10m", "1h", "1h30m",
// "0" (time.Duration's String says "10m0s", "1h0m0s", "0s").
func Format(d time.Duration) string {
	if d == 0 {
		return "0"
	}
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

// FormatDHMS shows d as DD:HH:MM:SS, the budget format of the API
// (checkpoint_must_save_by), truncated to whole seconds. Days take as many
// digits as they need.
func FormatDHMS(d time.Duration) string {
	sec := int64(d / time.Second)
	return fmt.Sprintf("%02d:%02d:%02d:%02d", sec/86400, sec/3600%24, sec/60%60, sec%60)
}

// Value is a flag.Value holding a duration read with Parse.
type Value struct {
	d    *time.Duration
	opts Options
}

// Var defines a duration flag on fs, like fs.DurationVar, that reads the
// common grammar with opts.
func Var(fs *flag.FlagSet, p *time.Duration, name string, value time.Duration, opts Options, usage string) {
	*p = value
	fs.Var(&Value{d: p, opts: opts}, name, usage)
}

// Set implements flag.Value.
func (v *Value) Set(s string) error {
	d, err := Parse(s, v.opts)
	if err != nil {
		return err
	}
	*v.d = d
	return nil
}

// String implements flag.Value. The flag package calls it on a zero Value.
func (v *Value) String() string {
	if v == nil || v.d == nil {
		return "0"
	}
	return Format(*v.d)
}
