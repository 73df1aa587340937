#!/usr/bin/env bash
# slurm-e2e.sh: the Slurm recipe (deploy/slurm/grpo.sbatch, docs/slurm.md)
# on a real four-node Slurm, end to end. Run by `make slurm-e2e` after
# scripts/slurm-setup.sh (nodes n1..n4, each slurmd in its own network
# namespace) and `make build`, as root, from the checkout; the make target
# runs scripts/slurm-teardown.sh after it, pass or fail.
#
#  0. The cluster: four idle nodes whose namespaces route nowhere but to
#     each other.
#  1. What Slurm provides (SLURM_JOB_START_TIME/END_TIME, scontrol update),
#     `run extend --must-save-by slurm`, and a client on a node without the
#     coordinator's CA: snapctl and the Python client name SNAPCOORD_CA_FILE.
#  2. The recipe across three nodes (4 torch ranks on two, 2 environment
#     workers on the third, the coordinator with --tls-self-signed on the
#     batch host), requeued by `scontrol requeue`; in the second allocation
#     `scontrol update TimeLimit=` moves B, and the run uses the extra time.
#  3. The same, its second trainer node killed (every process in its
#     namespace, slurmd included): Slurm requeues the job onto other nodes.
#  4. The backstop: the coordinator killed mid-run; at USR1 the environment
#     workers snapshot on their own and the ranks save by the fail-safe plan.
#  5. No coordinator at the start: SNAPCOORD_ADDR names a shared one that is
#     down. The job trains without snapcoord, its ranks save by NeMo RL's
#     own rule before the time limit, and it exits 0.
#
# Every check prints what it proved; the first failure exits non-zero. The
# last line sums up where the ranks and workers ran and what they survived.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$PWD
BIN=$ROOT/bin
PY=/usr/bin/python3
# The bridge's address: where the test's own coordinator listens, so that
# jobs in the nodes' namespaces reach it.
BRIDGE_ADDR=10.253.77.1
# torch.distributed finds its peers by host name, which here resolves to
# loopback in every namespace: use each node's link instead.
export GLOO_SOCKET_IFNAME=eth0
# A job that hangs (ranks that disagree would wait in all_reduce forever)
# fails the test after this long instead of holding it.
JOB_WAIT_S=${JOB_WAIT_S:-300}

fail() { printf 'slurm-e2e: FAIL: %s\n' "$*" >&2; exit 1; }
proved() { printf 'slurm-e2e: proved: %s\n' "$*"; }
say() { printf 'slurm-e2e: %s\n' "$*"; }

for f in "$BIN/snapcoord" "$BIN/snapctl" deploy/slurm/grpo.sbatch client/python/snapcoord/__init__.py; do
	[ -e "$f" ] || fail "$f is missing (run make build)"
done

WORK=$(mktemp -d /tmp/snapcoord-slurm-e2e.XXXXXX)
chmod 755 "$WORK"
coord_pid=
jobs_submitted=()
cleanup() {
	local rc=$?
	if [ -n "$coord_pid" ]; then kill -TERM "$coord_pid" 2>/dev/null && wait "$coord_pid" || true; fi
	for j in "${jobs_submitted[@]}"; do scancel "$j" 2>/dev/null || true; done
	if [ "$rc" -eq 0 ]; then rm -rf "$WORK"; else say "kept $WORK for a look (job outputs, coordinator logs)"; fi
}
trap cleanup EXIT

# coordinator DIR: starts snapcoord on the bridge's address with its data,
# CA and admin token under DIR (the token made if missing); exports what
# snapctl needs.
coordinator() {
	local log=$WORK/coordinator-$(basename "$1").log addr=
	[ -s "$1/admin-token" ] || (umask 077 && od -An -tx1 -N32 /dev/urandom | tr -d ' \n' >"$1/admin-token")
	: >"$log"
	"$BIN/snapcoord" serve --listen "$BRIDGE_ADDR:0" --tls-self-signed "$1/tls" --data-dir "$1/data" \
		--admin-token-file "$1/admin-token" --metrics-listen "" --log-format json >>"$log" 2>&1 &
	coord_pid=$!
	for _ in $(seq 100); do
		addr=$(sed -n 's/.*"msg":"serving","addr":"\([^"]*\)".*/\1/p' "$log" | tail -1)
		[ -n "$addr" ] && break
		sleep 0.1
	done
	[ -n "$addr" ] || fail "coordinator on $1 did not start: $(cat "$log")"
	export SNAPCOORD_ADDR=$addr SNAPCOORD_CA_FILE=$1/tls/ca.pem SNAPCOORD_TOKEN_FILE=$1/admin-token
}
stop_coordinator() {
	kill -TERM "$coord_pid"
	wait "$coord_pid" || true
	coord_pid=
	# The jobs inherit this environment: the recipe's start their own.
	unset SNAPCOORD_ADDR SNAPCOORD_CA_FILE SNAPCOORD_TOKEN_FILE
}
# live STATE N ARGS...: snapctl against the coordinator of a running job's
# allocation N (restart count), as an operator would: its address from its
# log, its CA and admin token from the state directory.
live() {
	local state=$1 n=$2 addr
	shift 2
	addr=$(sed -n 's/.*"msg":"serving","addr":"\([^"]*\)".*/\1/p' "$state/coordinator.$n.log" 2>/dev/null | tail -1)
	[ -n "$addr" ] || return 1
	SNAPCOORD_ADDR=$addr SNAPCOORD_CA_FILE=$state/tls/ca.pem SNAPCOORD_TOKEN_FILE=$state/admin-token "$BIN/snapctl" "$@"
}

# json FILE EXPR: a value from snapctl's -o json output (Python reads it).
json() { "$PY" -c 'import json,sys; d=json.load(open(sys.argv[1])); print(eval(sys.argv[2], {"d": d}))' "$1" "$2"; }
epoch() { date -d "$1" +%s; }
# job_field ID KEY: a field of `scontrol show job` (epoch seconds for times).
job_field() { SLURM_TIME_FORMAT=%s scontrol show job "$1" | tr ' ' '\n' | sed -n "s/^$2=//p" | head -1; }
# job_ended STATE: whether a job in STATE is over. Only the base states
# that end a job count: a running job passes through others (SIGNALING
# while --signal's USR1 is delivered, COMPLETING, REQUEUED), and one read
# there is not done.
job_ended() {
	case $1 in BOOT_FAIL | CANCELLED | COMPLETED | DEADLINE | FAILED | NODE_FAIL | OUT_OF_MEMORY | PREEMPTED | TIMEOUT) return 0 ;; esac
	return 1
}
wait_job_done() {
	local id=$1 state
	for _ in $(seq "$JOB_WAIT_S"); do
		state=$(job_field "$id" JobState)
		if job_ended "$state"; then return 0; fi
		sleep 1
	done
	fail "job $id still $state after ${JOB_WAIT_S}s (a hang: ranks waiting in a collective?): $(tail -20 "$WORK"/*-"$id".out)"
}
# wait_step STATE N JOB STEP: until allocation N's run has done STEP and
# published a checkpoint; the run's JSON is left in $WORK/live.json.
wait_step() {
	local state=$1 n=$2 job=$3 step=$4
	for _ in $(seq 240); do
		if live "$state" "$n" run get "grpo-$job" -o json >"$WORK/live.json" 2>/dev/null &&
			[ "$(json "$WORK/live.json" 'd.get("last_step", "0")')" -ge "$step" ] &&
			[ "$(json "$WORK/live.json" 'd.get("last_published_step", "0")')" -gt 0 ]; then
			return 0
		fi
		if job_ended "$(job_field "$job" JobState)"; then fail "job $job ended before step $step: $(cat "$WORK"/*-"$job".out)"; fi
		sleep 0.5
	done
	fail "job $job did not reach step $step in 2 minutes: $(cat "$WORK"/*-"$job".out)"
}
# start_again JOB: a requeued job waits two minutes before it may start
# again: not here. But slurmd revokes the old allocation's credential when
# it lets go of it, to the second, and refuses a new one made in that same
# second ("Job credential revoked": the job FAILS). So: once the nodes let
# go of it, and from the next second but one.
start_again() {
	for _ in $(seq 60); do [ "$(job_field "$1" JobState)" = PENDING ] && break; sleep 0.5; done
	for _ in $(seq 120); do
		[ "$(sinfo -h -t alloc,mix,comp -o %D | awk '{s+=$1} END {print s+0}')" = 0 ] && break
		sleep 0.5
	done
	# After a node failure the old allocation's srun on the batch host
	# outlives the job by up to 32 s ("Job step aborted: Waiting up to 32
	# seconds"), then cancels its step by number: in a new allocation, the
	# new step of that number. Slurm's own delay before a requeued job
	# starts again (2 minutes) covers that; the test waits for those sruns.
	for _ in $(seq 120); do
		[ -z "$(stale_sruns)" ] && break
		sleep 0.5
	done
	[ -z "$(stale_sruns)" ] || fail "the first allocation's srun $(stale_sruns) still runs a minute after the requeue"
	scontrol update JobId="$1" StartTime=now+2
}
stale_sruns() {
	local n p
	for n in n1 n2 n3 n4; do
		for p in $(ip netns pids "snapcoord-$n" 2>/dev/null); do
			[ "$(cat "/proc/$p/comm" 2>/dev/null)" = srun ] && echo "$p"
		done
	done
	return 0
}
# nodes_of OUT WHAT ALLOC: the nodes "WHAT N on NODE" lines name in
# allocation ALLOC (0 or 1) of a job's output, comma-separated.
nodes_of() {
	awk -v what="$2" -v alloc="$3" '/ grpo.sbatch: job [0-9]+ \(restart / {a = ($0 ~ /restart 0/) ? 0 : 1}
		a == alloc && $0 ~ "^" what "[ -][0-9]+ on n[0-9]" {for (i = 1; i < NF; i++) if ($i == "on") {print $(i + 1); break}}' <<<"$1" |
		tr -d : | sort -u | paste -sd, -
}
# check_recipe JOB STATE LIMIT SAVE_BEFORE_END: the checks every requeued
# recipe job must pass; sets fired_step, resumed, ended, b.
check_recipe() {
	local job=$1 state=$2 limit=$3 sbe=$4 out start end restarts exit_code jstate f r stops
	out=$(cat "$WORK/grpo-$job.out")
	jstate=$(job_field "$job" JobState) exit_code=$(job_field "$job" ExitCode) restarts=$(job_field "$job" Restarts)
	[ "$jstate" = COMPLETED ] && [ "$exit_code" = 0:0 ] && [ "$restarts" = 1 ] ||
		fail "job $job is $jstate, exit $exit_code, $restarts restarts; want COMPLETED, 0:0, 1: $out"
	start=$(job_field "$job" StartTime) end=$(job_field "$job" EndTime)
	[ "$end" -lt $((start + limit)) ] || fail "job $job ended at $end, not before its limit $((start + limit))"

	coordinator "$state" # the job's own data, reopened
	"$BIN/snapctl" run get "grpo-$job" -o json >"$WORK/run.json"
	"$BIN/snapctl" workers "grpo-$job" -o json >"$WORK/workers.json"
	"$BIN/snapctl" snapshots "grpo-$job" -o json >"$WORK/snapshots.json"
	"$BIN/snapctl" events "grpo-$job" >"$WORK/events.txt"
	stop_coordinator
	[ "$(json "$WORK/run.json" 'd["state"]')" = RUN_STATE_STOPPED ] || fail "run grpo-$job: $(cat "$WORK/run.json")"
	[ "$(json "$WORK/run.json" 'd["fire_kind"]')" = DEADLINE_FIRE_KIND_STEP ] ||
		fail "the deadline of grpo-$job did not fire by the rule: $(json "$WORK/run.json" 'd["fire_kind"]')"
	fired_step=$(json "$WORK/run.json" 'd["fired_at_step"]')
	b=$(epoch "$(json "$WORK/run.json" 'd["deadline"]["must_save_by"]')")
	ended=$(epoch "$(json "$WORK/run.json" 'd["ended_at"]')")
	[ "$b" -eq $((start + limit - sbe)) ] || fail "B is $b, want the second allocation's end minus $sbe s ($((start + limit - sbe)))"
	[ "$ended" -le "$b" ] || fail "the run ended at $ended, after B $b"
	grep -q "run token reissued: job $job requeued (restart 1)" "$WORK/events.txt" ||
		fail "no event records the reissued token: $(cat "$WORK/events.txt")"
	json "$WORK/workers.json" '" ".join(sorted(w["name"] + "@" + str(w["incarnation"]) for w in d["workers"]))' >"$WORK/incarnations"
	[ "$(cat "$WORK/incarnations")" = "env-0@2 env-1@2 rank-0@2 rank-1@2 rank-2@2 rank-3@2" ] ||
		fail "workers after the requeue: $(cat "$WORK/incarnations"), want each name once, incarnation 2"
	# Every rank stopped at the step the rule fired at: none went on alone.
	stops=$(sed -n 's/^rank [0-9] on n[0-9]: stopping after step //p' <<<"$out" | sort | uniq -c | awk '{print $1 "x" $2}' | paste -sd' ' -)
	[ "$stops" = "4x$fired_step" ] || fail "ranks stopped after steps $stops, want all 4 after step $fired_step"
	grep -q 'disagree' <<<"$out" && fail "ranks disagreed: $(grep disagree <<<"$out")"
	resumed=$(awk '/\(restart 1\)/ {a = 1} a && /^rank 0 on .*: starting at step / {print $NF}' <<<"$out" | tail -1)
	[ -n "$resumed" ] && [ "$resumed" -gt 1 ] || fail "the second allocation's rank 0 started at step ${resumed:-?}, not after a checkpoint"
	for r in 0 1 2 3; do
		f=$state/checkpoints/step_$((resumed - 1))/rank-$r.pt
		[ -s "$f" ] || fail "resumed at step $resumed, but $f is missing"
		f=$state/checkpoints/step_$fired_step/rank-$r.pt
		"$PY" -c 'import sys, torch; s = torch.load(sys.argv[1]); sys.exit(s["step"] != int(sys.argv[2]))' "$f" "$fired_step" ||
			fail "$f is not rank $r's torch.save checkpoint of step $fired_step"
	done
	snap=$(json "$WORK/snapshots.json" '[s for s in d["snapshots"] if s["reason"] == "SNAPSHOT_REASON_DEADLINE"][-1]["snapshot_id"]')
	[ "$(json "$WORK/snapshots.json" '[s for s in d["snapshots"] if s["snapshot_id"] == "'"$snap"'"][0]["outcome"]')" = SNAPSHOT_OUTCOME_SAVED ] ||
		fail "deadline snapshot $snap: $(cat "$WORK/snapshots.json")"
	for r in 0 1; do [ -s "$state/env/env-$r/$snap.json" ] || fail "env-$r's deadline snapshot $snap was not written"; done
}

t_start=$SECONDS
summary=()
# part N: whether to run part N (SLURM_E2E_PARTS, default all: "0 1 2 3 4 5").
part() { [[ " ${SLURM_E2E_PARTS:-0 1 2 3 4 5} " == *" $1 "* ]]; }

# ---------------------------------------------------------------------------
if part 0; then
	say "0. the cluster"
	nodes=$(sinfo -h -N -t idle -o %N | sort -u | paste -sd, -)
	[ "$nodes" = n1,n2,n3,n4 ] || fail "want nodes n1..n4 idle, have '$nodes' ($(sinfo -N)): run scripts/slurm-setup.sh"
	for n in n1 n2 n3 n4; do
		routes=$(ip -n "snapcoord-$n" route show | awk '{print $1}' | paste -sd, -)
		[ "$routes" = 10.253.77.0/24 ] || fail "namespace snapcoord-$n routes $routes, want only 10.253.77.0/24"
	done
	proved "$(sinfo -V): nodes $nodes idle, each slurmd in its own network namespace routing only 10.253.77.0/24 (nothing leaves this machine)"
fi

# ---------------------------------------------------------------------------
if part 1; then
	say "1. what Slurm provides, run extend after scontrol update, and a client without the CA"
	mkdir -p "$WORK/shared"
	coordinator "$WORK/shared"
	cat >"$WORK/extend.sbatch" <<-EOF
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
	# A client on this node that was not given the CA.
	SNAPCOORD_CA_FILE= "$BIN/snapctl" run list 2>"$WORK/noca-snapctl.txt" && exit 1
	SNAPCOORD_CA_FILE= SNAPCOORD_RUN_ID="ext-\$SLURM_JOB_ID" SNAPCOORD_RUN_TOKEN=scr_unused PYTHONPATH="$ROOT/client/python" \
		"$PY" -c 'from snapcoord.nemo_rl import TimeoutChecker; TimeoutChecker(timeout=None)' 2>"$WORK/noca-python.txt" && exit 1
	echo "node \$SLURMD_NODENAME"
	EOF
	ext=$(sbatch --parsable --wait --nodes=1 --ntasks=1 --time=1 --output="$WORK/extend-%j.out" "$WORK/extend.sbatch") ||
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
	moved=$(($(epoch "$b1") - $(epoch "$b0")))
	squeue_end=$(sed -n 's/^after_update .* squeue_end=//p' <<<"$out")
	[ "$moved" -eq 120 ] || fail "B moved by ${moved}s after TimeLimit 1 -> 3 min, want 120 s ($b0 -> $b1)"
	[ "$(epoch "$b1")" -eq "$squeue_end" ] || fail "B after extend is $b1, squeue said the job ends at $squeue_end"
	proved "squeue's end moves with scontrol update, and run extend --must-save-by slurm moved B by 120 s to it ($b0 -> $b1)"
	started=$(epoch "$(json "$WORK/start.json" 'd["spec"]["started_at"]')")
	[ "$started" -eq "$(job_field "$ext" StartTime)" ] ||
		fail "--started-at slurm gave $started, the job started at $(job_field "$ext" StartTime)"
	proved "--started-at slurm is the job's start as Slurm records it ($(json "$WORK/start.json" 'd["spec"]["started_at"]'))"
	grep -q 'SNAPCOORD_CA_FILE' "$WORK/noca-snapctl.txt" && grep -q 'set SNAPCOORD_CA_FILE' "$WORK/noca-python.txt" ||
		fail "a client without the CA was not told to set SNAPCOORD_CA_FILE: $(cat "$WORK"/noca-*.txt)"
	proved "on node $(sed -n 's/^node //p' <<<"$out"), snapctl and the Python client without the coordinator's CA fail naming SNAPCOORD_CA_FILE: $(sed 's/.*\. //' "$WORK/noca-snapctl.txt" | head -1)"
	stop_coordinator
fi

RUN_FLAGS="--target-level turn --snapshot-interval 10 --margin 5 --expected-checkpoint 2 --expected-snapshot 2"
TRAIN_ARGS="--iteration-seconds 2 --checkpoint-every 3 --collective-timeout 60"
# The job polls squeue for a new end this often (seconds).
POLL=3
# submit NAME SAVE_BEFORE_END OUT SBATCH_ARGS...: the recipe with a 2-minute
# limit, the settings above and its state in $WORK/NAME (STATE), its output
# in $WORK/OUT-<job>.out; sets job.
submit() {
	STATE=$WORK/$1
	mkdir -p "$STATE"
	job=$(SNAPCOORD_STATE_DIR=$STATE SAVE_BEFORE_END=$2s EXTEND_POLL=$POLL TRAIN_ARGS="$TRAIN_ARGS" RUN_FLAGS="$RUN_FLAGS" \
		sbatch --parsable --time=2 --output="$WORK/$3-%j.out" "${@:4}" deploy/slurm/grpo.sbatch)
	jobs_submitted+=("$job")
	say "submitted job $job"
}

# ---------------------------------------------------------------------------
if part 2; then
	say "2. the recipe on three nodes, requeued by scontrol requeue, then given more time by scontrol update"
	# 2-minute limit, B 80 s before the end: the second allocation's rule would
	# fire about 30 s in, unless the test's TimeLimit=3 moves B a minute later.
	SBE=80
	t_submit=$(date +%s.%N)
	submit requeue "$SBE" grpo --signal=B:USR1@10
	wait_step "$STATE" 0 "$job" 5
	first_decision=$(awk '/first decision at/ {print $NF}' "$WORK/grpo-$job.out" | sort -n | head -1)
	to_first=$("$PY" -c 'import sys; print(f"{float(sys.argv[1]) - float(sys.argv[2]):.1f}")' "$first_decision" "$t_submit")
	scontrol requeue "$job"
	say "requeued job $job at step $(json "$WORK/live.json" 'd["last_step"]') (checkpoint $(json "$WORK/live.json" 'd["last_published_step"]'))"
	start_again "$job"
	# Once the second allocation's run has its new token, and before its rule
	# would fire: a minute more.
	for _ in $(seq 120); do
		grep -q '(restart 1)' "$WORK/grpo-$job.out" && live "$STATE" 1 events "grpo-$job" 2>/dev/null | grep -q 'run token reissued' && break
		sleep 0.5
	done
	scontrol update JobId="$job" TimeLimit=3
	t_update=$(date +%s.%N)
	new_end=$(SLURM_TIME_FORMAT=%s squeue -h -j "$job" -o %e)
	for _ in $(seq 60); do
		live "$STATE" 1 run get "grpo-$job" -o json >"$WORK/live.json" 2>/dev/null &&
			[ "$(epoch "$(json "$WORK/live.json" 'd["deadline"]["must_save_by"]')")" -eq $((new_end - SBE)) ] && break
		sleep 0.5
	done
	followed=$("$PY" -c 'import sys, time; print(f"{time.time() - float(sys.argv[1]):.1f}")' "$t_update")
	[ "$(epoch "$(json "$WORK/live.json" 'd["deadline"]["must_save_by"]')")" -eq $((new_end - SBE)) ] ||
		fail "B did not follow TimeLimit=3 within 30 s: $(cat "$WORK/live.json")"
	proved "scontrol update TimeLimit=3 moved B on the coordinator to the new end minus $SBE s within $followed s (the job polls squeue every $POLL s)"
	wait_job_done "$job"
	check_recipe "$job" "$STATE" 180 "$SBE"
	out=$(cat "$WORK/grpo-$job.out")
	fired_at=$(epoch "$(json "$WORK/run.json" 'd["fired_at"]')")
	old_b=$(($(job_field "$job" StartTime) + 120 - SBE))
	[ "$fired_at" -gt "$old_b" ] || fail "the rule fired at $fired_at, before the B of the original limit ($old_b): the extra minute went unused"
	proved "the run used the extra time: the rule fired at step $fired_step, $((fired_at - old_b)) s after the B of the original limit, and the run STOPPED $((b - ended)) s before the new B"
	proved "job $job: requeued once, COMPLETED with exit 0; ranks and workers came back as incarnation 2 with a new token; training resumed at step $resumed from every rank's torch.save checkpoint of step $((resumed - 1)); all 4 ranks stopped after step $fired_step; the deadline snapshot of both workers is on disk"
	ranks_a0=$(nodes_of "$out" rank 0) ranks_a1=$(nodes_of "$out" rank 1) envs_a0=$(nodes_of "$out" env 0) envs_a1=$(nodes_of "$out" env 1)
	# Ranks 2 and 3 run on the second trainer node, never the batch host.
	remote=$(grep -E "^rank [23] on n[0-9]: decisions over" <<<"$out" | awk '{print $11}' | sort -n | awk '{a[NR] = $1} END {print a[int((NR + 1) / 2)]}')
	proved "sbatch to the first decision: $to_first s; a decision over TLS from a rank on another node than the coordinator: median $remote ms per step"
	summary+=("scontrol requeue: ranks $ranks_a0 -> $ranks_a1, workers $envs_a0 -> $envs_a1, B followed TimeLimit in ${followed}s")
fi

# ---------------------------------------------------------------------------
if part 3; then
	say "3. the recipe, its second trainer node killed: Slurm requeues the job onto the nodes left"
	SBE=70
	submit nodefail "$SBE" grpo --signal=B:USR1@10
	wait_step "$STATE" 0 "$job" 5
	victim=$(sed -n 's/^rank 2 on \(n[0-9]\):.*/\1/p' "$WORK/grpo-$job.out" | head -1)
	[ -n "$victim" ] || fail "no rank 2 in the output of job $job"
	# A node failing: its slurmd, step daemons and ranks all die at once.
	# shellcheck disable=SC2046 # one pid per word
	kill -KILL $(ip netns pids "snapcoord-$victim")
	t_kill=$SECONDS
	say "killed node $victim (every process in its namespace) at step $(json "$WORK/live.json" 'd["last_step"]')"
	for _ in $(seq 120); do
		[ "$(job_field "$job" Restarts)" = 1 ] && break
		sleep 0.5
	done
	[ "$(job_field "$job" Restarts)" = 1 ] || fail "job $job not requeued 60 s after node $victim died: $(scontrol show job "$job")"
	say "Slurm found $victim $(sinfo -h -n "$victim" -o %T) and requeued job $job after $((SECONDS - t_kill)) s"
	start_again "$job"
	wait_job_done "$job"
	check_recipe "$job" "$STATE" 120 "$SBE"
	out=$(cat "$WORK/grpo-$job.out")
	ranks_b0=$(nodes_of "$out" rank 0) ranks_b1=$(nodes_of "$out" rank 1) envs_b0=$(nodes_of "$out" env 0) envs_b1=$(nodes_of "$out" env 1)
	case ",$ranks_b1,$envs_b1," in *",$victim,"*) fail "the second allocation ran on the dead node $victim" ;; esac
	proved "job $job: node $victim died; the job was requeued onto ${ranks_b1},${envs_b1}, resumed at step $resumed from the checkpoint of step $((resumed - 1)), and STOPPED by the rule at step $fired_step (all 4 ranks), $((b - ended)) s before the new B, COMPLETED exit 0"
	summary+=("$victim killed: ranks $ranks_b0 -> $ranks_b1, workers $envs_b0 -> $envs_b1")
fi

# ---------------------------------------------------------------------------
if part 4; then
	say "4. the backstop: the coordinator dies mid-run; at USR1 the workers snapshot and the ranks save on their own"
	# B 30 s before the end (the ranks' fail-safe saves before it); USR1
	# asked for 50 s before the end.
	submit backstop 30 backstop --signal=B:USR1@50
	wait_step "$STATE" 0 "$job" 3
	kill -KILL "$(cat "$STATE/coordinator.pid")"
	say "killed the coordinator of job $job at step $(json "$WORK/live.json" 'd["last_step"]')"
	wait_job_done "$job"
	out=$(cat "$WORK/backstop-$job.out")
	grep -q 'USR1: the time limit is near' <<<"$out" || fail "the trap did not run: $out"
	grep -q 'the coordinator is gone: stopping the environment workers' <<<"$out" || fail "the job did not notice its coordinator gone: $out"
	for r in 0 1; do
		ls "$STATE/env/env-$r"/backstop-*.json >/dev/null 2>&1 || fail "env-$r took no backstop snapshot: $(ls -R "$STATE/env")"
	done
	stops=$(sed -n 's/^rank [0-9] on n[0-9]: stopping after step //p' <<<"$out" | sort | uniq -c | awk '{print $1 "x" $2}' | paste -sd' ' -)
	fired_step=${stops#4x}
	[[ $stops =~ ^4x[0-9]+$ ]] || fail "ranks stopped after steps '$stops', want all 4 after one step"
	grep -q "decided without the coordinator" <<<"$out" || fail "no rank decided by the fail-safe plan: $out"
	for r in 0 1 2 3; do
		"$PY" -c 'import sys, torch; s = torch.load(sys.argv[1]); sys.exit(s["step"] != int(sys.argv[2]))' \
			"$STATE/checkpoints/step_$fired_step/rank-$r.pt" "$fired_step" || fail "rank $r has no checkpoint of step $fired_step"
	done
	limit_end=$(($(job_field "$job" StartTime) + 120))
	[ "$(job_field "$job" EndTime)" -lt "$limit_end" ] || fail "job $job ran into its time limit"
	saved=$(stat -c %Y "$STATE/checkpoints/step_$fired_step/rank-0.pt")
	[ "$saved" -le $((limit_end - 30)) ] || fail "the fail-safe save of step $fired_step came at $saved, after B $((limit_end - 30))"
	proved "job $job, its coordinator gone: at USR1 both environment workers took a backstop snapshot, all 4 ranks saved step $fired_step by the fail-safe plan $((limit_end - 30 - saved)) s before B and stopped together; the job ended $((limit_end - $(job_field "$job" EndTime))) s before its limit"
	summary+=("coordinator killed: ranks $(nodes_of "$out" rank 0) and workers $(nodes_of "$out" env 0) saved on their own")
fi

# ---------------------------------------------------------------------------
if part 5; then
	say "5. no coordinator at the start: SNAPCOORD_ADDR names a shared one that is down; the job trains without it"
	# A shared coordinator's settings (its address, CA and admin token), and
	# nothing listening at that address any more.
	mkdir -p "$WORK/gone"
	coordinator "$WORK/gone"
	gone=$SNAPCOORD_ADDR
	stop_coordinator
	# A 1-minute limit, NeMo RL's timeout 25 s before the end; USR1 asked
	# for 40 s before it.
	SBE=25
	t_submit=$SECONDS
	SNAPCOORD_ADDR=$gone SNAPCOORD_CA_FILE=$WORK/gone/tls/ca.pem SNAPCOORD_TOKEN_FILE=$WORK/gone/admin-token \
		submit nocoord "$SBE" nocoord --time=1 --signal=B:USR1@40
	wait_job_done "$job"
	out=$(cat "$WORK/nocoord-$job.out")
	jstate=$(job_field "$job" JobState) exit_code=$(job_field "$job" ExitCode)
	[ "$jstate" = COMPLETED ] && [ "$exit_code" = 0:0 ] || fail "job $job is $jstate, exit $exit_code; want COMPLETED, 0:0: $out"
	grep -q "WITHOUT SNAPCOORD: no coordinator answered at $gone" <<<"$out" || fail "no log line says the job trains without snapcoord: $out"
	say "the job's log: $(grep -m1 'WITHOUT SNAPCOORD' <<<"$out")"
	grep -q "USR1: the time limit is near; without a coordinator" <<<"$out" || fail "the USR1 trap did not run, or not knowing there is no coordinator: $out"
	grep -qE 'firing the deadline|run trigger exited|^env-[0-9]+ on ' <<<"$out" && fail "the job called snapctl at USR1 or started environment workers: $out"
	stops=$(sed -n 's/^rank [0-9] on n[0-9]: stopping after step //p' <<<"$out" | sort | uniq -c | awk '{print $1 "x" $2}' | paste -sd' ' -)
	[[ $stops =~ ^4x[1-9][0-9]*$ ]] || fail "ranks stopped after steps '$stops', want all 4 after one step > 0"
	fired_step=${stops#4x}
	for r in 0 1 2 3; do
		"$PY" -c 'import sys, torch; s = torch.load(sys.argv[1]); sys.exit(s["step"] != int(sys.argv[2]))' \
			"$STATE/checkpoints/step_$fired_step/rank-$r.pt" "$fired_step" || fail "rank $r has no checkpoint of step $fired_step"
	done
	limit_end=$(($(job_field "$job" StartTime) + 60))
	ended=$(job_field "$job" EndTime)
	[ "$ended" -lt "$limit_end" ] || fail "job $job ran into its time limit ($ended, limit $limit_end)"
	saved=$(stat -c %Y "$STATE/checkpoints/step_$fired_step/rank-0.pt")
	# NeMo RL's rule saves once the time since the checker started plus a
	# mean step reaches the timeout: not well before the end minus SBE.
	[ "$saved" -ge $((limit_end - SBE - 5)) ] || fail "step $fired_step was saved at $saved, well before the timeout ($((limit_end - SBE)))"
	proved "job $job, SNAPCOORD_ADDR $gone down: trained without snapcoord (the log says so; no environment worker, no snapctl at USR1), all 4 ranks saved step $fired_step by NeMo RL's rule $((saved - limit_end + SBE)) s after the end minus $SBE s, and the job COMPLETED exit 0:0 $((limit_end - ended)) s before its limit ($((SECONDS - t_submit)) s from sbatch)"
	summary+=("no coordinator: ranks $(nodes_of "$out" rank 0) saved step $fired_step by NeMo RL's rule")
fi

say "OK in $((SECONDS - t_start)) s: $(
	IFS=';'
	echo "${summary[*]}"
)" | sed 's/;/; /g'
