package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"strings"
	"text/tabwriter"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// printJSON prints m as protojson, indented (indent "  ") or on one line
// (indent ""), with proto field names and every field, zero values too (a
// script reading rank 0 or last_step 0 must find the key): re-indented with
// encoding/json, because protojson varies its whitespace on purpose.
func (c *cli) printJSON(m proto.Message, indent string) error {
	b, err := protojson.MarshalOptions{UseProtoNames: true, EmitUnpopulated: true}.Marshal(m)
	if err != nil {
		return fmt.Errorf("encode %s: %w", m.ProtoReflect().Descriptor().Name(), err)
	}
	var out bytes.Buffer
	if indent == "" {
		err = json.Compact(&out, b)
	} else {
		err = json.Indent(&out, b, "", indent)
	}
	if err != nil {
		return fmt.Errorf("encode %s: %w", m.ProtoReflect().Descriptor().Name(), err)
	}
	out.WriteByte('\n')
	_, err = c.stdout.Write(out.Bytes())
	return err
}

// table writes tab-separated rows as aligned columns, under header unless
// it is empty.
func table(w io.Writer, header string, rows [][]string) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	if header != "" {
		fmt.Fprintln(tw, header)
	}
	for _, r := range rows {
		fmt.Fprintln(tw, strings.Join(r, "\t"))
	}
	return tw.Flush()
}

// stamp is a time in local time with its zone, "-" when unset.
func stamp(ts *timestamppb.Timestamp) string {
	if ts == nil {
		return "-"
	}
	return ts.AsTime().Local().Format("2006-01-02 15:04:05 MST")
}

// clockTime is the time of day in local time with its zone; with tenths
// when two times a few seconds apart are compared.
func clockTime(t time.Time, tenths bool) string {
	if tenths {
		return t.Local().Format("15:04:05.0 MST")
	}
	return t.Local().Format("15:04:05 MST")
}

// secs shows an estimate in seconds: "41.5 s", "120 s".
func secs(f float64) string {
	if f >= 10 {
		return fmt.Sprintf("%.0f s", f)
	}
	return fmt.Sprintf("%.3g s", f)
}

// span shows a duration the way a person says it: "0.6 s", "12 s",
// "7 min 5 s", "2 h 5 min".
func span(d time.Duration) string {
	if d = d.Abs(); d < 10*time.Second {
		return fmt.Sprintf("%.1f s", d.Seconds())
	}
	d = d.Round(time.Second)
	h, m, s := int(d.Hours()), int(math.Mod(d.Minutes(), 60)), int(math.Mod(d.Seconds(), 60))
	switch {
	case h > 0 && m > 0:
		return fmt.Sprintf("%d h %d min", h, m)
	case h > 0:
		return fmt.Sprintf("%d h", h)
	case m > 0 && s > 0 && m < 10:
		return fmt.Sprintf("%d min %d s", m, s)
	case m > 0:
		return fmt.Sprintf("%d min", m)
	}
	return fmt.Sprintf("%d s", s)
}

// relative says how far t is from now: "in 3 min", "12 s ago".
func relative(t, now time.Time) string {
	if t.After(now) {
		return "in " + span(t.Sub(now))
	}
	return span(now.Sub(t)) + " ago"
}
