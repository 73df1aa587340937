#!/usr/bin/env bash
# gen-python.sh OUT: generate the Python code of snapcoord.v1, and of the
# buf.validate annotations it imports, into OUT (make generate: client/python;
# make verify-generated: a temporary directory), with type stubs (.pyi) for
# mypy. Debian's protoc (3.21, from protobuf-compiler) and grpc_python_plugin
# (protobuf-compiler-grpc) are used rather than python3-grpc-tools, whose
# bundled protoc is too old for the python3-protobuf 4.21 runtime.
#
# buf.validate goes to snapcoord/_vendor/buf/validate, so that the package
# installs no top-level name but snapcoord (a `buf` of its own would collide
# with any other package vendoring it). protoc writes it as the top-level
# package its proto names; the imports of it, and the module name its
# messages carry, are rewritten here.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out=${1:?usage: gen-python.sh OUT_DIR}
plugin=$(command -v grpc_python_plugin) || {
	echo "gen-python.sh: grpc_python_plugin not found (apt-get install protobuf-compiler-grpc)" >&2
	exit 1
}
vendor=snapcoord._vendor
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# Sorted, so the output does not depend on the shell's glob order.
mapfile -t protos < <(printf '%s\n' proto/snapcoord/v1/*.proto | LC_ALL=C sort)
protoc -Iproto -Ithird_party/protovalidate \
	--python_out="$tmp" --pyi_out="$tmp" --grpc_python_out="$tmp" --plugin=protoc-gen-grpc_python="$plugin" \
	"${protos[@]}" third_party/protovalidate/buf/validate/validate.proto

# copy SRC_DIR DST_DIR: the generated files, buf.validate moved under $vendor.
copy() {
	mkdir -p "$out/$2"
	for f in "$tmp/$1"/*; do
		sed -e "s/^from buf\.validate import /from $vendor.buf.validate import /" \
			-e "s/'buf\.validate\.validate_pb2'/'$vendor.buf.validate.validate_pb2'/" \
			"$f" >"$out/$2/$(basename "$f")"
	done
}
copy snapcoord/v1 snapcoord/v1
copy buf/validate "${vendor//.//}/buf/validate"
