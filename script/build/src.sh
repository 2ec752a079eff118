#!/usr/bin/env bash
# src.sh [BUILDDIR]: (re)materialize BUILDDIR/src/* (default build/) unless that would throw away work that is not yet in
# patches/ (commits not exported with `make patches`, or uncommitted hand edits).
set -euo pipefail
source "$(dirname "$0")/lib.sh"

build=${1:-$KNEXT_ROOT/build}
for name in $(module_names); do
	tree="$build/src/$name"
	[ -d "$tree/.git" ] || continue
	if [ -n "$(git -C "$tree" status --porcelain -- . "${KNEXT_GENERATED_PATHSPEC[@]}")" ]; then
		die "$tree has uncommitted changes; commit them (then make patches) or discard them before make src"
	fi
	# No commit since materialize: nothing to lose, even if patches/ moved on meanwhile.
	[ "$(git -C "$tree" rev-parse HEAD)" = "$(cat "$tree/.git/knext-applied-head" 2>/dev/null)" ] && continue
	exported=$(mktemp -d)
	trap 'rm -rf "$exported"' EXIT
	export_series "$tree" "$name" "$exported"
	if ! same_series "$KNEXT_ROOT/patches/$name" "$exported" >/dev/null; then
		die "$tree has commits that differ from patches/$name; run make patches first (or remove $tree to drop them)"
	fi
done
"$(dirname "$0")/materialize.sh" "$build"
