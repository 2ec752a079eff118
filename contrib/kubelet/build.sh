#!/usr/bin/env bash
# build.sh [-path] DIR: builds the kubelet that go.mod next to this script pins into
# DIR/<version>/kubelet, unless that file is already there (a cache by version: a new pin builds a
# new binary), and prints its path. With -path it only prints the path. Everything comes from the
# Go module proxy; the static build takes about six minutes on two cores.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
path_only=false
if [ "${1:-}" = -path ]; then
	path_only=true
	shift
fi
[ $# = 1 ] || { echo "usage: $0 [-path] DIR" >&2; exit 2; }
# The version as go.mod requires it; no module download just to name the binary.
version=$(awk '$1 == "k8s.io/kubernetes" && $2 ~ /^v/ { print $2 }' "$here/go.mod")
[ -n "$version" ] || { echo "$here/go.mod requires no k8s.io/kubernetes" >&2; exit 1; }
binary=$1/$version/kubelet
if ! $path_only && [ ! -x "$binary" ]; then
	mkdir -p "$(dirname "$binary")"
	echo "building kubelet $version into $binary (about 6 minutes on 2 cores)" >&2
	# The tools module is not part of knext's workspace; -mod=readonly keeps go.mod and go.sum as
	# committed.
	GOWORK=off GOFLAGS="-mod=readonly -buildvcs=false" CGO_ENABLED=0 go build -C "$here" -trimpath \
		-ldflags "-s -w -X k8s.io/component-base/version.gitVersion=$version" \
		-o "$binary.tmp" k8s.io/kubernetes/cmd/kubelet
	mv "$binary.tmp" "$binary"
fi
echo "$binary"
