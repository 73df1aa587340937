#!/usr/bin/env bash
# ensure-debs.sh PACKAGE...: make sure these Debian packages are installed.
# These machines reach no other package source for them. As root (CI, these
# machines) it installs what is missing (apt-get update runs only then);
# otherwise it stops at once with the one line to run.
set -euo pipefail
who="${ENSURE_DEBS_FOR:-ensure-debs.sh}"

installed() {
	dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'install ok installed'
}

missing=()
for p in "$@"; do
	installed "$p" || missing+=("$p")
done
if [ "${#missing[@]}" -eq 0 ]; then
	exit 0
fi
line="apt-get update && apt-get install -y ${missing[*]}"
if ! command -v apt-get >/dev/null; then
	echo "$who: missing Debian packages ${missing[*]}, and this machine has no apt-get" >&2
	exit 1
fi
if [ "$(id -u)" -ne 0 ]; then
	echo "$who: missing Debian packages ${missing[*]}; run as root:" >&2
	echo "  $line" >&2
	exit 1
fi
echo "$who: installing ${missing[*]}"
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"
