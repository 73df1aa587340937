package deadline

import (
	"errors"
	"strconv"
	"strings"
	"time"
)

// MaxBudget bounds a budget so that B stays far from time.Duration overflow;
// no walltime is anywhere near it.
const MaxBudget = 10 * 366 * 24 * time.Hour

// ParseBudget parses checkpoint_must_save_by, "DD:HH:MM:SS": exactly four
// non-negative decimal integers (fields may exceed their usual range, e.g.
// "00:48:00:00", as the original parser allowed).
func ParseBudget(s string) (time.Duration, error) {
	parts := strings.Split(s, ":")
	if len(parts) != 4 {
		return 0, errors.New(`must be "DD:HH:MM:SS" (four non-negative integers), e.g. "00:03:45:00"`)
	}
	units := [4]time.Duration{24 * time.Hour, time.Hour, time.Minute, time.Second}
	var total time.Duration
	for i, p := range parts {
		n, err := parseField(p)
		if err != nil {
			return 0, errors.New(`must be "DD:HH:MM:SS" (four non-negative integers), e.g. "00:03:45:00"`)
		}
		if n > int64(MaxBudget/units[i]) {
			return 0, errors.New("is longer than 10 years")
		}
		total += time.Duration(n) * units[i]
		if total > MaxBudget {
			return 0, errors.New("is longer than 10 years")
		}
	}
	return total, nil
}

func parseField(p string) (int64, error) {
	if p == "" || len(p) > 12 {
		return 0, errors.New("bad field")
	}
	for _, c := range p {
		if c < '0' || c > '9' {
			return 0, errors.New("bad field")
		}
	}
	return strconv.ParseInt(p, 10, 64)
}
