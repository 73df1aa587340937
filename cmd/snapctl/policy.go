package main

import (
	"fmt"
	"io"
	"strings"
	"time"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
	"github.com/snapcoord/snapcoord/internal/apifacts"
)

// parsePolicy accepts "max", "expected-loss", "expected_loss" or the enum
// name.
func parsePolicy(s string) (v1.ReservePolicy, error) {
	if v, ok := apifacts.ParseEnum[v1.ReservePolicy](strings.ReplaceAll(s, "-", "_")); ok {
		return v, nil
	}
	return 0, fmt.Errorf("%q is not a policy (max, expected-loss)", s)
}

// defaultTau is τ when max_loss_seconds is 0, as run.proto documents it.
const defaultTau = 25 * time.Minute

func expectedLoss(r *v1.Run) bool {
	return r.GetSpec().GetReserve().GetPolicy() == v1.ReservePolicy_RESERVE_POLICY_EXPECTED_LOSS
}

// describePolicy: "max (the default)", or "expected loss, τ 25 min (the
// default)".
func describePolicy(r *v1.Run) string {
	res := r.GetSpec().GetReserve()
	switch res.GetPolicy() {
	case v1.ReservePolicy_RESERVE_POLICY_EXPECTED_LOSS:
		tau, def := res.GetMaxLossSeconds(), ""
		if tau == 0 {
			tau, def = defaultTau.Seconds(), " (the default)"
		}
		safety := ""
		if res.GetSafetySaves() {
			safety = ", with safety saves (save and continue)"
		}
		return fmt.Sprintf("expected loss, τ %s%s%s: a step saves once saving now is expected to lose no more than one more step",
			span(time.Duration(tau*float64(time.Second))), def, safety)
	case v1.ReservePolicy_RESERVE_POLICY_MAX:
		return "max: a step saves once now + I + C + R + M reaches B"
	}
	return "max (the default): a step saves once now + I + C + R + M reaches B"
}

// describeFiresAt is the "fires at" row: exact under Max, a lower bound
// under ExpectedLoss.
func describeFiresAt(r *v1.Run) string {
	f := r.GetDeadline().GetFiresAt()
	if expectedLoss(r) {
		return stamp(f) + ": no step completing before then saves and stops; one completing later may"
	}
	return stamp(f) + ": a step completing from then on saves and stops"
}

// describeLosses: "saving now 3.1 min (P(miss) 0 %), one more step 4.8 min
// (P(miss) 2.0 %)"; empty when the decision weighed none.
func describeLosses(in *v1.Deadline) string {
	if in.ExpectedLossNowSeconds == nil {
		return ""
	}
	out := fmt.Sprintf("saving now %.1f min (P(miss) %s), one more step %.1f min (P(miss) %s)",
		in.GetExpectedLossNowSeconds()/60, percent(in.GetMissProbabilityNow()),
		in.GetExpectedLossNextSeconds()/60, percent(in.GetMissProbabilityNext()))
	if in.ExpectedLossSafetySeconds != nil {
		out += fmt.Sprintf(", a safety save first %.1f min", in.GetExpectedLossSafetySeconds()/60)
	}
	return out
}

func percent(p float64) string {
	if p > 0 && p < 0.001 {
		return "< 0.1 %"
	}
	return fmt.Sprintf("%.1f %%", 100*p)
}

// explainExpectedLoss is explainDecision's body under ExpectedLoss: the
// estimates are worst cases, and the rule compares expected losses.
func explainExpectedLoss(w io.Writer, d *v1.Decision) {
	in := d.GetInputs()
	fmt.Fprintf(w, "%s: %s\n\n", actionWord(d.GetAction()), d.GetExplanation())
	if in.GetMustSaveBy() == nil {
		return
	}
	if in.RegularSaveSeconds != nil {
		fmt.Fprintf(w, "  S  %8s  the regular save after this step, at its longest (C + R)\n", secs(in.GetRegularSaveSeconds()))
	}
	fmt.Fprintf(w, "  I  %8s  iteration, at its longest (the latest 32 steps, drift and a slower one allowed for)\n", secs(in.GetIterationSeconds()))
	fmt.Fprintf(w, "  C  %8s  trainer checkpoint, at its longest (a stall allowed for; the prior until measured)\n", secs(in.GetCheckpointSeconds()))
	fmt.Fprintf(w, "  R  %8s  environment snapshot, at its longest (a stall allowed for; the prior until measured)\n", secs(in.GetSaveReserveSeconds()))
	fmt.Fprintf(w, "  M  %8s  safety margin from the spec\n", secs(in.GetMarginSeconds()))
	fmt.Fprintf(w, "  B  %s  the deadline\n", stamp(in.GetMustSaveBy()))
	if t := in.GetLastDurableSave(); t != nil {
		fmt.Fprintf(w, "     %s  the last durable save: a miss loses the work since (%s at the decision)\n",
			stamp(t), span(d.GetDecidedAt().AsTime().Sub(t.AsTime())))
	}
	if l := describeLosses(in); l != "" {
		fmt.Fprintf(w, "  expected loss: %s\n", l)
	}
	fmt.Fprintf(w, "\nRule (expected loss): continue while one more step and the save fit even at their longest;\n"+
		"then save now once its expected loss (walltime left unused, or on a miss the work since the last\n"+
		"durable save plus penalties, more beyond τ) is no more than that of saving after one more step.\n")
}
