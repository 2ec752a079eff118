#!/usr/bin/env bash
# golangci-lint.sh [-json]: golangci-lint (.golangci.yml) on every package of knext's own module,
# in the workspace of the patched trees (build/go.work). Output is `go test -v` style, one test
# named golangci-lint; with -json it is test2json, for make test. Exits non-zero on any finding.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)

if [ "${1:-}" = -json ]; then
	shift
	"$0" "$@" | go tool test2json -t -p knext/lint
	exit "${PIPESTATUS[0]}"
fi

cd "$root"
export GOWORK=${GOWORK:-$root/build/go.work} GOFLAGS=${GOFLAGS:--buildvcs=false}
lint=${GOLANGCI_LINT:-/usr/local/bin/golangci-lint}
want=$(tr -d '[:space:]' <script/ci/golangci-lint.version)
# The version the configuration was written for: another one may enable or change checks.
have=$(go version -m "$lint" 2>/dev/null | awk '$1 == "mod" && $2 == "github.com/golangci/golangci-lint/v2" { print $3 }')
[ "$have" = "$want" ] || {
	echo "golangci-lint.sh: $lint is ${have:-missing}, want $want: run script/ci/install-deps.sh" >&2
	exit 1
}

start=$(date +%s)
echo "=== RUN   golangci-lint"
status=0
"$lint" run --timeout 20m ./... 2>&1 || status=$?
if [ "$status" = 0 ]; then
	echo "--- PASS: golangci-lint ($(($(date +%s) - start)).00s)"
	echo "PASS"
else
	echo "--- FAIL: golangci-lint ($(($(date +%s) - start)).00s)"
	echo "FAIL"
fi
exit "$status"
