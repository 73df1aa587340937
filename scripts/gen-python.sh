#!/usr/bin/env bash
# gen-python.sh OUT: generate the Python code of snapcoord.v1 and of the
# buf.validate annotations it imports into OUT (make generate: client/python;
# make verify-generated: a temporary directory). Debian's protoc (3.21, from
# protobuf-compiler) and grpc_python_plugin (protobuf-compiler-grpc) are used
# rather than python3-grpc-tools, whose bundled protoc is too old for the
# python3-protobuf 4.21 runtime.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out=${1:?usage: gen-python.sh OUT_DIR}
plugin=$(command -v grpc_python_plugin) || {
	echo "gen-python.sh: grpc_python_plugin not found (apt-get install protobuf-compiler-grpc)" >&2
	exit 1
}
mkdir -p "$out"
# Sorted, so the output does not depend on the shell's glob order.
mapfile -t protos < <(printf '%s\n' proto/snapcoord/v1/*.proto | LC_ALL=C sort)
protoc -Iproto -Ithird_party/protovalidate \
	--python_out="$out" --grpc_python_out="$out" --plugin=protoc-gen-grpc_python="$plugin" \
	"${protos[@]}" third_party/protovalidate/buf/validate/validate.proto
