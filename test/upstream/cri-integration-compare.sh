#!/usr/bin/env bash
# cri-integration-compare.sh [-quick | -run REGEXP] [-count N] [-reruns N]: containerd's CRI
# integration tests (cri-integration.sh) against knext and against upstream containerd built from
# the pristine module, side by side; -quick, -run and -count select tests as cri-integration.sh
# does. Every test whose outcome differs between the two columns is then run again on both, N
# times (-reruns, default 3; 0: no reruns), and only those, before cricompare judges it
# (internal/compare): a regression when knext does worse than upstream in every run, flaky when
# the difference does not hold, fixed when knext does better every time.
#
# Prints knext's test2json stream (the suite's own tests), each flaky test's failure turned into a
# pass that says so; writes the streams, their logs and the comparison (a column per daemon, every
# difference with its verdict and its passes per column, every skip with upstream's reason, counts
# and flaky tests per test file) to $LOG_DIR (default build/test-logs):
# cri-integration-{knext,upstream}[-reruns].*, cri-integration-compare.txt and .md; the flaky
# tests, one a line, to $KNEXT_FLAKY_LIST if set. Fails when a test is a regression.
#
# Both columns run at once, each in namespaces of its own: the suite waits far more than it
# computes (containerd restarts, stop timeouts), so on two cores the pair takes little longer than
# one column. What both need is built first, once.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
here=$(cd "$(dirname "$0")" && pwd)
select=() reruns=3
while [ $# -gt 0 ]; do
	case $1 in
	-quick) select+=(-quick) && shift ;;
	-run | -count) select+=("$1" "$2") && shift 2 ;;
	-reruns) reruns=$2 && shift 2 ;;
	*) die "usage: $0 [-quick | -run REGEXP] [-count N] [-reruns N]" ;;
	esac
done
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

# columns NAME ARGS...: runs cri-integration.sh ARGS against both daemons at once, into
# $logs/cri-integration-<daemon>NAME.{json,log} and the daemons' logs into
# $logs/cri-integration-<daemon>NAME/. A column exits non-zero when one of its tests fails: that
# is for the comparison to judge, so its exit status only goes to its log.
columns() {
	local name=$1 daemon status
	shift
	declare -A pids
	for daemon in knext upstream; do
		CRI_LOG_DIR=$logs/cri-integration-$daemon$name "$here/cri-integration.sh" -daemon "$daemon" "$@" \
			>"$logs/cri-integration-$daemon$name.json" 2>"$logs/cri-integration-$daemon$name.log" &
		pids[$daemon]=$!
	done
	for daemon in knext upstream; do
		status=0
		wait "${pids[$daemon]}" || status=$?
		echo "cri-integration-compare: the $daemon column exited $status" >>"$logs/cri-integration-$daemon$name.log"
	done
}

# Built, not run with go run: go run says "exit status 1" on stderr when it exits 1.
(cd "$KNEXT_ROOT" && go build -o "$BUILD_DIR/bin/cricompare" ./test/upstream/cricompare)
cricompare() {
	"$BUILD_DIR/bin/cricompare" -knext "$logs/cri-integration-knext.json" -upstream "$logs/cri-integration-upstream.json" "$@"
}

rm -rf "$logs"/cri-integration-{knext,upstream}-reruns* "$logs/cri-integration-judged.json"
columns "" "${select[@]}"
rerun_args=()
if [ "$reruns" -gt 0 ]; then
	pattern=$(cricompare -rerun-pattern)
	if [ -n "$pattern" ]; then
		columns -reruns -run "$pattern" -count "$reruns"
		rerun_args=(-knext-reruns "$logs/cri-integration-knext-reruns.json"
			-upstream-reruns "$logs/cri-integration-upstream-reruns.json" -reruns "$reruns")
	fi
fi
status=0
cricompare "${rerun_args[@]}" -source "$(upstream_module_dir containerd)/integration" \
	-markdown "$logs/cri-integration-compare.md" -judged-stream "$logs/cri-integration-judged.json" \
	-flaky "${KNEXT_FLAKY_LIST:-/dev/null}" >"$logs/cri-integration-compare.txt" || status=1
# Without a judgement (cricompare could not compare: its error is on stderr), knext's stream as it is.
cat "$logs/cri-integration-judged.json" 2>/dev/null || cat "$logs/cri-integration-knext.json"
exit $status
