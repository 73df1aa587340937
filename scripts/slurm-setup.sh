#!/usr/bin/env bash
# slurm-setup.sh: a single-node Slurm cluster on this machine, for
# `make slurm-e2e` (docs/slurm.md). Run as root on Debian (bookworm: Slurm
# 22.05). Idempotent: it installs Slurm and munge with apt-get if they are
# missing (scripts/ensure-debs.sh), writes /etc/slurm/slurm.conf for one
# node (this host, with the CPUs and memory `slurmd -C` finds), starts
# munged, slurmctld and slurmd as plain daemons (no systemd needed) unless
# they already run, and waits until `sinfo` shows the node idle.
#
# It never overwrites a slurm.conf it did not write (one without the marker
# line below): on a machine that already belongs to a cluster it stops.
set -euo pipefail

MARKER='# written by snapcoord scripts/slurm-setup.sh'
CONF=/etc/slurm/slurm.conf
WAIT_S=${SLURM_SETUP_WAIT_S:-60}

log() { printf 'slurm-setup: %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }

[ "$(id -u)" = 0 ] || die "must run as root (it installs packages and starts daemons)"

install_packages() {
	# Installed before slurm.conf exists, the packages' init scripts start
	# no Slurm daemon (munge's may start munged: start_daemons finds it).
	ENSURE_DEBS_FOR=slurm-setup.sh "$(dirname "${BASH_SOURCE[0]}")/ensure-debs.sh" munge slurmctld slurmd slurm-client
}

# write_conf writes slurm.conf for one node named after this host. Job
# accounting is off (no slurmdbd) and processes are tracked without cgroups
# (linuxproc): the machine may be a container without a writable cgroup tree.
write_conf() {
	local node cpus mem tmp
	node=$(hostname -s)
	# slurmd -C prints this node's line as slurm.conf wants it.
	read -r cpus mem < <(slurmd -C | sed -n 's/^NodeName=.* CPUs=\([0-9]*\) .*RealMemory=\([0-9]*\).*/\1 \2/p')
	[ -n "${cpus:-}" ] && [ -n "${mem:-}" ] || die "could not read CPUs and RealMemory from slurmd -C"
	tmp=$(mktemp)
	cat >"$tmp" <<EOF
$MARKER
# One node, this host. Edit the script, not this file: it is rewritten.
ClusterName=snapcoord
SlurmctldHost=$node
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
ReturnToService=2
StateSaveLocation=/var/lib/slurm/slurmctld
SlurmdSpoolDir=/var/lib/slurm/slurmd
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
# Slurm's defaults, written out because docs/slurm.md relies on them: SIGTERM
# at the time limit, SIGKILL KillWait seconds later; no grace beyond it.
KillWait=30
OverTimeLimit=0
NodeName=$node CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=debug Nodes=$node Default=YES MaxTime=INFINITE State=UP
EOF
	if [ -f "$CONF" ] && cmp -s "$tmp" "$CONF"; then
		rm -f "$tmp"
		return 1 # unchanged
	fi
	if [ -f "$CONF" ] && ! grep -qxF "$MARKER" "$CONF"; then
		rm -f "$tmp"
		die "$CONF exists and was not written by this script; not touching it"
	fi
	install -m 0644 "$tmp" "$CONF"
	rm -f "$tmp"
	log "wrote $CONF (node $node, $cpus CPUs, $mem MB)"
	return 0
}

running() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

stop_daemon() {
	local pidfile=$1 name=$2 i
	running "$pidfile" || return 0
	log "stopping $name (new slurm.conf)"
	kill "$(cat "$pidfile")"
	for i in $(seq 50); do
		running "$pidfile" || return 0
		sleep 0.1
	done
	die "$name did not stop"
}

start_daemons() {
	mkdir -p /run/munge /var/log/munge /var/lib/munge /var/log/slurm /var/lib/slurm/slurmctld /var/lib/slurm/slurmd
	chown munge:munge /run/munge /var/log/munge /var/lib/munge
	if [ ! -s /etc/munge/munge.key ]; then
		log "creating /etc/munge/munge.key"
		mungekey --create --keyfile=/etc/munge/munge.key
		chown munge:munge /etc/munge/munge.key
		chmod 0400 /etc/munge/munge.key
	fi
	if ! running /run/munge/munged.pid; then
		log "starting munged"
		runuser -u munge -- /usr/sbin/munged
	fi
	if ! running /run/slurmctld.pid; then
		log "starting slurmctld"
		slurmctld
	fi
	if ! running /run/slurmd.pid; then
		log "starting slurmd"
		slurmd
	fi
}

wait_idle() {
	local node state i
	node=$(hostname -s)
	for i in $(seq "$WAIT_S"); do
		state=$(sinfo -h -n "$node" -o %T 2>/dev/null || true)
		case $state in
		idle | mixed | allocated)
			log "node $node is $state ($(sinfo -V))"
			return 0
			;;
		down* | drain*)
			# A node that was down before the restart: ReturnToService=2
			# brings it back once slurmd registers; nudge it in case.
			scontrol update NodeName="$node" State=RESUME 2>/dev/null || true
			;;
		esac
		sleep 1
	done
	die "node $node not idle after ${WAIT_S}s (state '${state:-?}'); see /var/log/slurm/slurmctld.log and slurmd.log"
}

install_packages
if write_conf; then
	stop_daemon /run/slurmd.pid slurmd
	stop_daemon /run/slurmctld.pid slurmctld
fi
start_daemons
wait_idle
