package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/snapcoord/snapcoord/cmd/internal/durations"
)

// slurmField is one of a Slurm job's times, and where to read it.
//
// Slurm 22.05 (Debian bookworm) does not set SLURM_JOB_START_TIME or
// SLURM_JOB_END_TIME in a job at all, and no job's environment can follow
// an `scontrol update JobId=... TimeLimit=...` made after the job started
// (checked on a real Slurm, see docs/slurm.md). So snapctl asks Slurm for
// the job's current times: squeue, else `scontrol show job`. The
// variables, which newer Slurm versions set at launch, are the last resort,
// and only where a time fixed at launch is right (never for run extend).
type slurmField struct {
	env      string // set at launch by newer Slurm versions
	squeue   string // squeue -o format
	scontrol string // key in `scontrol show job`
}

var (
	slurmStart = slurmField{env: "SLURM_JOB_START_TIME", squeue: "%S", scontrol: "StartTime"}
	slurmEnd   = slurmField{env: "SLURM_JOB_END_TIME", squeue: "%e", scontrol: "EndTime"}
)

// slurmQueryTimeout bounds one squeue or scontrol call: a slurmctld that
// does not answer must not hang a launch script.
const slurmQueryTimeout = 20 * time.Second

// parseTime reads a time flag: RFC 3339, or "slurm" for the job's time
// field, optionally minus a duration ("slurm-10m": ten minutes before the
// job ends, to leave the launcher time after the save). live says the time
// must be the job's current one (run extend, after scontrol update): then
// a variable set at launch is not good enough.
func (c *cli) parseTime(flagName, value string, field slurmField, live bool) (*timestamppb.Timestamp, error) {
	if rest, ok := strings.CutPrefix(value, "slurm"); ok {
		return c.slurmTime(flagName, rest, field, live)
	}
	t, err := time.Parse(time.RFC3339, value)
	if err != nil {
		return nil, inputErr("--%s %q: want an RFC 3339 time (2026-11-30T08:00:00Z) or \"slurm\"", flagName, value)
	}
	return timestamppb.New(t), nil
}

func (c *cli) slurmTime(flagName, offset string, field slurmField, live bool) (*timestamppb.Timestamp, error) {
	var before time.Duration
	if offset != "" {
		d, err := durations.Parse(strings.TrimPrefix(offset, "-"), durations.Options{})
		if !strings.HasPrefix(offset, "-") || err != nil {
			return nil, inputErr("--%s slurm%s: want \"slurm\" or \"slurm-DURATION\" (slurm-10m, slurm-00:10:00)", flagName, offset)
		}
		before = d
	}
	t, err := c.slurmJobTime(field, live)
	if err != nil {
		return nil, withExit(exitInvalid, fmt.Errorf("--%s slurm: %w", flagName, err))
	}
	return timestamppb.New(t.Add(-before)), nil
}

// slurmJobTime asks Slurm about the job in SLURM_JOB_ID, and falls back to
// the variable set at launch unless live.
func (c *cli) slurmJobTime(field slurmField, live bool) (time.Time, error) {
	job, _ := c.lookup("SLURM_JOB_ID")
	var queryErr error
	if job = strings.TrimSpace(job); job != "" {
		t, err := querySlurm(job, field)
		if err == nil {
			return t, nil
		}
		queryErr = err
	}
	v, ok := c.lookup(field.env)
	switch {
	case live && queryErr != nil:
		return time.Time{}, fmt.Errorf("%w (%s, set at launch, does not follow scontrol update)", queryErr, field.env)
	case live:
		return time.Time{}, errors.New("SLURM_JOB_ID is not set (not inside a Slurm job?)")
	case ok && v != "":
		sec, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		if err != nil || sec <= 0 {
			return time.Time{}, fmt.Errorf("%s=%q is not epoch seconds", field.env, v)
		}
		return time.Unix(sec, 0), nil
	case queryErr != nil:
		return time.Time{}, queryErr
	}
	return time.Time{}, fmt.Errorf("neither SLURM_JOB_ID nor %s is set (not inside a Slurm job?)", field.env)
}

// querySlurm reads one of the job's times from squeue, else from scontrol.
// SLURM_TIME_FORMAT=%s makes both print epoch seconds: their default is
// local time without a zone, which would be read in whatever zone this
// process has.
func querySlurm(job string, field slurmField) (time.Time, error) {
	out, sqErr := runSlurm("squeue", "-h", "-j", job, "-o", field.squeue)
	if sqErr == nil {
		line, _, _ := strings.Cut(strings.TrimSpace(out), "\n") // a heterogeneous job prints a line per component
		t, err := parseSlurmTime(line)
		if err != nil {
			return time.Time{}, fmt.Errorf("squeue -j %s -o %s: %w", job, field.squeue, err)
		}
		return t, nil
	}
	out, scErr := runSlurm("scontrol", "show", "job", job)
	if scErr != nil {
		return time.Time{}, fmt.Errorf("cannot read job %s's %s: %w; %w", job, field.scontrol, sqErr, scErr)
	}
	for _, kv := range strings.Fields(out) {
		if v, ok := strings.CutPrefix(kv, field.scontrol+"="); ok {
			t, err := parseSlurmTime(v)
			if err != nil {
				return time.Time{}, fmt.Errorf("scontrol show job %s: %s: %w", job, field.scontrol, err)
			}
			return t, nil
		}
	}
	return time.Time{}, fmt.Errorf("scontrol show job %s: no %s", job, field.scontrol)
}

func runSlurm(name string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), slurmQueryTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = append(os.Environ(), "SLURM_TIME_FORMAT=%s")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		msg := strings.TrimSpace(stderr.String())
		if msg == "" {
			return "", fmt.Errorf("%s: %w", name, err)
		}
		return "", fmt.Errorf("%s: %w: %s", name, err, msg)
	}
	return stdout.String(), nil
}

// parseSlurmTime reads epoch seconds, or, from a Slurm that ignored
// SLURM_TIME_FORMAT, its default local-time format in this process's zone
// (the zone squeue, its child, printed in).
func parseSlurmTime(s string) (time.Time, error) {
	s = strings.TrimSpace(s)
	if sec, err := strconv.ParseInt(s, 10, 64); err == nil && sec > 0 {
		return time.Unix(sec, 0), nil
	}
	if t, err := time.ParseInLocation("2006-01-02T15:04:05", s, time.Local); err == nil {
		return t, nil
	}
	// "N/A", "Unknown", "None": a pending job has no start, a job
	// without a time limit no end.
	return time.Time{}, fmt.Errorf("%q is not a time (a pending job, or no time limit?)", s)
}
