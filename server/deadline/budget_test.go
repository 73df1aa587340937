package deadline

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

func TestParseBudgetValid(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want time.Duration
	}{
		{"00:03:45:00", 3*time.Hour + 45*time.Minute},
		{"00:48:00:00", 48 * time.Hour}, // fields may exceed their usual range
		{"1:2:3:4", 24*time.Hour + 2*time.Hour + 3*time.Minute + 4*time.Second},
		{"00:00:00:00", 0},
		{"0:0:0:90", 90 * time.Second},
		{"00:00:90:00", 90 * time.Minute},
		{"000000000001:00:00:00", 24 * time.Hour}, // 12 digits, leading zeros
		{"3660:00:00:00", MaxBudget},              // exactly the cap
	} {
		got, err := ParseBudget(tc.in)
		if err != nil {
			t.Errorf("ParseBudget(%q): %v", tc.in, err)
			continue
		}
		if got != tc.want {
			t.Errorf("ParseBudget(%q) = %v, want %v", tc.in, got, tc.want)
		}
	}
}

func TestParseBudgetInvalid(t *testing.T) {
	for _, in := range []string{
		"",
		"3h",
		"1:2:3",
		"1:2:3:4:5",
		"a:b:c:d",
		"-1:00:00:00",
		"+1:00:00:00",
		" 1:00:00:00",
		"1:00:00:00 ",
		"1::00:00",
		"1:00:00:",
		"1.5:00:00:00",
		"１:00:00:00",             // a non-ASCII digit
		"0x1:00:00:00",           //
		"1_0:00:00:00",           //
		"3660:00:00:01",          // one second over the cap
		"3661:00:00:00",          // over the cap
		"0:87841:00:00",          // hours over the cap
		"99999999999:00:00:00",   // a field alone overflows the cap
		"0:0:0:999999999999",     // 12-digit seconds overflow the cap
		"0000000000001:00:00:00", // 13 digits
		"9223372036854775807:0:0:0",
		"99999999999999999999:0:0:0", // int64 overflow
	} {
		if d, err := ParseBudget(in); err == nil {
			t.Errorf("ParseBudget(%q) = %v, want an error", in, d)
		}
	}
}

func TestParseBudgetErrorText(t *testing.T) {
	_, err := ParseBudget("3h")
	if err == nil || !strings.Contains(err.Error(), "DD:HH:MM:SS") {
		t.Errorf("ParseBudget(3h) error %v, want it to show the format", err)
	}
	_, err = ParseBudget("9999:00:00:00")
	if err == nil || !strings.Contains(err.Error(), "10 years") {
		t.Errorf("ParseBudget(9999 days) error %v, want it to name the limit", err)
	}
}

// formatBudget writes d in canonical DD:HH:MM:SS form.
func formatBudget(d time.Duration) string {
	s := int64(d / time.Second)
	return fmt.Sprintf("%02d:%02d:%02d:%02d", s/86400, s%86400/3600, s%3600/60, s%60)
}

func FuzzParseBudget(f *testing.F) {
	for _, s := range []string{"00:03:45:00", "00:48:00:00", "1:2:3:4", "3660:00:00:00", "3h", "1:2:3",
		"-1:00:00:00", " 1:00:00:00", "", "a:b:c:d", "99999999999:00:00:00", "0:0:0:999999999999"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		d, err := ParseBudget(s) // must never panic
		if err != nil {
			return
		}
		if d < 0 || d > MaxBudget || d%time.Second != 0 {
			t.Fatalf("ParseBudget(%q) = %v: outside [0, MaxBudget] or not whole seconds", s, d)
		}
		canon := formatBudget(d)
		back, err := ParseBudget(canon)
		if err != nil || back != d {
			t.Fatalf("ParseBudget(%q) = %v, but its canonical form %q parses to %v, %v", s, d, canon, back, err)
		}
	})
}
