package statuspage

import (
	"fmt"
	"math"
	"strings"
	"time"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
)

// human writes a duration to about three significant digits, so that a
// checkpoint of 3 ms reads "3ms" (not "0s") and one of 7 minutes "7m12s"
// (not "7m12.345678s"); whole minutes and hours drop their zero tails.
func human(d time.Duration) string {
	if d < 0 {
		return "-" + human(-d)
	}
	for _, r := range []struct{ below, unit time.Duration }{
		{time.Millisecond, time.Microsecond},
		{10 * time.Millisecond, 10 * time.Microsecond},
		{100 * time.Millisecond, 100 * time.Microsecond},
		{time.Second, time.Millisecond},
		{10 * time.Second, 10 * time.Millisecond},
		{time.Minute, 100 * time.Millisecond},
	} {
		if d < r.below {
			return d.Round(r.unit).String()
		}
	}
	s := d.Round(time.Second).String()
	if t, ok := strings.CutSuffix(s, "m0s"); ok { // whole minutes
		s = t + "m"
		if t, ok := strings.CutSuffix(s, "h0m"); ok { // whole hours
			s = t + "h"
		}
	}
	return s
}

// seconds is human for a duration the API gives in float seconds.
func seconds(s float64) string {
	if math.IsNaN(s) || math.IsInf(s, 0) {
		return "-"
	}
	return human(time.Duration(s * float64(time.Second)))
}

// until says how far away a moment is: "in 1h2m3s" or "4m5s ago".
func until(d time.Duration) string {
	if d < 0 {
		return human(-d) + " ago"
	}
	return "in " + human(d)
}

// endedRelativeTo: "ended 3s before B" or "ended 1m2s after B".
func endedRelativeTo(ended, b time.Time) string {
	if ended.After(b) {
		return "ended " + human(ended.Sub(b)) + " after B"
	}
	return "ended " + human(b.Sub(ended)) + " before B"
}

// cssName turns an enum's text ("io_error", "save_and_stop") into the
// class the style sheet selects ("io-error", "save-and-stop").
func cssName(s string) string { return strings.NewReplacer("_", "-", " ", "-").Replace(s) }

// why says in words what a decision weighed. The Max rule's own
// explanation is timestamp arithmetic ("now+I+C+R+M = 10:00:30.000 + ...");
// the same facts read better as the two durations it compared: what one
// more step and the save need, and what is left before B − M. Other
// explanations (a manual trigger, a run without B, the expected-loss
// policy's) are words already and are kept.
func why(d *v1.Decision) string {
	in := d.GetInputs()
	if in.GetMustSaveBy() == nil || !strings.HasPrefix(d.GetExplanation(), "now+") {
		return d.GetExplanation()
	}
	need := in.GetIterationSeconds() + in.GetCheckpointSeconds() + in.GetSaveReserveSeconds()
	what := "one more step and the save need"
	if in.RegularSaveSeconds != nil {
		need += in.GetRegularSaveSeconds()
		what = "the regular save, one more step and the save need"
	}
	left := in.GetMustSaveBy().AsTime().Add(-secondsDuration(in.GetMarginSeconds())).Sub(d.GetDecidedAt().AsTime())
	verdict := "continue"
	switch d.GetAction() {
	case v1.StepAction_STEP_ACTION_SAVE_AND_STOP:
		verdict = "save now"
	case v1.StepAction_STEP_ACTION_STOP:
		verdict = "stop"
	}
	return fmt.Sprintf("%s %s; %s left before B − M: %s", what, seconds(need), human(left), verdict)
}

func secondsDuration(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }
