#!/usr/bin/env bash
# test.sh: every test suite of knext (`make test`). Each suite writes a `go test -json` stream;
# testsum counts it. Prints one row per suite and a total; exits non-zero if any suite failed or
# ran nothing. Logs: build/test-logs/<suite>.{json,log}.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
logs=$root/build/test-logs
results=$logs/results.jsonl
testsum=$root/build/bin/testsum
rm -rf "$logs" && mkdir -p "$logs"

# Packages of our own module that have tests and need no running stack.
own_packages() {
	go list -f '{{if or .TestGoFiles .XTestGoFiles}}{{.ImportPath}}{{end}}' ./... |
		grep -v '^github.com/knext-dev/knext/integration'
}

run_suite() { # run_suite NAME COMMAND...
	local name=$1 start rc
	shift
	start=$(date +%s)
	echo "=== suite $name: $*"
	"$@" >"$logs/$name.json" 2>"$logs/$name.log"
	rc=$?
	"$testsum" count -suite "$name" -results "$results" -exit "$rc" <"$logs/$name.json" 2>>"$logs/$name.log"
	tail -n 1 "$logs/$name.log"
	echo "    ($(($(date +%s) - start)) s; log: build/test-logs/$name.log)"
	if [ "$rc" != 0 ]; then
		echo "--- last lines of build/test-logs/$name.log:"
		tail -n 40 "$logs/$name.log" | sed 's/^/    /'
	fi
}

# golangci-lint on our own module (.golangci.yml, close to containerd's).
run_suite lint contrib/ci/golangci-lint.sh -json
run_suite knext-unit go test -race -json -timeout 30m $(own_packages)
run_suite nri-unit contrib/ci/upstream/nri-unit.sh
run_suite containerd-unit contrib/ci/upstream/containerd-unit.sh
# Every patch of both series on its own: build, Windows build (containerd), its packages' tests.
run_suite verify-series contrib/build/verify-series.sh -json
# A few seconds of coverage-guided fuzzing of the merge and validation of plugin answers.
run_suite nri-fuzz go test -json -run '^$' -fuzz '^FuzzMergePodSandboxStatus$' -fuzztime 5s \
	github.com/containerd/nri/pkg/adaptation
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
run_suite cri-integration-upstream contrib/ci/upstream/cri-integration-upstream.sh

echo
echo "=== summary"
"$testsum" report -results "$results"
