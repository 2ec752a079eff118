#!/usr/bin/env bash
# cni-plugins.sh OUT_DIR: the CNI plugins upstream's CI installs for containerd's CRI integration
# tests (script/setup/install-cni: the version of github.com/containernetworking/plugins that
# containerd's go.mod requires), built from the Go module proxy into OUT_DIR/<version>/ once per
# version. Prints that directory.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
[ $# -eq 1 ] || die "usage: $0 OUT_DIR"
module=github.com/containernetworking/plugins
version=$(GOWORK=off go -C "$(upstream_module_dir containerd)" list -m -f '{{.Version}}' "$module")
mkdir -p "$1"
out=$(cd "$1" && pwd)/$version
plugins=(bridge host-local loopback portmap)
if [ ! -x "$out/${plugins[-1]}" ]; then
	dir=$(GOWORK=off GOFLAGS=-mod=mod go mod download -json "$module@$version" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
	[ -n "$dir" ] || die "cannot download $module@$version from the Go module proxy"
	echo "building the CNI plugins $version from $dir" >&2
	mkdir -p "$out"
	for plugin in "${plugins[@]}"; do
		path=$(cd "$dir" && ls -d plugins/*/"$plugin")
		GOWORK=off GOFLAGS=-buildvcs=false CGO_ENABLED=0 go build -C "$dir" -trimpath -o "$out/$plugin" "./$path"
	done
fi
echo "$out"
