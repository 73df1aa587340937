#!/usr/bin/env bash
# slurm-setup.sh: a four-node Slurm cluster on this one machine, for
# `make slurm-e2e` (docs/slurm.md). Run as root on Debian (bookworm: Slurm
# 22.05). It installs Slurm, munge and python3-torch with apt-get if they
# are missing (scripts/ensure-debs.sh), writes /etc/slurm/slurm.conf, and
# starts:
#
#   munged and slurmctld  on this host, slurmctld reached at 10.253.77.1, the
#                         address of a bridge (snapcoord-br) it creates;
#   slurmd n1 ... n4      each in its own network namespace (snapcoord-n1...)
#                         with one veth link to that bridge and the address
#                         10.253.77.1N, and its own mount namespace where its
#                         spool directory (and pid file) is its own.
#
# Debian's slurmd is built without --enable-multiple-slurmd, so several
# slurmd on one host would share one address and port; namespaces give each
# node its own, as separate hosts have. The namespaces have no route beyond
# 10.253.77.0/24: nothing they send leaves this machine. Files are shared
# (only the spool is per node), as on a cluster with a shared file system.
# munged's socket is a path, so one munged serves every node.
#
# It waits until every node is idle. scripts/slurm-teardown.sh undoes all
# of it. It never overwrites a slurm.conf it did not write (one without the
# marker line below): on a machine that belongs to a real cluster it stops.
set -euo pipefail

MARKER='# written by snapcoord scripts/slurm-setup.sh'
CONF=/etc/slurm/slurm.conf
WAIT_S=${SLURM_SETUP_WAIT_S:-60}
NODES=(n1 n2 n3 n4)
NET=10.253.77
BRIDGE=snapcoord-br
# What teardown needs: the pids of the daemons this script started.
RUNDIR=/run/snapcoord-slurm

log() { printf 'slurm-setup: %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }

[ "$(id -u)" = 0 ] || die "must run as root (it installs packages, makes network namespaces and starts daemons)"

install_packages() {
	# Installed before slurm.conf exists, the packages' init scripts start
	# no Slurm daemon (munge's may start munged: start_munged finds it).
	# python3-torch: the trainer ranks of the e2e are a real torch.distributed loop.
	ENSURE_DEBS_FOR=slurm-setup.sh "$(dirname "${BASH_SOURCE[0]}")/ensure-debs.sh" munge slurmctld slurmd slurm-client iproute2 python3-torch
}

# write_conf writes slurm.conf for the four nodes. Job accounting is off (no
# slurmdbd) and processes are tracked without cgroups (linuxproc): the
# machine may be a container without a writable cgroup tree.
write_conf() {
	local tmp i
	tmp=$(mktemp)
	cat >"$tmp" <<EOF
$MARKER
# Four nodes on this host, each slurmd in its own network namespace.
# Edit the script, not this file: it is rewritten.
ClusterName=snapcoord
SlurmctldHost=$(hostname -s)($NET.1)
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
# A node whose slurmd stops answering is DOWN after this many seconds, and
# its jobs requeued: short, for the test's node failure.
SlurmdTimeout=10
StateSaveLocation=/var/lib/slurm/slurmctld
# Per node: each slurmd's mount namespace binds its own directory here.
SlurmdSpoolDir=/var/lib/slurm/slurmd
SlurmdPidFile=/var/lib/slurm/slurmd/slurmd.pid
SlurmctldPidFile=$RUNDIR/slurmctld.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
# The nodes are namespaces of one host: each offers the CPUs written here
# whatever the machine has (2 tasks per node), as slurm.conf says, not as
# slurmd finds.
SlurmdParameters=config_overrides
# Slurm's defaults, written out because docs/slurm.md relies on them: SIGTERM
# at the time limit, SIGKILL KillWait seconds later; no grace beyond it.
KillWait=30
OverTimeLimit=0
EOF
	for i in "${!NODES[@]}"; do
		echo "NodeName=${NODES[$i]} NodeAddr=$NET.$((11 + i)) CPUs=2 RealMemory=1000 State=UNKNOWN" >>"$tmp"
	done
	echo "PartitionName=debug Nodes=$(
		IFS=,
		echo "${NODES[*]}"
	) Default=YES MaxTime=INFINITE State=UP" >>"$tmp"
	if [ -f "$CONF" ] && cmp -s "$tmp" "$CONF"; then
		rm -f "$tmp"
		return 0
	fi
	if [ -f "$CONF" ] && ! grep -qxF "$MARKER" "$CONF"; then
		rm -f "$tmp"
		die "$CONF exists and was not written by this script; not touching it"
	fi
	install -m 0644 "$tmp" "$CONF"
	rm -f "$tmp"
	log "wrote $CONF (nodes ${NODES[*]})"
}

running() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

make_network() {
	local i node
	if ! ip link show "$BRIDGE" >/dev/null 2>&1; then
		ip link add "$BRIDGE" type bridge
		ip addr add "$NET.1/24" dev "$BRIDGE"
	fi
	ip link set "$BRIDGE" up
	for i in "${!NODES[@]}"; do
		node=${NODES[$i]}
		ip netns list | grep -qw "snapcoord-$node" && continue
		ip netns add "snapcoord-$node"
		ip link add "snapcoord-$node" type veth peer name eth0 netns "snapcoord-$node"
		ip link set "snapcoord-$node" master "$BRIDGE" up
		ip -n "snapcoord-$node" addr add "$NET.$((11 + i))/24" dev eth0
		ip -n "snapcoord-$node" link set eth0 up
		ip -n "snapcoord-$node" link set lo up
	done
	log "network namespaces snapcoord-${NODES[0]}...${NODES[-1]} on bridge $BRIDGE ($NET.0/24)"
}

start_munged() {
	mkdir -p /run/munge /var/log/munge /var/lib/munge
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
		cp /run/munge/munged.pid "$RUNDIR/munged.pid" # ours to stop
	fi
}

start_slurm() {
	local node
	mkdir -p /var/log/slurm /var/lib/slurm/slurmctld /var/lib/slurm/slurmd
	if ! running "$RUNDIR/slurmctld.pid"; then
		log "starting slurmctld"
		slurmctld
	fi
	for node in "${NODES[@]}"; do
		mkdir -p "/var/lib/slurm/nodes/$node"
		running "/var/lib/slurm/nodes/$node/slurmd.pid" && continue
		log "starting slurmd $node"
		# The node's network namespace, and a mount namespace of its own
		# where the bind mount gives it its own spool and pid file. Not `ip
		# netns exec`: it mounts a fresh /sys, without the cgroup tree
		# slurmd looks for.
		nsenter --net="/run/netns/snapcoord-$node" unshare --mount --propagation private sh -c \
			'mount --bind "/var/lib/slurm/nodes/$1" /var/lib/slurm/slurmd && exec slurmd -N "$1" -L "/var/log/slurm/slurmd-$1.log"' \
			sh "$node"
	done
}

wait_idle() {
	local states i
	for i in $(seq "$WAIT_S"); do
		states=$(sinfo -h -N -o '%N %T' 2>/dev/null | sort -u || true)
		if [ -n "$states" ] && ! grep -qv ' idle$' <<<"$states"; then
			log "nodes ${NODES[*]} idle ($(sinfo -V))"
			return 0
		fi
		# A node that was down before a restart: ReturnToService=2 brings it
		# back once its slurmd registers; nudge it in case.
		grep -E ' (down|drain)' <<<"$states" | while read -r n _; do scontrol update NodeName="$n" State=RESUME 2>/dev/null || true; done
		sleep 1
	done
	die "nodes not idle after ${WAIT_S}s: $(tr '\n' ' ' <<<"$states"); see /var/log/slurm/slurmctld.log and slurmd-*.log"
}

# stop_old PIDFILE NAME: stops a daemon of the single-node cluster an earlier
# version of this script started (its slurmd would hold this host's port).
stop_old() {
	running "$1" || return 0
	log "stopping the single-node cluster's $2"
	kill "$(cat "$1")"
	for _ in $(seq 50); do
		running "$1" || return 0
		sleep 0.1
	done
	die "$2 did not stop"
}

install_packages
mkdir -p "$RUNDIR"
stop_old /run/slurmd.pid slurmd
stop_old /run/slurmctld.pid slurmctld
write_conf
make_network
start_munged
start_slurm
wait_idle
