#!/usr/bin/env bash
# deps-python.sh: make sure the Debian packages of the Python client are
# installed: its runtime and tests (python3-grpcio, python3-protobuf,
# python3-pytest, for /usr/bin/python3) and its code generator (protoc and
# grpc_python_plugin). These machines reach no Python package index, so
# Debian's packages are the only source. As root (CI, these machines) it
# installs what is missing; otherwise it stops at once with the one line to run.
set -euo pipefail
packages=(python3-grpcio python3-protobuf python3-pytest protobuf-compiler protobuf-compiler-grpc)

installed() {
	dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'install ok installed'
}

missing=()
for p in "${packages[@]}"; do
	installed "$p" || missing+=("$p")
done
if [ "${#missing[@]}" -eq 0 ]; then
	exit 0
fi
line="apt-get update && apt-get install -y ${missing[*]}"
if ! command -v apt-get >/dev/null; then
	echo "deps-python.sh: missing Debian packages ${missing[*]}, and this machine has no apt-get" >&2
	exit 1
fi
if [ "$(id -u)" -ne 0 ]; then
	echo "deps-python.sh: missing Debian packages for the Python client; run as root:" >&2
	echo "  $line" >&2
	exit 1
fi
echo "deps-python.sh: installing ${missing[*]}"
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"
