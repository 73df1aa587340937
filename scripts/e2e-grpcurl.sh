#!/usr/bin/env bash
# End-to-end check of a real snapcoord process, driven with grpcurl.
#
# The grpcurl commands below are the examples of docs/grpcurl.md, in its
# order, with 127.0.0.1:7070 replaced by "$addr"; the snapctl commands are
# README.md's quick start. Keep them in step by hand: change one, change the
# other (the drift checks below fail when a documented command is not here).
#
# Starts `snapcoord serve` on a free loopback port with a temporary data
# directory, waits for grpc.health.v1.Health to report SERVING, runs the
# examples and checks their output (plain grep, no jq), restarts the server on
# the same data directory (SIGTERM, then SIGKILL) and checks the run survived,
# then runs the README's snapctl quick start against it.
#
# Environment:
#   SNAPCOORD_BIN  the snapcoord binary (default: build ./cmd/snapcoord into bin/)
#   SNAPCTL_BIN    the snapctl binary (default: build ./cmd/snapctl into bin/)
#   GRPCURL_BIN    a grpcurl binary (default: build the one pinned in tools/lint)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

say() { printf 'e2e: %s\n' "$*"; }
fail() {
	printf 'e2e: FAIL: %s\n' "$*" >&2
	exit 1
}

work=$(mktemp -d "${TMPDIR:-/tmp}/snapcoord-e2e.XXXXXX")
data="$work/data"
: >"$work/server.log"
server_pid=""
sidecar_pid=""
addr=""

cleanup() {
	local status=$?
	if [ -n "$sidecar_pid" ]; then
		kill -KILL "$sidecar_pid" 2>/dev/null || true
		{ wait "$sidecar_pid"; } 2>/dev/null || true
	fi
	if [ -n "$server_pid" ]; then
		kill -KILL "$server_pid" 2>/dev/null || true
		{ wait "$server_pid"; } 2>/dev/null || true
	fi
	if [ "$status" -ne 0 ] && [ -s "$work/server.log" ]; then
		echo "--- server log (last 60 lines) ---" >&2
		tail -n 60 "$work/server.log" >&2
	fi
	if [ "$status" -ne 0 ] && [ -s "$work/sidecar.log" ]; then
		echo "--- sidecar log ---" >&2
		cat "$work/sidecar.log" >&2
	fi
	rm -rf "$work"
	exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# --- the documented commands are the ones below --------------------------------
# Not generated, only checked: every `grpcurl -plaintext` line of
# docs/grpcurl.md, with the address replaced by "$addr", and every `snapctl`
# or Python line of README.md's quick start (with /tmp/ckpt replaced by
# "$work/ckpt") must appear verbatim in this script.
drift=0
while IFS= read -r cmd; do
	cmd=${cmd//127.0.0.1:7070/\"\$addr\"}
	if ! grep -qF -- "$cmd" "${BASH_SOURCE[0]}"; then
		echo "e2e: docs/grpcurl.md example not run by this script: $cmd" >&2
		drift=1
	fi
done < <(grep -E '^grpcurl -plaintext ' docs/grpcurl.md)
while IFS= read -r cmd; do
	cmd=${cmd//\/tmp\/ckpt/\"\$work\/ckpt\"}
	if ! grep -qF -- "$cmd" "${BASH_SOURCE[0]}"; then
		echo "e2e: README.md quick-start command not run by this script: $cmd" >&2
		drift=1
	fi
done < <(sed -n '/^## Quick start/,/^## /p' README.md | grep -E '^(eval "\$\(snapctl|snapctl |SNAPCOORD_[A-Z_]+=|  /usr/bin/python3 )')
[ "$drift" -eq 0 ] || fail "the documented commands and scripts/e2e-grpcurl.sh differ: keep them in step"

# --- binaries ---------------------------------------------------------------
if [ -z "${SNAPCOORD_BIN:-}" ]; then
	say "building bin/snapcoord"
	go build -o bin/ ./cmd/snapcoord
	SNAPCOORD_BIN=bin/snapcoord
fi
[ -x "$SNAPCOORD_BIN" ] || fail "$SNAPCOORD_BIN is not an executable (is cmd/snapcoord written yet?)"
if [ -z "${SNAPCTL_BIN:-}" ]; then
	say "building bin/snapctl"
	go build -o bin/ ./cmd/snapctl
	SNAPCTL_BIN=bin/snapctl
fi
[ -x "$SNAPCTL_BIN" ] || fail "$SNAPCTL_BIN is not an executable"
# The quick start calls it by name, as `make build` users have it on PATH.
mkdir "$work/bin"
ln -s "$(realpath "$SNAPCTL_BIN")" "$work/bin/snapctl"
if [ -z "${GRPCURL_BIN:-}" ]; then
	say "building grpcurl (pinned in tools/lint/go.mod)"
	go build -modfile=tools/lint/go.mod -o "$work/grpcurl" github.com/fullstorydev/grpcurl/cmd/grpcurl
	GRPCURL_BIN="$work/grpcurl"
fi

# grpcurl, as the README calls it, with bounds so that a hung server fails the
# run instead of stalling it.
grpcurl() {
	"$GRPCURL_BIN" -connect-timeout 5 -max-time 30 "$@"
}

# --- server control ---------------------------------------------------------

# A loopback port nothing listens on now. The server may still lose a race for
# it; start_server then tries another one.
pick_port() {
	local p
	for _ in $(seq 1 50); do
		p=$((20000 + RANDOM % 40000))
		if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
			echo "$p"
			return 0
		fi
	done
	return 1
}

# Waits for Health/Check to say SERVING: at most 150 tries about 0.1 s apart
# (plus grpcurl's own time), giving up early if the process exits.
wait_serving() {
	local out
	for _ in $(seq 1 150); do
		if ! kill -0 "$server_pid" 2>/dev/null; then
			return 1
		fi
		# grpcurl retries a refused connection until its timeout, so ask only
		# once the port accepts connections.
		if (exec 3<>"/dev/tcp/${addr%:*}/${addr##*:}") 2>/dev/null &&
			out=$("$GRPCURL_BIN" -plaintext -connect-timeout 1 -max-time 2 "$addr" grpc.health.v1.Health/Check 2>/dev/null) &&
			grep -q '"status": "SERVING"' <<<"$out"; then
			return 0
		fi
		sleep 0.1
	done
	return 2
}

# Starts the server on a fresh port and the shared data directory; sets addr.
start_server() {
	local attempt port rc logged
	for attempt in 1 2 3; do
		port=$(pick_port) || fail "found no free loopback port"
		logged=$(wc -l <"$work/server.log")
		addr="127.0.0.1:$port"
		echo "=== start ($attempt): $SNAPCOORD_BIN serve --listen $addr --data-dir $data" >>"$work/server.log"
		"$SNAPCOORD_BIN" serve --listen "$addr" --data-dir "$data" >>"$work/server.log" 2>&1 &
		server_pid=$!
		rc=0
		wait_serving || rc=$?
		case $rc in
		0)
			say "server pid $server_pid is SERVING on $addr"
			return 0
			;;
		1)
			rc=0
			wait "$server_pid" || rc=$?
			server_pid=""
			if tail -n +"$((logged + 1))" "$work/server.log" | grep -q 'address already in use'; then
				say "port $port was taken; trying another"
				continue
			fi
			fail "snapcoord serve exited with status $rc before it was SERVING"
			;;
		*)
			fail "snapcoord serve on $addr was not SERVING after 150 health checks"
			;;
		esac
	done
	fail "could not start snapcoord serve (ports taken 3 times)"
}

# Stops the server with signal $1 and waits for it to exit: at most 200 checks
# 0.1 s apart (the server's drain timeout is 10 s), then SIGKILL. A SIGTERM
# must end in a clean exit, status 0.
stop_server() {
	local sig=$1 rc=0
	kill -s "$sig" "$server_pid"
	if [ "$sig" = KILL ]; then
		# Reap it at once: a SIGKILL is immediate, and bash would otherwise
		# report the killed job on stderr.
		{ wait "$server_pid"; } 2>/dev/null || rc=$?
		server_pid=""
		say "server stopped by SIGKILL (exit status $rc)"
		return 0
	fi
	for _ in $(seq 1 200); do
		kill -0 "$server_pid" 2>/dev/null || break
		sleep 0.1
	done
	if kill -0 "$server_pid" 2>/dev/null; then
		kill -KILL "$server_pid"
		{ wait "$server_pid"; } 2>/dev/null || true
		server_pid=""
		fail "snapcoord serve did not exit within 20 s of SIG$sig"
	fi
	{ wait "$server_pid"; } 2>/dev/null || rc=$?
	server_pid=""
	if [ "$sig" = TERM ] && [ "$rc" -ne 0 ]; then
		fail "snapcoord serve exited with status $rc after SIGTERM"
	fi
	say "server stopped by SIG$sig (exit status $rc)"
}

# --- checks -----------------------------------------------------------------

# show prints a command's output, with run tokens masked.
show() {
	sed -E 's/("run_?[tT]oken": ")[^"]+/\1<redacted>/; s/^/    /' <<<"$1"
}

# expect OUTPUT ERE WHAT: OUTPUT must match the extended regular expression.
expect() {
	grep -Eq -- "$2" <<<"$1" || fail "$3: expected output matching /$2/"
}

start_server

say "health"
out=$(grpcurl -plaintext "$addr" grpc.health.v1.Health/Check)
show "$out"
expect "$out" '"status": "SERVING"' "health"

say "list"
out=$(grpcurl -plaintext "$addr" list)
show "$out"
for svc in snapcoord.v1.RunService snapcoord.v1.WorkerService grpc.health.v1.Health; do
	grep -qx "$svc" <<<"$out" || fail "list does not show $svc"
done

say "describe snapcoord.v1.RunService"
out=$(grpcurl -plaintext "$addr" describe snapcoord.v1.RunService)
show "$out"
expect "$out" '^snapcoord\.v1\.RunService is a service' "describe"
for rpc in CreateRun GetRun ListRuns UpdateDeadline TriggerDeadline CancelRun WatchRun ListWorkers ListSnapshots; do
	expect "$out" "rpc $rpc \(" "describe lists $rpc"
done

say "CreateRun"
created=$(grpcurl -plaintext -d '{"run_id":"grpo-7b-0042","spec":{"trainer_world_size":8,"checkpointing":{"checkpoint_must_save_by":"00:03:45:00"},"rollout_checkpointing":{"snapshot_attempt_interval_s":300},"rollout_recovery":{"target_level":"TARGET_LEVEL_TURN"},"reserve":{"window":5,"margin_seconds":30,"expected_checkpoint_seconds":120,"expected_snapshot_seconds":60}}}' "$addr" snapcoord.v1.RunService/CreateRun)
out=$created
show "$out"
expect "$out" '"run_?[iI]d": "grpo-7b-0042"' "CreateRun returns the run"
expect "$out" '"run_?[tT]oken": "[^"]+"' "CreateRun returns a run token"
expect "$out" '"state": "RUN_STATE_[A-Z]+"' "CreateRun returns the run's state"

say "GetRun"
out=$(grpcurl -plaintext -d '{"run_id":"grpo-7b-0042"}' "$addr" snapcoord.v1.RunService/GetRun)
show "$out"
expect "$out" '"run_?[iI]d": "grpo-7b-0042"' "GetRun returns the run"
expect "$out" '"trainer_?[wW]orld_?[sS]ize": 8' "GetRun returns the spec"

say "CreateRun with an invalid budget"
rc=0
out=$(grpcurl -plaintext -d '{"run_id":"grpo-7b-0042","spec":{"trainer_world_size":8,"checkpointing":{"checkpoint_must_save_by":"3h"},"rollout_checkpointing":{"snapshot_attempt_interval_s":300},"rollout_recovery":{"target_level":"TARGET_LEVEL_TURN"},"reserve":{"window":5,"margin_seconds":30,"expected_checkpoint_seconds":120,"expected_snapshot_seconds":60}}}' "$addr" snapcoord.v1.RunService/CreateRun 2>&1) || rc=$?
show "$out"
[ "$rc" -ne 0 ] || fail "an invalid CreateRun succeeded"
expect "$out" 'Code: InvalidArgument' "invalid CreateRun"
expect "$out" 'Message: .*checkpoint_must_save_by' "invalid CreateRun names the field"

# The trainer-rank part of the walk-through, with the token CreateRun printed.
TOKEN=$(sed -n 's/.*"run_\{0,1\}[tT]oken": "\([^"]*\)".*/\1/p' <<<"$created")
[ -n "$TOKEN" ] || fail "no run token in CreateRun's answer"

say "RegisterWorker"
out=$(grpcurl -plaintext -H "authorization: Bearer $TOKEN" -d '{"run_id":"grpo-7b-0042","role":"WORKER_ROLE_TRAINER","name":"rank-0","rank":0}' "$addr" snapcoord.v1.WorkerService/RegisterWorker)
show "$out"
expect "$out" '"worker_?[iI]d": "w1-b74c5337130f"' "RegisterWorker returns the documented worker id"
expect "$out" '"incarnation": "1"' "RegisterWorker returns the first incarnation"

say "CompleteStep 1"
out=$(grpcurl -plaintext -H "authorization: Bearer $TOKEN" -d '{"run_id":"grpo-7b-0042","worker_id":"w1-b74c5337130f","step":1,"iteration_seconds":41.5}' "$addr" snapcoord.v1.WorkerService/CompleteStep)
show "$out"
expect "$out" '"action": "STEP_ACTION_CONTINUE"' "step 1 continues"
expect "$out" '\(41\.5 \+ 120 \+ 60 \+ 30 s\)' "step 1's explanation shows I, C, R and M"

say "TriggerDeadline"
out=$(grpcurl -plaintext -d '{"run_id":"grpo-7b-0042","reason":"walk-through"}' "$addr" snapcoord.v1.RunService/TriggerDeadline)
show "$out"
expect "$out" '"run_?[iI]d": "grpo-7b-0042"' "TriggerDeadline returns the run"

say "CompleteStep 2"
out=$(grpcurl -plaintext -H "authorization: Bearer $TOKEN" -d '{"run_id":"grpo-7b-0042","worker_id":"w1-b74c5337130f","step":2,"iteration_seconds":41.5}' "$addr" snapcoord.v1.WorkerService/CompleteStep)
show "$out"
expect "$out" '"action": "STEP_ACTION_SAVE_AND_STOP"' "step 2, after the trigger, saves and stops"

# Durability: the run must survive a clean restart and a kill -9.
for sig in TERM KILL; do
	say "restart after SIG$sig on the same data directory"
	stop_server "$sig"
	start_server
	out=$(grpcurl -plaintext -d '{"run_id":"grpo-7b-0042"}' "$addr" snapcoord.v1.RunService/GetRun)
	show "$out"
	expect "$out" '"run_?[iI]d": "grpo-7b-0042"' "GetRun after SIG$sig and restart"
	expect "$out" '"trainer_?[wW]orld_?[sS]ize": 8' "GetRun after SIG$sig and restart returns the spec"
done

# --- README.md's quick start, with snapctl -------------------------------------
say "README quick start"
export PATH="$work/bin:$PATH" SNAPCOORD_ADDR="$addr"
eval "$(snapctl run create demo --world-size 1 --budget 10m --target-level turn)"
[ "${SNAPCOORD_RUN_ID:-}" = demo ] && [ -n "${SNAPCOORD_RUN_TOKEN:-}" ] ||
	fail "run create did not export SNAPCOORD_RUN_ID and SNAPCOORD_RUN_TOKEN"
{ snapctl sidecar --name env0 --on-snapshot 'echo saving $SNAPCOORD_SNAPSHOT_ID' & } >"$work/sidecar.log" 2>&1
sidecar_pid=$!
# A reader types the next command after the sidecar said it registered;
# the script waits for the same (at most 100 checks 0.1 s apart).
for _ in $(seq 1 100); do
	grep -q 'msg=registered' "$work/sidecar.log" && break
	kill -0 "$sidecar_pid" 2>/dev/null || fail "snapctl sidecar exited before it registered"
	sleep 0.1
done
grep -q 'msg=registered' "$work/sidecar.log" || fail "snapctl sidecar did not register"
out=$(snapctl run get demo)
show "$out"
expect "$out" 'state +PENDING' "run get shows the new run"
out=$(snapctl run trigger demo --reason "quick start")
show "$out"
out=$(snapctl run watch demo) || fail "run watch demo exited $? (the run did not end STOPPED)"
show "$out"
expect "$out" 'ended STOPPED' "run watch sees the run stop"
rc=0
wait "$sidecar_pid" || rc=$?
sidecar_pid=""
[ "$rc" -eq 0 ] || fail "snapctl sidecar exited $rc after the run stopped"
expect "$(cat "$work/sidecar.log")" '^saving snap-1$' "the sidecar ran its hook for the deadline snapshot"
out=$(snapctl snapshots demo)
show "$out"
expect "$out" 'snap-1 +deadline +0 +true .* SAVED' "the deadline snapshot was saved"
out=$(snapctl events demo)
show "$out"
expect "$out" 'STOPPED: deadline save complete' "the events tell the deadline save"

# The Python trainer of the quick start needs Debian's python3-grpcio and
# python3-protobuf, which `make test` installs; without them it is skipped,
# and says so.
if /usr/bin/python3 -c 'import grpc, google.protobuf' 2>/dev/null; then
	say "README quick start: a Python trainer"
	eval "$(snapctl run create toy --world-size 1 --budget 20s --checkpoint-every 5)"
	out=$(PYTHONPATH=client/python \
  /usr/bin/python3 client/python/examples/toy_grpo.py --checkpoint-dir "$work/ckpt" 2>&1) ||
		fail "toy_grpo.py exited $?: $(tail -n 5 <<<"$out")"
	show "$(tail -n 3 <<<"$out")"
	expect "$out" 'SAVE_AND_STOP' "the toy trainer was told to save and stop"
	expect "$out" 'stopped: STOPPED: deadline save complete' "the toy trainer's run stopped after its deadline save"
	out=$(snapctl run explain toy)
	show "$out"
	expect "$out" 'saved and stopped' "run explain tells why the run saved"
else
	say "SKIP the README's Python trainer: /usr/bin/python3 lacks grpc or protobuf (make test installs them)"
fi

stop_server TERM
say "PASS"
