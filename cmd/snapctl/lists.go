package main

import (
	"context"
	"flag"
	"fmt"
	"strconv"
	"strings"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
	"github.com/snapcoord/snapcoord/client"
	"github.com/snapcoord/snapcoord/internal/apifacts"
)

func setupWorkers(_ *flag.FlagSet, c *cli) func(context.Context, []string) error {
	return func(ctx context.Context, args []string) error {
		if err := wantArgs(args, "RUN_ID"); err != nil {
			return err
		}
		return c.withClient(ctx, func(ctx context.Context, cl *client.Client) error {
			workers, err := cl.RunWorkers(ctx, args[0])
			if err != nil {
				return err
			}
			if c.output == "json" {
				return c.printJSON(&v1.ListWorkersResponse{Workers: workers}, "  ")
			}
			rows := make([][]string, 0, len(workers))
			for _, w := range workers {
				rank := "-"
				if w.GetRole() == v1.WorkerRole_WORKER_ROLE_TRAINER {
					rank = strconv.Itoa(int(w.GetRank()))
				}
				rows = append(rows, []string{w.GetWorkerId(), w.GetName(), apifacts.EnumLower(w.GetRole()), rank,
					apifacts.EnumName(w.GetState()), strconv.FormatInt(w.GetIncarnation(), 10),
					stamp(w.GetRegisteredAt()), stamp(w.GetLeaseExpiresAt())})
			}
			return table(c.stdout, "ID\tNAME\tROLE\tRANK\tSTATE\tINCARNATION\tREGISTERED\tLEASE EXPIRES", rows)
		})
	}
}

func setupSnapshots(_ *flag.FlagSet, c *cli) func(context.Context, []string) error {
	return func(ctx context.Context, args []string) error {
		if err := wantArgs(args, "RUN_ID"); err != nil {
			return err
		}
		return c.withClient(ctx, func(ctx context.Context, cl *client.Client) error {
			snaps, err := cl.Snapshots(ctx, args[0])
			if err != nil {
				return err
			}
			if c.output == "json" {
				return c.printJSON(&v1.ListSnapshotsResponse{Snapshots: snaps}, "  ")
			}
			rows := make([][]string, 0, len(snaps))
			for _, s := range snaps {
				rows = append(rows, snapshotRow(s))
			}
			return table(c.stdout, "ID\tREASON\tANCHOR\tFORCED\tISSUED\tOUTCOME\tDURATION\tREPORTS\tMESSAGE", rows)
		})
	}
}

func snapshotRow(s *v1.Snapshot) []string {
	outcome, took := "in flight", "-"
	if s.GetCompletedAt() != nil {
		outcome, took = apifacts.EnumName(s.GetOutcome()), secs(s.GetDurationSeconds())
	}
	var reports []string
	for _, r := range s.GetReports() {
		reports = append(reports, fmt.Sprintf("%s %s %s", r.GetWorkerId(), apifacts.EnumName(r.GetOutcome()), secs(r.GetDurationSeconds())))
	}
	return []string{s.GetSnapshotId(), apifacts.EnumLower(s.GetReason()), strconv.FormatInt(s.GetAnchorStep(), 10),
		strconv.FormatBool(s.GetForced()), stamp(s.GetIssuedAt()), outcome, took,
		fmt.Sprintf("%d/%d: %s", len(s.GetReports()), len(s.GetExpectedWorkerIds()), strings.Join(reports, ", ")),
		s.GetMessage()}
}

func setupEvents(fs *flag.FlagSet, c *cli) func(context.Context, []string) error {
	follow := fs.Bool("follow", false, "keep printing new events until the run ends")
	after := fs.Int64("after", 0, "only events after this sequence `number`")
	return func(ctx context.Context, args []string) error {
		if err := wantArgs(args, "RUN_ID"); err != nil {
			return err
		}
		cl, err := c.connect(ctx)
		if err != nil {
			return err
		}
		defer cl.Close()
		return c.printEvents(ctx, cl, args[0], *after, *follow)
	}
}

// printEvents prints events as they arrive: one line each, or one JSON
// object per line with -o json. Following is not bounded by --timeout.
func (c *cli) printEvents(ctx context.Context, cl *client.Client, runID string, after int64, follow bool) error {
	if !follow {
		var cancel context.CancelFunc
		ctx, cancel = c.call(ctx)
		defer cancel()
	}
	err := cl.WatchEvents(ctx, runID, after, follow, func(ev *v1.RunEvent) error {
		if c.output == "json" {
			return c.printJSON(ev, "")
		}
		_, err := fmt.Fprintf(c.stdout, "%5d  %s  %-18s  %s\n", ev.GetSeq(), stamp(ev.GetAt()),
			apifacts.EnumLower(ev.GetType()), ev.GetMessage())
		return err
	})
	if err != nil && ctx.Err() != nil && follow {
		return nil // interrupted by the operator (Ctrl-C)
	}
	return err
}
