#!/usr/bin/env bash
# build.sh [-path] DIR [COMMAND...]: builds the Kubernetes commands (default: kubelet) that go.mod
# next to this script pins (k8s.io/kubernetes/cmd/<command>, each listed there as a tool) into
# DIR/<version>/<command>, each once per version, and prints their paths (script/build/gotools.sh).
# Two more names build test programs at the same version: agnhost (test/images/agnhost, the
# end-to-end suite's workload) and e2e.test (the suite itself, ./e2e here, built with go test -c).
# On two cores, from an empty build cache, the kubelet takes about six minutes.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
args=()
[ "${1:-}" != -path ] || { args+=(-path); shift; }
[ $# -ge 1 ] || { echo "usage: $0 [-path] DIR [COMMAND...]" >&2; exit 2; }
dir=$1
shift
commands=("$@")
[ ${#commands[@]} -gt 0 ] || commands=(kubelet)
pairs=()
for command in "${commands[@]}"; do
	case $command in
	agnhost) pairs+=("$command=k8s.io/kubernetes/test/images/agnhost") ;;
	e2e.test) pairs+=("$command=github.com/knext-dev/knext/third_party/kubernetes/e2e") ;;
	*) pairs+=("$command=k8s.io/kubernetes/cmd/$command") ;;
	esac
done
exec "$here/../../script/build/gotools.sh" "${args[@]}" -version-var k8s.io/component-base/version.gitVersion \
	"$here" k8s.io/kubernetes "$dir" "${pairs[@]}"
