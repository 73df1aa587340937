#!/usr/bin/env bash
# make deploy-check: the files under deploy/ are valid for the tools that
# load them.
#   * Prometheus alert rules: promtool check rules, and promtool test rules
#     (each alert fires on the series meant to fire it, and only then).
#   * Grafana dashboard: well-formed JSON, unique panel ids, every query
#     on the chosen data source.
#   * systemd unit: systemd-analyze verify (ExecStart pointed at the built
#     binary, since the unit names its installed path).
#   * Every metric the rules and dashboard query exists in a real scrape,
#     and every snapcoord_ and rpc_server_ family of that scrape has a
#     dashboard panel (TestDeployReferencesRealMetrics); the panels'
#     gridPos do not overlap (TestDeployDashboardLayout).
# Installs Debian's prometheus (for promtool) when missing.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

say() { printf 'deploy-check: %s\n' "$*"; }

scripts/ensure-debs.sh prometheus systemd python3

say "alert rules"
promtool check rules deploy/prometheus/snapcoord-alerts.yml
(cd deploy/prometheus && promtool test rules snapcoord-alerts.test.yml)

say "dashboard"
/usr/bin/python3 - deploy/grafana/snapcoord-dashboard.json <<'PY'
import json, sys
path = sys.argv[1]
with open(path) as f:
    dash = json.load(f)  # fails on malformed JSON
ids, problems = set(), []
def walk(panels):
    for p in panels:
        if p["id"] in ids:
            problems.append(f"panel id {p['id']} is used twice")
        ids.add(p["id"])
        for t in p.get("targets", []):
            if not t.get("expr"):
                problems.append(f"panel {p['title']!r}: a target without expr")
            if t.get("datasource", {}).get("uid") != "${datasource}":
                problems.append(f"panel {p['title']!r}: a target not on the $datasource variable")
        walk(p.get("panels", []))
walk(dash["panels"])
if problems:
    sys.exit(path + ":\n  " + "\n  ".join(problems))
print(f"{path}: {len(ids)} panels, ok")
PY

say "systemd unit"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
[ -x bin/snapcoord ] || go build -o bin/ ./cmd/snapcoord
sed "s#/usr/local/bin/snapcoord#$PWD/bin/snapcoord#" deploy/systemd/snapcoord.service >"$tmp/snapcoord.service"
systemd-analyze verify "$tmp/snapcoord.service"
say "deploy/systemd/snapcoord.service: ok"

say "metric names against a real scrape, dashboard layout"
go test -count=1 -run '^TestDeploy' ./cmd/snapcoord
say "OK"
