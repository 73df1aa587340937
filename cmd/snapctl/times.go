package main

import (
	"strconv"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"
)

// Inside a Slurm allocation these hold the job's start and end as Unix
// epoch seconds.
const (
	slurmStart = "SLURM_JOB_START_TIME"
	slurmEnd   = "SLURM_JOB_END_TIME"
)

// parseTime reads a time flag: RFC 3339, or "slurm" for the Slurm variable
// slurmVar, optionally minus a duration ("slurm-10m": ten minutes before
// the job ends, to leave the launcher time after the save).
func (c *cli) parseTime(flagName, value, slurmVar string) (*timestamppb.Timestamp, error) {
	if rest, ok := strings.CutPrefix(value, "slurm"); ok {
		return c.slurmTime(flagName, rest, slurmVar)
	}
	t, err := time.Parse(time.RFC3339, value)
	if err != nil {
		return nil, inputErr("--%s %q: want an RFC 3339 time (2026-11-30T08:00:00Z) or \"slurm\"", flagName, value)
	}
	return timestamppb.New(t), nil
}

func (c *cli) slurmTime(flagName, offset, slurmVar string) (*timestamppb.Timestamp, error) {
	var before time.Duration
	if offset != "" {
		d, err := time.ParseDuration(strings.TrimPrefix(offset, "-"))
		if !strings.HasPrefix(offset, "-") || err != nil || d < 0 {
			return nil, inputErr("--%s slurm%s: want \"slurm\" or \"slurm-DURATION\" (slurm-10m)", flagName, offset)
		}
		before = d
	}
	v, ok := c.lookup(slurmVar)
	if !ok || v == "" {
		return nil, inputErr("--%s slurm: %s is not set (not inside a Slurm job?)", flagName, slurmVar)
	}
	sec, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
	if err != nil || sec <= 0 {
		return nil, inputErr("--%s slurm: %s=%q is not epoch seconds", flagName, slurmVar, v)
	}
	return timestamppb.New(time.Unix(sec, 0).Add(-before)), nil
}
