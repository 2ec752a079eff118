#!/usr/bin/env bash
# test.sh: every test suite of knext (`make test`). Each suite writes a `go test -json` stream;
# gotestsum reads it, writes the suite's log and counts its tests. Prints one row per suite, a
# total and the wall time; exits non-zero if any suite failed or ran nothing. Logs:
# build/test-logs/<suite>.{json,log}.
#
# A suite that compares knext with upstream side by side reruns what differs before it judges
# (internal/compare): it lists its flaky tests, which do not fail it, in $KNEXT_FLAKY_LIST (one a
# line, with the passes per column), and they show under its row and in the summary.
set -uo pipefail
started=$(date +%s)
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
logs=$root/build/test-logs
results=$logs/results.tsv
rm -rf "$logs" && mkdir -p "$logs"

# Packages of our own module that have tests and need no running stack.
own_packages() {
	go list -f '{{if or .TestGoFiles .XTestGoFiles}}{{.ImportPath}}{{end}}' ./... |
		grep -v '^github.com/knext-dev/knext/integration'
}

# run_suite NAME COMMAND...: runs COMMAND, whose standard output is a test2json stream, through
# gotestsum, and adds a row to $results: name, exit code, seconds, gotestsum's counts (tests,
# failed, skipped, errors; absent if it could not read the stream), then the flaky tests' count.
run_suite() {
	local name=$1 start rc row flaky
	shift
	start=$(date +%s)
	echo "=== suite $name: $*"
	row=$logs/$name.counts
	flaky=$logs/$name.flaky
	KNEXT_FLAKY_LIST=$flaky gotestsum --format pkgname-and-test-fails --hide-summary skipped --jsonfile "$logs/$name.json" \
		--post-run-command "sh -c 'echo \$TESTS_TOTAL \$TESTS_FAILED \$TESTS_SKIPPED \$TESTS_ERRORS >$row'" \
		--raw-command -- "$@" >"$logs/$name.log" 2>&1
	rc=$?
	printf '%s\t%s\t%s\t%s\t%s\n' "$name" "$rc" "$(($(date +%s) - start))" "$(cat "$row" 2>/dev/null)" \
		"$(cat "$flaky" 2>/dev/null | wc -l)" >>"$results"
	grep '^DONE ' "$logs/$name.log" | tail -n 1
	echo "    ($(($(date +%s) - start)) s; log: build/test-logs/$name.log)"
	if [ -s "$flaky" ]; then
		echo "    flaky (differed from upstream, then not in every rerun; not failing), passes per column:"
		sed 's/^/      /' "$flaky"
	fi
	# gotestsum's fourth count is its errors (stderr lines, crashes): they fail the suite even
	# when its command succeeded, so show them too.
	if [ "$rc" != 0 ] || [ "$(cut -d' ' -f4 "$row" 2>/dev/null)" != 0 ]; then
		echo "--- last lines of build/test-logs/$name.log:"
		tail -n 40 "$logs/$name.log" | sed 's/^/    /'
	fi
}

# golangci-lint on our own module (.golangci.yml, close to containerd's).
run_suite lint script/ci/golangci-lint.sh -json
run_suite knext-unit go test -race -json -timeout 30m $(own_packages)
run_suite nri-unit test/upstream/nri-unit.sh
run_suite containerd-unit test/upstream/containerd-unit.sh
# Every patch of both series on its own: build, Windows build (containerd), its packages' tests.
run_suite verify-series script/build/verify-series.sh -json
# A few seconds of coverage-guided fuzzing of the validation of the IPs plugins report.
run_suite nri-fuzz go test -json -run '^$' -fuzz '^FuzzCheckPodIPs$' -fuzztime 5s \
	github.com/containerd/nri/pkg/api
# The integration tests on the real stack; the figures of the churn test (knext and upstream
# containerd) follow its row.
figures=$logs/integration-figures.txt
KNEXT_TEST_FIGURES=$figures run_suite knext-integration go test -race -count=1 -p 2 -json -timeout 20m -skip '^TestKubelet|^TestCluster$' ./integration/...
[ -s "$figures" ] && sed 's/^/    /' "$figures"
# A real kubelet on knext (integration/kubelet_test.go); its figures follow its row.
figures=$logs/kubelet-figures.txt
KNEXT_TEST_FIGURES=$figures run_suite kubelet-e2e go test -race -count=1 -json -timeout 30m -run '^TestKubelet' ./integration
[ -s "$figures" ] && sed 's/^/    /' "$figures"
# A real Kubernetes cluster on knext and on the upstream baseline (integration/cluster_test.go,
# docs/cluster.md); its figures follow its row.
figures=$logs/cluster-figures.txt
KNEXT_TEST_FIGURES=$figures run_suite cluster-e2e go test -race -count=1 -json -timeout 40m -run '^TestCluster$' ./integration
[ -s "$figures" ] && sed 's/^/    /' "$figures"
# containerd's own CRI integration tests against knext and upstream containerd, side by side: the
# two columns, every difference and every skip with its reason follow the suite's row.
run_suite cri-integration test/upstream/cri-integration-compare.sh
[ -s "$logs/cri-integration-compare.txt" ] && sed 's/^/    /' "$logs/cri-integration-compare.txt"

echo
echo "=== summary"
# A suite fails when its command failed, a test failed, gotestsum could not read its stream, or it
# ran no test: a suite that silently ran nothing must not read as green.
awk -F'\t' '
	BEGIN { printf "%-28s %7s %7s %7s %6s %6s  %s\n", "suite", "passed", "failed", "skipped", "flaky", "secs", "result" }
	{
		split($4, n, " ")
		total = n[1]; failed = n[2]; skipped = n[3]; errors = n[4]
		verdict = "ok"
		if ($4 == "") verdict = "FAILED: its output is not a test2json stream"
		else if (errors > 0) verdict = "FAILED: " errors " package errors (build error or crash)"
		else if (failed > 0 || $2 != 0) verdict = "FAILED (exit " $2 ")"
		else if (total == 0) verdict = "FAILED: ran no test"
		if (verdict != "ok") bad = 1
		# A package that failed without a test (a build error) counts as a failure, not a test.
		passed = total - failed - skipped; if (passed < 0) passed = 0
		printf "%-28s %7d %7d %7d %6d %6d  %s\n", $1, passed, failed, skipped, $5, $3, verdict
		passed_all += passed; failed_all += failed; skipped_all += skipped; flaky_all += $5
	}
	END { printf "total: %d passed, %d failed, %d skipped, %d flaky\n", passed_all, failed_all, skipped_all, flaky_all; exit bad }
' "$results"
status=$?
echo "suites: $(($(date +%s) - started)) s wall"
exit $status
