#!/usr/bin/env bash
# check-deps.sh: fail early, naming every missing tool and how to get it.
set -uo pipefail
missing=()
need() { # need PATH-or-command  hint
	if [[ $1 == /* ]]; then [ -e "$1" ] || missing+=("$1 ($2)"); else command -v "$1" >/dev/null || missing+=("$1 ($2)"); fi
}
deps="run: sudo script/ci/install-deps.sh"
need go "Go 1.26 at /usr/local/go"
need git "apt-get install git; $deps"
need /usr/local/bin/runc "runc built from the version containerd pins; $deps"
need /usr/local/bin/crictl "crictl from sigs.k8s.io/cri-tools; $deps"
need /usr/local/bin/gotestsum "gotestsum of script/ci/gotestsum.version; $deps"
need /usr/local/bin/golangci-lint "golangci-lint of script/ci/golangci-lint.version; $deps"
need /usr/lib/cni/bridge "apt-get install containernetworking-plugins; $deps"
need /usr/lib/cni/host-local "apt-get install containernetworking-plugins; $deps"
need /usr/lib/cni/portmap "apt-get install containernetworking-plugins; $deps"
need iptables "apt-get install iptables; $deps"
need nft "apt-get install nftables; $deps"
need nsenter "apt-get install util-linux; $deps"
need ipcmk "apt-get install util-linux; $deps"
need /usr/local/lib/knext/busybox "Debian's dynamically linked busybox, extracted from package busybox; $deps"
need /bin/busybox "apt-get install busybox-static; $deps"
need protoc "apt-get install protobuf-compiler; $deps"
need ip "apt-get install iproute2; $deps"
need unshare "apt-get install util-linux; $deps"
need findmnt "apt-get install util-linux; $deps"
need mount "apt-get install mount; $deps"
need tar "apt-get install tar; $deps"
need mmdebstrap "apt-get install mmdebstrap; $deps"
if [ "$(id -u)" != 0 ]; then missing+=("root (containers, netns and mounts need it)"); fi
if [ ${#missing[@]} -gt 0 ]; then
	echo "missing prerequisites:" >&2
	printf '  - %s\n' "${missing[@]}" >&2
	exit 1
fi
