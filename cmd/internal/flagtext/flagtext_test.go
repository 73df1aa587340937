package flagtext

import (
	"bytes"
	"flag"
	"io"
	"strings"
	"testing"
	"time"
)

func newFlags() *flag.FlagSet {
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Duration("lease-ttl", 15*time.Second, "a worker silent this `long` is LOST")
	fs.Bool("insecure", false, "allow it")
	fs.Int("max-runs", 10, "runs kept")
	fs.String("o", "table", "output `format`")
	return fs
}

func TestPrintDefaultsUsesTwoDashes(t *testing.T) {
	var out bytes.Buffer
	PrintDefaults(&out, newFlags(), func(f *flag.Flag) bool { return f.Name != "o" })
	want := "  --insecure\n    \tallow it\n" +
		"  --lease-ttl long\n    \ta worker silent this long is LOST (default 15s)\n" +
		"  --max-runs int\n    \truns kept (default 10)\n"
	if out.String() != want {
		t.Errorf("PrintDefaults wrote\n%s\nwant\n%s", out.String(), want)
	}
}

func TestErrorNamesTheFlagWithTwoDashes(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--lease-ttl", "soon"}, `--lease-ttl "soon": `},
		{[]string{"-insecure=maybe"}, `--insecure "maybe": `},
		{[]string{"--bogus"}, "unknown flag --bogus"},
		{[]string{"--max-runs"}, "--max-runs needs a value"},
	} {
		err := Error(newFlags().Parse(tc.args))
		if err == nil || !strings.HasPrefix(err.Error(), tc.want) {
			t.Errorf("Parse(%q): %v, want it to start with %q", tc.args, err, tc.want)
		}
	}
	if err := Error(newFlags().Parse([]string{"--help"})); err != flag.ErrHelp {
		t.Errorf("--help: %v, want flag.ErrHelp itself", err)
	}
}
