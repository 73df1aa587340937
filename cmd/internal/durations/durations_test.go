package durations

import (
	"flag"
	"io"
	"strings"
	"testing"
	"time"
)

func TestParse(t *testing.T) {
	const (
		day  = 24 * time.Hour
		h    = time.Hour
		m    = time.Minute
		s    = time.Second
		none = ""
	)
	seconds := Options{BareSeconds: true}
	for _, tc := range []struct {
		in      string
		opts    Options
		want    time.Duration
		wantErr string
	}{
		// Go durations.
		{"3h45m", Options{}, 3*h + 45*m, none},
		{"30s", Options{}, 30 * s, none},
		{"1.5h", Options{}, 90 * m, none},
		{"500ms", Options{}, 500 * time.Millisecond, none},
		{" 30s ", Options{}, 30 * s, none}, // from an environment variable
		// Slurm's --time forms.
		{"12:00:00", Options{}, 12 * h, none},
		{"45:00", Options{}, 45 * m, none}, // MM:SS, as Slurm reads it
		{"1-12:00:00", Options{}, day + 12*h, none},
		{"2-06", Options{}, 2*day + 6*h, none},
		{"2-06:30", Options{}, 2*day + 6*h + 30*m, none},
		{"90:00", Options{}, 90 * m, none}, // fields are not range-checked
		// NeMo RL's DD:HH:MM:SS.
		{"00:03:45:00", Options{}, 3*h + 45*m, none},
		{"3650:00:00:00", Options{}, 3650 * day, none},
		// Bare numbers: seconds where allowed, else only 0.
		{"90", seconds, 90 * s, none},
		{"0.5", seconds, 500 * time.Millisecond, none},
		{".25", seconds, 250 * time.Millisecond, none},
		{"0", Options{}, 0, none},
		{"30", Options{}, 0, "ambiguous here (Slurm reads it as minutes): write 30s or 30m"},
		// Signs and fractions.
		{"-10m", Options{Negative: true}, -10 * m, none},
		{"-00:00:10:00", Options{Negative: true}, -10 * m, none},
		{"-10m", Options{}, 0, "must not be negative"},
		{"1.5s", Options{WholeSeconds: true}, 0, "must be whole seconds"},
		{"1.5", Options{BareSeconds: true, WholeSeconds: true}, 0, "must be whole seconds"},
		{"2m", Options{WholeSeconds: true}, 2 * m, none},
		// Not durations.
		{"", Options{}, 0, "empty"},
		{"3 hours", Options{}, 0, "not a duration"},
		{"1:2:3:4:5", Options{}, 0, "too many fields"},
		{"1-2:3:4:5", Options{}, 0, "at most three fields after the dash"},
		{"00:03:4a:00", Options{}, 0, `field "4a" is not a non-negative integer`},
		{"1-", Options{}, 0, `field "" is not a non-negative integer`},
		{"00:+3:00:00", Options{}, 0, `field "+3" is not a non-negative integer`},
		{"999999999999:00:00:00", Options{}, 0, "too long"},
		{"1e3", seconds, 0, "not a duration"},
		{"99999999999", seconds, 0, "too long"},
		{"unlimited", Options{}, 0, "not a duration"},
	} {
		got, err := Parse(tc.in, tc.opts)
		switch {
		case tc.wantErr == none && (err != nil || got != tc.want):
			t.Errorf("Parse(%q, %+v) = %v, %v; want %v", tc.in, tc.opts, got, err, tc.want)
		case tc.wantErr != none && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
			t.Errorf("Parse(%q, %+v) = %v, %v; want an error saying %q", tc.in, tc.opts, got, err, tc.wantErr)
		}
	}
}

// A refused value is answered with an example of every form it could have
// taken, bare seconds only where the flag takes them.
func TestErrorsShowEveryForm(t *testing.T) {
	for _, o := range []Options{{}, {BareSeconds: true}} {
		_, err := Parse("soon", o)
		if err == nil {
			t.Fatalf("Parse(soon) accepted")
		}
		for _, example := range []string{"3h45m", "30s", "1-12:00:00", "12:00:00", "45:00", "2-06", "00:03:45:00"} {
			if !strings.Contains(err.Error(), example) {
				t.Errorf("Parse(soon, %+v): %q lacks the example %s", o, err, example)
			}
		}
		if got := strings.Contains(err.Error(), "number of seconds (90)"); got != o.BareSeconds {
			t.Errorf("Parse(soon, %+v): %q offers bare seconds: %v, want %v", o, err, got, o.BareSeconds)
		}
	}
}

func TestFormat(t *testing.T) {
	for d, want := range map[time.Duration]string{
		0: "0", 30 * time.Second: "30s", 10 * time.Minute: "10m", time.Hour: "1h", 90 * time.Minute: "1h30m",
		time.Hour + 30*time.Second: "1h0m30s", 1500 * time.Millisecond: "1.5s", -10 * time.Minute: "-10m",
	} {
		if got := Format(d); got != want {
			t.Errorf("Format(%v) = %q, want %q", d, got, want)
		}
	}
	for d, want := range map[time.Duration]string{
		0: "00:00:00:00", 3*time.Hour + 45*time.Minute: "00:03:45:00", 36*time.Hour + 61*time.Second: "01:12:01:01",
		3650 * 24 * time.Hour: "3650:00:00:00",
	} {
		if got := FormatDHMS(d); got != want {
			t.Errorf("FormatDHMS(%v) = %q, want %q", d, got, want)
		}
	}
}

// Whatever Parse accepts, both formats read back to the same duration.
func FuzzParse(f *testing.F) {
	for _, seed := range []string{"3h45m", "1-12:00:00", "45:00", "00:03:45:00", "90", "0.5", "-10m", "2-06", "1.5h", "7"} {
		f.Add(seed)
	}
	o := Options{BareSeconds: true, Negative: true}
	f.Fuzz(func(t *testing.T, s string) {
		d, err := Parse(s, o)
		if err != nil {
			return
		}
		if back, err := Parse(Format(d), o); err != nil || back != d {
			t.Errorf("Parse(%q) = %v; Format gives %q, read back as %v, %v", s, d, Format(d), back, err)
		}
		if d < 0 {
			return
		}
		whole := d.Truncate(time.Second)
		if back, err := Parse(FormatDHMS(d), Options{WholeSeconds: true}); err != nil || back != whole {
			t.Errorf("Parse(%q) = %v; FormatDHMS gives %q, read back as %v, %v; want %v", s, d, FormatDHMS(d), back, err, whole)
		}
	})
}

func TestFlag(t *testing.T) {
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	var timeout, margin time.Duration
	Var(fs, &timeout, "timeout", 30*time.Second, Options{}, "bound")
	Var(fs, &margin, "margin", 0, Options{BareSeconds: true}, "margin")
	if got := fs.Lookup("timeout").DefValue; got != "30s" {
		t.Errorf("default shown as %q, want 30s", got)
	}
	if err := fs.Parse([]string{"--timeout", "1-00:00:00", "--margin", "45"}); err != nil {
		t.Fatal(err)
	}
	if timeout != 24*time.Hour || margin != 45*time.Second {
		t.Errorf("--timeout 1-00:00:00 --margin 45 = %v, %v", timeout, margin)
	}
	err := fs.Parse([]string{"--timeout", "30"})
	if err == nil || !strings.Contains(err.Error(), "write 30s or 30m") {
		t.Errorf("--timeout 30: %v, want the ambiguity explained", err)
	}
}
