package statuspage

import (
	"testing"
	"time"
)

// Durations on the page keep about three significant digits: a 3 ms
// checkpoint is not "0s", a 7-minute save is not "7m12.345678s".
func TestHumanDurations(t *testing.T) {
	for d, want := range map[time.Duration]string{
		0:                      "0s",
		350 * time.Microsecond: "350µs",
		3 * time.Millisecond:   "3ms",
		3*time.Millisecond + 456*time.Microsecond: "3.46ms",
		12345 * time.Microsecond:                  "12.3ms",
		250400 * time.Microsecond:                 "250ms",
		1254 * time.Millisecond:                   "1.25s",
		42345 * time.Millisecond:                  "42.3s",
		7*time.Minute + 12345*time.Millisecond:    "7m12s",
		7 * time.Minute:                           "7m",
		time.Hour:                                 "1h",
		time.Hour + 5*time.Minute:                 "1h5m",
		time.Hour + 5*time.Second:                 "1h0m5s",
		-1500 * time.Millisecond:                  "-1.5s",
	} {
		if got := human(d); got != want {
			t.Errorf("human(%v) = %q, want %q", d, got, want)
		}
	}
}
