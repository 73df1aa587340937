#!/usr/bin/env bash
# slurm-teardown.sh: undoes scripts/slurm-setup.sh. Stops every process
# left in the nodes' network namespaces (slurmd, job steps: a node being
# switched off), slurmctld, and munged if setup started it; deletes the
# namespaces, their links and the bridge, and the jobs' state, so that
# nothing of the test cluster is left running or configured. The packages
# and slurm.conf stay (setup rewrites slurm.conf anyway).
set -uo pipefail

NODES=(n1 n2 n3 n4)
BRIDGE=snapcoord-br
RUNDIR=/run/snapcoord-slurm

log() { printf 'slurm-teardown: %s\n' "$*" >&2; }

[ "$(id -u)" = 0 ] || { log "must run as root"; exit 1; }

# stop PID...: TERM, then KILL whatever is left after 5 s.
stop() {
	[ "$#" -gt 0 ] || return 0
	kill -TERM "$@" 2>/dev/null
	for _ in $(seq 50); do
		kill -0 "$@" 2>/dev/null || return 0
		sleep 0.1
	done
	kill -KILL "$@" 2>/dev/null
	sleep 0.2
}

for node in "${NODES[@]}"; do
	ns=snapcoord-$node
	ip netns list | grep -qw "$ns" || continue
	# shellcheck disable=SC2046 # one pid per word
	stop $(ip netns pids "$ns")
	ip netns del "$ns"
	ip link del "$ns" 2>/dev/null # gone with the namespace's end already, normally
done
[ -f "$RUNDIR/slurmctld.pid" ] && stop "$(cat "$RUNDIR/slurmctld.pid")"
[ -f "$RUNDIR/munged.pid" ] && stop "$(cat "$RUNDIR/munged.pid")"
ip link del "$BRIDGE" 2>/dev/null
# The jobs and node states of this cluster: a later setup starts afresh.
rm -rf "$RUNDIR" /var/lib/slurm/slurmctld/* /var/lib/slurm/nodes
left=$( (ip netns list | grep snapcoord-; ip -br link | grep snapcoord-) 2>/dev/null)
if [ -n "$left" ]; then
	log "left behind: $left"
	exit 1
fi
log "stopped the cluster; no namespace, link or daemon of it is left"
