#!/usr/bin/env bash
# deps-python.sh: make sure the Debian packages of the Python client are
# installed: its runtime and tests (python3-grpcio, python3-protobuf,
# python3-pytest with python3-pytest-xdist, and python3-venv with python3-pip to test `pip install`, for
# /usr/bin/python3), its code generator (protoc and grpc_python_plugin) and
# its linters (python3-mypy, pyflakes3: make lint). These machines reach no Python package index, so
# Debian's packages are the only source. See ensure-debs.sh for what
# happens when one is missing.
set -euo pipefail
ENSURE_DEBS_FOR=deps-python.sh exec "$(dirname "${BASH_SOURCE[0]}")/ensure-debs.sh" \
	python3-grpcio python3-protobuf python3-pytest python3-pytest-xdist python3-venv python3-pip protobuf-compiler protobuf-compiler-grpc \
	python3-mypy pyflakes3
