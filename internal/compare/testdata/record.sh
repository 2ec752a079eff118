#!/bin/sh
# record.sh: records the `go test -json` streams of compare's tests from the package in fixture/,
# each case a first run of both columns, then the reruns (-count 3) of the tests that differed,
# selected as GoTestRunPattern selects them.
set -eu
cd "$(dirname "$0")/fixture"
# record FILE TESTS-TO-FAIL [go test flags]
record() {
	out=$1 fail=$2
	shift 2
	mkdir -p "$(dirname "../$out")"
	FIXTURE_FAIL=$fail GOWORK=off go test -json "$@" . >"../$out" || true
}
usr1=TestContainerStopSignals/SIGUSR1_stop_signal
default=TestDefaultContainerStopSignal

# flaky: SIGUSR1 fails once on knext, then passes in every rerun on both columns.
record flaky/knext.json "$usr1" -count 1
record flaky/upstream.json "" -count 1
record flaky/knext-rerun.json "" -count 3 -run '^TestContainerStopSignals$/^SIGUSR1_stop_signal$'
record flaky/upstream-rerun.json "" -count 3 -run '^TestContainerStopSignals$/^SIGUSR1_stop_signal$'

# regression: SIGUSR1 and the default stop signal fail on knext every time, pass on upstream.
record regression/knext.json "$usr1 $default" -count 1
record regression/upstream.json "" -count 1
record regression/knext-rerun.json "$usr1 $default" -count 3 \
	-run '^TestContainerStopSignals$/^SIGUSR1_stop_signal$|^TestDefaultContainerStopSignal$'
record regression/upstream-rerun.json "" -count 3 \
	-run '^TestContainerStopSignals$/^SIGUSR1_stop_signal$|^TestDefaultContainerStopSignal$'
