#!/usr/bin/env bash
# build.sh [-path] DIR [COMMAND...]: builds the Kubernetes commands (default: kubelet) that go.mod
# next to this script pins (k8s.io/kubernetes/cmd/<command>, each listed there as a tool) into
# DIR/<version>/<command>, each once per version, and prints their paths (contrib/build/gotools.sh).
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
	pairs+=("$command=k8s.io/kubernetes/cmd/$command")
done
exec "$here/../build/gotools.sh" "${args[@]}" -version-var k8s.io/component-base/version.gitVersion \
	"$here" k8s.io/kubernetes "$dir" "${pairs[@]}"
