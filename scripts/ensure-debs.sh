#!/usr/bin/env bash
# Installs Debian packages for the commands a check needs, only when a
# command is missing: scripts/ensure-debs.sh COMMAND:PACKAGE...
# (e.g. chromium:chromium promtool:prometheus). Needs root to install; CI
# runs as root. apt-get update runs once, and only if something is missing.
set -euo pipefail

missing=()
for pair in "$@"; do
	cmd=${pair%%:*} pkg=${pair#*:}
	command -v "$cmd" >/dev/null 2>&1 || missing+=("$pkg")
done
[ "${#missing[@]}" -eq 0 ] && exit 0

if [ "$(id -u)" -ne 0 ]; then
	echo "ensure-debs: missing ${missing[*]}; install them (apt-get install ${missing[*]}) or run as root" >&2
	exit 1
fi
echo "ensure-debs: apt-get install ${missing[*]}"
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
