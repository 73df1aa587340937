#!/usr/bin/env bash
# Runs govulncheck (pinned in tools/lint/go.mod) against a local database and
# fails if the code calls a vulnerable symbol, unless that vulnerability is in
# scripts/govulncheck-allow.txt. Called by `make vuln`.
#
#   scripts/govulncheck.sh file:///abs/path/to/db ./...
#
# Vulnerabilities in imported packages or required modules that the code does
# not call are reported by govulncheck but, as with govulncheck itself, do not
# fail the check.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

db=$1
shift
allow_file=scripts/govulncheck-allow.txt

out=$(mktemp)
trap 'rm -f "$out"' EXIT

rc=0
go tool -modfile=tools/lint/go.mod govulncheck -db "$db" "$@" >"$out" 2>&1 || rc=$?
case $rc in
0)
	cat "$out"
	exit 0
	;;
3) ;; # vulnerabilities found: sort them out below
*)
	cat "$out"
	echo "vuln: govulncheck failed (exit status $rc)" >&2
	exit "$rc"
	;;
esac

# IDs of the vulnerabilities the code calls: the "Symbol Results" section of
# govulncheck's text output ("Vulnerability #1: GO-2026-6809").
called=$(awk '/^=== Symbol Results ===/ { s = 1; next } /^=== / { s = 0 }
	s && /^Vulnerability #[0-9]+: / { print $3 }' "$out" | sort -u)
allowed=$(sed 's/#.*//' "$allow_file" | awk 'NF { print $1 }' | sort -u)
unexpected=$(comm -23 <(printf '%s\n' "$called") <(printf '%s\n' "$allowed") | sed '/^$/d')
stale=$(comm -13 <(printf '%s\n' "$called") <(printf '%s\n' "$allowed") | sed '/^$/d')

if [ -n "$unexpected" ]; then
	cat "$out"
	echo >&2
	echo "vuln: FAIL: the code calls vulnerable symbols (not in $allow_file):" >&2
	sed 's/^/  /' <<<"$unexpected" >&2
	exit 1
fi

# Everything called is allowed: show the findings without their call traces.
grep -vE '^[[:space:]]+#[0-9]+: |^[[:space:]]+Example traces found:' "$out"
echo
echo "vuln: ok: every called vulnerability is listed in $allow_file:"
sed 's/^/  /' <<<"$called"
if [ -n "$stale" ]; then
	echo "vuln: listed in $allow_file but not called today:"
	sed 's/^/  /' <<<"$stale"
fi
