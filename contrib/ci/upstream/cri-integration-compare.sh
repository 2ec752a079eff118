#!/usr/bin/env bash
# cri-integration-compare.sh [-quick]: containerd's CRI integration tests (cri-integration.sh)
# against knext and against upstream containerd built from the pristine module, side by side.
# Prints knext's test2json stream (the suite's own tests); writes both streams, their logs and the
# comparison (cricompare: a column per daemon, every difference, every skip with upstream's reason,
# counts per test file) to $LOG_DIR (default build/test-logs): cri-integration-{knext,upstream}.*,
# cri-integration-compare.txt and .md. Fails when knext fails or skips a test that upstream passes.
#
# Both columns run at once, each in namespaces of its own: the suite waits far more than it
# computes (containerd restarts, stop timeouts), so on two cores the pair takes little longer than
# one column. What both need is built first, once.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
here=$(cd "$(dirname "$0")" && pwd)
quick=()
[ "${1:-}" = -quick ] && quick=(-quick)
logs=${LOG_DIR:-$BUILD_DIR/test-logs}
mkdir -p "$logs"

# What the builds print goes to a log of its own, shown only if they fail: make test reads this
# script's stderr through gotestsum, which counts every line there as a package error.
prepare_log=$logs/cri-integration-prepare.log
if ! { "$here/cni-plugins.sh" "$BUILD_DIR/cni-plugins" &&
	"$here/previous-releases.sh" "$BUILD_DIR/previous-releases"; } >"$prepare_log" 2>&1; then
	cat "$prepare_log" >&2
	die "cri-integration-compare: cannot build the CNI plugins or the previous releases (log: $prepare_log)"
fi

declare -A pids
for daemon in knext upstream; do
	CRI_LOG_DIR=$logs/cri-integration-$daemon "$here/cri-integration.sh" -daemon "$daemon" "${quick[@]}" \
		>"$logs/cri-integration-$daemon.json" 2>"$logs/cri-integration-$daemon.log" &
	pids[$daemon]=$!
done
# A column exits non-zero when one of its tests fails: knext's failures count in its stream, and
# upstream's only in the comparison.
for daemon in knext upstream; do
	wait "${pids[$daemon]}" || echo "cri-integration-compare: the $daemon column exited $? (log: $logs/cri-integration-$daemon.log)" >&2
done
status=0

cat "$logs/cri-integration-knext.json"
(cd "$KNEXT_ROOT" && go run ./contrib/ci/upstream/cricompare -knext "$logs/cri-integration-knext.json" \
	-upstream "$logs/cri-integration-upstream.json" -source "$(upstream_module_dir containerd)/integration" \
	-markdown "$logs/cri-integration-compare.md") >"$logs/cri-integration-compare.txt" || status=1
exit $status
