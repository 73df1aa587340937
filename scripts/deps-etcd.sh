#!/usr/bin/env bash
# deps-etcd.sh: make sure Debian's etcd is installed: etcd-server's
# /usr/bin/etcd, which the etcd store's and the HA tests start as a real
# cluster on loopback (internal/testkit/etcdtest), and etcd-client's etcdctl for
# looking into one. See ensure-debs.sh for what happens when one is missing.
set -euo pipefail
ENSURE_DEBS_FOR=deps-etcd.sh exec "$(dirname "${BASH_SOURCE[0]}")/ensure-debs.sh" \
	etcd-server etcd-client
