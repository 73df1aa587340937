#!/usr/bin/env bash
# deps-etcd.sh: make sure Debian's etcd is installed: etcd-server (the
# /usr/bin/etcd that internal/etcdtest starts as a 3-member cluster on
# loopback for the etcd store's tests, make crashtest-ha and make bench) and
# etcd-client (etcdctl, for looking at a cluster by hand). The Go module
# go.etcd.io/etcd/server is not used: it would pull its own grpc and otel
# versions into go.mod. See ensure-debs.sh for what happens when one is
# missing.
set -euo pipefail
ENSURE_DEBS_FOR=deps-etcd.sh exec "$(dirname "${BASH_SOURCE[0]}")/ensure-debs.sh" etcd-server etcd-client
