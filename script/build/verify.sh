#!/usr/bin/env bash
# verify.sh: materialize from scratch into a temporary directory, re-export, and fail if the
# export differs from patches/ (or if any patch no longer applies).
set -euo pipefail
source "$(dirname "$0")/lib.sh"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$(dirname "$0")/materialize.sh" "$tmp/build"
"$(dirname "$0")/export.sh" "$tmp/build" "$tmp/patches" >/dev/null
for name in $(module_names); do
	same_series "$KNEXT_ROOT/patches/$name" "$tmp/patches/$name" ||
		die "verify: patches/$name does not round-trip (see the diff above)"
done
echo "verify: every patch applies and the series round-trips"
