#!/usr/bin/env bash
# slurm-e2e.sh: the Slurm recipe (deploy/slurm/grpo.sbatch, docs/slurm.md)
# on a real Slurm, end to end. Run by `make slurm-e2e` after
# scripts/slurm-setup.sh and `make build`, as root, from the checkout.
#
#  1. What Slurm provides: whether SLURM_JOB_START_TIME/SLURM_JOB_END_TIME
#     are set in a job, and whether anything moves after
#     `scontrol update TimeLimit=`; a job extends itself and
#     `snapctl run extend --must-save-by slurm` must move B with it.
#  2. The recipe, requeued once: the first allocation creates the run and
#     trains; `scontrol requeue` kills it; the second allocation (same job
#     id) gets a new token for the same run, resumes from the checkpoint,
#     and the coordinator's rule fires the deadline in time: STOPPED, the
#     checkpoint and the environment snapshot saved, before the time limit.
#  3. The USR1 backstop: a run whose rule would fire too late is stopped by
#     the trap's `snapctl run trigger` when Slurm signals the batch shell.
#
# Every check prints what it proved; the first failure exits non-zero.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$PWD
BIN=$ROOT/bin
PY=/usr/bin/python3

fail() { printf 'slurm-e2e: FAIL: %s\n' "$*" >&2; exit 1; }
proved() { printf 'slurm-e2e: proved: %s\n' "$*"; }
say() { printf 'slurm-e2e: %s\n' "$*"; }

for f in "$BIN/snapcoord" "$BIN/snapctl" deploy/slurm/grpo.sbatch client/python/snapcoord/__init__.py; do
	[ -e "$f" ] || fail "$f is missing (run make build)"
done
sinfo -h -o %T | grep -qx idle || fail "no idle Slurm node: run scripts/slurm-setup.sh"

WORK=$(mktemp -d /tmp/snapcoord-slurm-e2e.XXXXXX)
chmod 755 "$WORK"
coord_pid=
cleanup() {
	local rc=$?
	if [ -n "$coord_pid" ]; then kill -TERM "$coord_pid" 2>/dev/null && wait "$coord_pid" || true; fi
	if [ "$rc" -eq 0 ]; then rm -rf "$WORK"; else say "kept $WORK for a look (job outputs, coordinator logs)"; fi
}
trap cleanup EXIT

# coordinator DATA_DIR TOKEN_FILE: starts snapcoord on loopback, exports
# SNAPCOORD_ADDR for snapctl.
coordinator() {
	local log=$WORK/coordinator-$(basename "$(dirname "$1")").log addr=
	: >"$log"
	"$BIN/snapcoord" serve --listen 127.0.0.1:0 --data-dir "$1" --admin-token-file "$2" --metrics-listen "" \
		--log-format json >>"$log" 2>&1 &
	coord_pid=$!
	for _ in $(seq 100); do
		addr=$(sed -n 's/.*"msg":"serving","addr":"\([^"]*\)".*/\1/p' "$log" | tail -1)
		[ -n "$addr" ] && break
		sleep 0.1
	done
	[ -n "$addr" ] || fail "coordinator on $1 did not start: $(cat "$log")"
	export SNAPCOORD_ADDR=$addr SNAPCOORD_PLAINTEXT=1 SNAPCOORD_TOKEN_FILE=$2
}
stop_coordinator() {
	kill -TERM "$coord_pid"
	wait "$coord_pid" || true
	coord_pid=
	# The jobs inherit this environment: they must start their own.
	unset SNAPCOORD_ADDR SNAPCOORD_PLAINTEXT SNAPCOORD_TOKEN_FILE
}

# json FILE EXPR: a value from snapctl's -o json output (Python reads it).
json() { "$PY" -c 'import json,sys; d=json.load(open(sys.argv[1])); print(eval(sys.argv[2], {"d": d}))' "$1" "$2"; }
# job_field ID KEY: a field of `scontrol show job` (epoch seconds for times).
job_field() { SLURM_TIME_FORMAT=%s scontrol show job "$1" | tr ' ' '\n' | sed -n "s/^$2=//p" | head -1; }
wait_job_done() {
	local id=$1 state
	for _ in $(seq 600); do
		state=$(job_field "$id" JobState)
		case $state in PENDING | CONFIGURING | RUNNING | COMPLETING | REQUEUED | "") sleep 1 ;; *) return 0 ;; esac
	done
	fail "job $id still $state after 10 minutes"
}

t_start=$SECONDS
say "$(sinfo -V), node $(hostname -s)"

# ---------------------------------------------------------------------------
say "1. what Slurm provides, and run extend after scontrol update"
mkdir -p "$WORK/shared"
(umask 077 && od -An -tx1 -N32 /dev/urandom | tr -d ' \n' >"$WORK/shared/admin-token")
coordinator "$WORK/shared/data" "$WORK/shared/admin-token"
cat >"$WORK/extend.sbatch" <<EOF
#!/bin/bash
set -eu
echo "start_var=\${SLURM_JOB_START_TIME:-unset} end_var=\${SLURM_JOB_END_TIME:-unset}"
"$BIN/snapctl" run create "ext-\$SLURM_JOB_ID" --world-size 1 --must-save-by slurm >/dev/null
"$BIN/snapctl" run create "start-\$SLURM_JOB_ID" --world-size 1 --started-at slurm --budget 10m >/dev/null
"$BIN/snapctl" run get "start-\$SLURM_JOB_ID" -o json >"$WORK/start.json"
"$BIN/snapctl" run get "ext-\$SLURM_JOB_ID" -o json >"$WORK/ext-before.json"
scontrol update JobId="\$SLURM_JOB_ID" TimeLimit=3
echo "after_update end_var=\${SLURM_JOB_END_TIME:-unset} squeue_end=\$(SLURM_TIME_FORMAT=%s squeue -h -j "\$SLURM_JOB_ID" -o %e)"
srun --overlap -n1 bash -c 'echo "new_step end_var=\${SLURM_JOB_END_TIME:-unset}"'
"$BIN/snapctl" run extend "ext-\$SLURM_JOB_ID" --must-save-by slurm >/dev/null
"$BIN/snapctl" run get "ext-\$SLURM_JOB_ID" -o json >"$WORK/ext-after.json"
EOF
ext=$(sbatch --parsable --wait --time=1 --output="$WORK/extend-%j.out" "$WORK/extend.sbatch") ||
	fail "the extend job failed: $(cat "$WORK"/extend-*.out)"
out=$(cat "$WORK/extend-$ext.out")
# Facts, not requirements: a newer Slurm that sets the variables passes too
# (snapctl reads squeue either way); the lines say what this one does.
if grep -q '^start_var=unset end_var=unset$' <<<"$out"; then
	proved "Slurm $(sinfo -V | cut -d' ' -f2) sets neither SLURM_JOB_START_TIME nor SLURM_JOB_END_TIME in a batch job"
else
	say "this Slurm sets them: $(head -1 <<<"$out")"
fi
if grep -q '^after_update end_var=unset ' <<<"$out" && grep -q '^new_step end_var=unset$' <<<"$out"; then
	proved "nor after scontrol update, not even in a step started after it"
else
	say "after scontrol update: $(grep -E '^(after_update|new_step) ' <<<"$out" | tr '\n' ' ')"
fi
b0=$(json "$WORK/ext-before.json" 'd["deadline"]["must_save_by"]')
b1=$(json "$WORK/ext-after.json" 'd["deadline"]["must_save_by"]')
moved=$(($(date -d "$b1" +%s) - $(date -d "$b0" +%s)))
squeue_end=$(sed -n 's/^after_update .* squeue_end=//p' <<<"$out")
[ "$moved" -eq 120 ] || fail "B moved by ${moved}s after TimeLimit 1 -> 3 min, want 120 s ($b0 -> $b1)"
[ "$(date -d "$b1" +%s)" -eq "$squeue_end" ] || fail "B after extend is $b1, squeue said the job ends at $squeue_end"
proved "squeue's end moves with scontrol update, and run extend --must-save-by slurm moved B by 120 s to it ($b0 -> $b1)"
started=$(date -d "$(json "$WORK/start.json" 'd["spec"]["started_at"]')" +%s)
[ "$started" -eq "$(job_field "$ext" StartTime)" ] ||
	fail "--started-at slurm gave $started, the job started at $(job_field "$ext" StartTime)"
proved "--started-at slurm is the job's start as Slurm records it ($(json "$WORK/start.json" 'd["spec"]["started_at"]'))"
stop_coordinator

# ---------------------------------------------------------------------------
say "2. the recipe, requeued once, saves by the coordinator's rule before the time limit"
# Short for CI: a 2-minute limit, B 70 s before the end, 3 s iterations.
# The run's spec for seconds-long steps: snapshots every 10 s, small priors.
RUN_FLAGS="--target-level turn --snapshot-interval 10 --margin 5 --expected-checkpoint 2 --expected-snapshot 2"
STATE=$WORK/job
mkdir -p "$STATE"
job=$(SNAPCOORD_STATE_DIR=$STATE SAVE_BEFORE_END=70s TRAIN_ARGS="--iteration-seconds 3" RUN_FLAGS="$RUN_FLAGS" \
	sbatch --parsable --time=2 --signal=B:USR1@10 --output="$WORK/grpo-%j.out" deploy/slurm/grpo.sbatch)
say "submitted job $job"
# Once a checkpoint is saved (step 4) and training has gone past it, kill
# the allocation as a node failure or a preemption would.
for i in $(seq 120); do
	if [ -s "$STATE/admin-token" ] && addr=$(sed -n 's/.*"msg":"serving","addr":"\([^"]*\)".*/\1/p' "$STATE/coordinator.0.log" 2>/dev/null) &&
		[ -n "$addr" ] && SNAPCOORD_ADDR=$addr SNAPCOORD_PLAINTEXT=1 SNAPCOORD_TOKEN_FILE=$STATE/admin-token "$BIN/snapctl" run get "grpo-$job" -o json >"$WORK/first.json" 2>/dev/null &&
		[ "$(json "$WORK/first.json" 'd.get("last_step", "0")')" -ge 6 ]; then
		break
	fi
	case $(job_field "$job" JobState) in PENDING | CONFIGURING | RUNNING) ;; *) fail "job $job ended before step 6: $(cat "$WORK/grpo-$job.out")" ;; esac
	[ "$i" -lt 120 ] || fail "the first allocation did not reach step 6 in 2 minutes: $(cat "$WORK/grpo-$job.out")"
	sleep 1
done
scontrol requeue "$job"
for _ in $(seq 60); do [ "$(job_field "$job" JobState)" = PENDING ] && break; sleep 0.5; done
# A requeued job waits two minutes before it may start again: not here. But
# slurmd revokes the old allocation's credential when it lets go of it, to
# the second, and refuses a new one made in that same second ("Job
# credential revoked": the job FAILS). So: once the node is idle again, and
# from the next second but one.
for _ in $(seq 120); do sinfo -h -o %T | grep -qx idle && break; sleep 0.5; done
scontrol update JobId="$job" StartTime=now+2
say "requeued job $job at step $(json "$WORK/first.json" 'd["last_step"]')"
wait_job_done "$job"
out=$(cat "$WORK/grpo-$job.out")

state=$(job_field "$job" JobState) exit_code=$(job_field "$job" ExitCode) restarts=$(job_field "$job" Restarts)
[ "$state" = COMPLETED ] && [ "$exit_code" = 0:0 ] && [ "$restarts" = 1 ] ||
	fail "job $job is $state, exit $exit_code, $restarts restarts; want COMPLETED, 0:0, 1: $out"
start=$(job_field "$job" StartTime) end=$(job_field "$job" EndTime)
limit_end=$((start + 120))
[ "$end" -lt "$limit_end" ] || fail "job $job ended at $end, not before its limit $limit_end"
proved "job $job was requeued once and then COMPLETED with exit 0, $((limit_end - end)) s before its time limit (Slurm did not kill it)"

coordinator "$STATE/data" "$STATE/admin-token" # the job's own data, reopened
"$BIN/snapctl" run get "grpo-$job" -o json >"$WORK/run.json"
"$BIN/snapctl" workers "grpo-$job" -o json >"$WORK/workers.json"
"$BIN/snapctl" snapshots "grpo-$job" -o json >"$WORK/snapshots.json"
"$BIN/snapctl" events "grpo-$job" >"$WORK/events.txt"
stop_coordinator
[ "$(json "$WORK/run.json" 'd["state"]')" = RUN_STATE_STOPPED ] || fail "run grpo-$job: $(cat "$WORK/run.json")"
[ "$(json "$WORK/run.json" 'd["fire_kind"]')" = DEADLINE_FIRE_KIND_STEP ] ||
	fail "the deadline of grpo-$job did not fire by the rule: $(json "$WORK/run.json" 'd["fire_kind"]')"
fired_step=$(json "$WORK/run.json" 'd["fired_at_step"]')
b=$(date -d "$(json "$WORK/run.json" 'd["deadline"]["must_save_by"]')" +%s)
ended=$(date -d "$(json "$WORK/run.json" 'd["ended_at"]')" +%s)
[ "$b" -eq $((start + 120 - 70)) ] || fail "B is $b, want the second allocation's end minus 70 s ($((start + 50)))"
[ "$ended" -le "$b" ] || fail "the run ended at $ended, after B $b"
proved "run grpo-$job STOPPED by the coordinator's rule at step $fired_step, $((b - ended)) s before B (the new allocation's end minus 70 s, set by run extend after the requeue)"
grep -q "run token reissued: job $job requeued (restart 1)" "$WORK/events.txt" ||
	fail "no event records the reissued token: $(cat "$WORK/events.txt")"
json "$WORK/workers.json" '" ".join(sorted(w["name"] + "@" + str(w["incarnation"]) for w in d["workers"]))' >"$WORK/incarnations"
[ "$(cat "$WORK/incarnations")" = "env-0@2 env-1@2 rank-0@2 rank-1@2" ] ||
	fail "workers after the requeue: $(cat "$WORK/incarnations"), want each name once, incarnation 2"
proved "after the requeue, run create exited 4 (the run exists) and run reissue-token gave the same run a new token; ranks and workers took their names back (incarnation 2)"
resumed=$(sed -n 's/^rank 0: starting at step //p' <<<"$out" | tail -1)
[ "$resumed" -gt 1 ] || fail "the second allocation's rank 0 started at step $resumed, not after the checkpoint"
proved "the second allocation resumed training from the checkpoint, at step $resumed"
snap=$(json "$WORK/snapshots.json" '[s for s in d["snapshots"] if s["reason"] == "SNAPSHOT_REASON_DEADLINE"][-1]["snapshot_id"]')
[ "$(json "$WORK/snapshots.json" '[s for s in d["snapshots"] if s["snapshot_id"] == "'"$snap"'"][0]["outcome"]')" = SNAPSHOT_OUTCOME_SAVED ] ||
	fail "deadline snapshot $snap: $(cat "$WORK/snapshots.json")"
for f in checkpoints/step_"$fired_step"/rank-0.json checkpoints/step_"$fired_step"/rank-1.json env/env-0/"$snap".json env/env-1/"$snap".json; do
	[ -s "$STATE/$f" ] || fail "$f was not written"
done
proved "both ranks' checkpoint of step $fired_step and both environment workers' deadline snapshot $snap are on disk"
if grep -q 'USR1' <<<"$out"; then say "(USR1 arrived too; the trap found the deadline fired)"; fi

# ---------------------------------------------------------------------------
say "3. the USR1 backstop stops a run whose rule would fire too late"
STATE=$WORK/backstop
mkdir -p "$STATE"
# B at the job's very end: the rule would fire about 12 s before it. USR1
# is asked for 60 s before the end; Slurm sends it up to a minute early.
job=$(SNAPCOORD_STATE_DIR=$STATE SAVE_BEFORE_END=0s TRAIN_ARGS="--iteration-seconds 3" RUN_FLAGS="$RUN_FLAGS" \
	sbatch --parsable --wait --time=2 --signal=B:USR1@60 --output="$WORK/backstop-%j.out" deploy/slurm/grpo.sbatch) ||
	fail "backstop job failed: $(cat "$WORK"/backstop-*.out)"
out=$(cat "$WORK/backstop-$job.out")
grep 'USR1: the time limit is near' <<<"$out" || fail "the trap did not run: $out"
coordinator "$STATE/data" "$STATE/admin-token"
"$BIN/snapctl" run get "grpo-$job" -o json >"$WORK/backstop.json"
"$BIN/snapctl" snapshots "grpo-$job" -o json >"$WORK/backstop-snapshots.json"
stop_coordinator
[ "$(json "$WORK/backstop.json" 'd["state"]')" = RUN_STATE_STOPPED ] &&
	[ "$(json "$WORK/backstop.json" 'd["fire_kind"]')" = DEADLINE_FIRE_KIND_MANUAL ] ||
	fail "backstop run: $(cat "$WORK/backstop.json")"
fired_step=$(json "$WORK/backstop.json" 'd["fired_at_step"]')
[ "$(json "$WORK/backstop-snapshots.json" '[s["outcome"] for s in d["snapshots"] if s["reason"] == "SNAPSHOT_REASON_DEADLINE"][-1]')" = SNAPSHOT_OUTCOME_SAVED ] ||
	fail "backstop: no saved deadline snapshot: $(cat "$WORK/backstop-snapshots.json")"
if [ "$fired_step" -gt 0 ]; then
	what="at step $fired_step (both ranks' checkpoint and the deadline snapshot saved)"
	for r in 0 1; do [ -s "$STATE/checkpoints/step_$fired_step/rank-$r.json" ] || fail "backstop: rank $r's checkpoint of step $fired_step is missing"; done
else
	what="before the first step (the deadline snapshot saved)"
fi
limit_end=$(($(job_field "$job" StartTime) + 120))
proved "job $job's USR1 trap fired the deadline by hand (run trigger) $what; the run STOPPED and the job COMPLETED $((limit_end - $(job_field "$job" EndTime))) s before its limit, $((limit_end - 12 - $(job_field "$job" EndTime))) s before the rule would have fired"

say "OK in $((SECONDS - t_start)) s"
