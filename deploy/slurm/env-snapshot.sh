#!/bin/sh
# The recipe's --on-snapshot hook (docs/slurm.md): `snapctl sidecar` runs it
# for each snapshot of the worker SNAPCOORD_WORKER_NAME. A real environment
# worker writes its unfinished rollouts here; this one writes a small record
# of what it was asked to save, taking ENV_SNAPSHOT_SECONDS like a real save.
set -eu
dir="$ENV_STATE_DIR/$SNAPCOORD_WORKER_NAME"
mkdir -p "$dir"
sleep "${ENV_SNAPSHOT_SECONDS:-1}"
tmp="$dir/.$SNAPCOORD_SNAPSHOT_ID.tmp"
printf '{"snapshot":"%s","reason":"%s","anchor_step":%s,"forced":%s}\n' \
	"$SNAPCOORD_SNAPSHOT_ID" "$SNAPCOORD_REASON" "$SNAPCOORD_ANCHOR_STEP" "$SNAPCOORD_FORCED" >"$tmp"
mv "$tmp" "$dir/$SNAPCOORD_SNAPSHOT_ID.json"
