#!/usr/bin/env bash
# Installs everything `make demo`, `make test`, `make cluster`, `make bench`, `make conformance` and
# `make k8s-conformance` need on Debian 12, as root.
# Idempotent: a second run changes nothing. Versions of Go tools come from the pinned upstream
# (runc) or are fixed in this repository (cri-tools: script/ci/cri-tools.version, which
# `make conformance` builds critest from; golangci-lint: script/ci/golangci-lint.version;
# gotestsum: script/ci/gotestsum.version),
# never "latest".
set -euo pipefail
source "$(dirname "$0")/../build/lib.sh"

CRI_TOOLS_VERSION=$(tr -d '[:space:]' <"$KNEXT_ROOT/script/ci/cri-tools.version")
GOLANGCI_LINT_VERSION=$(tr -d '[:space:]' <"$KNEXT_ROOT/script/ci/golangci-lint.version")
GOTESTSUM_VERSION=$(tr -d '[:space:]' <"$KNEXT_ROOT/script/ci/gotestsum.version")
# Debian's dynamically linked busybox, the base of the images `make conformance` rebuilds.
BUSYBOX_DYNAMIC=/usr/local/lib/knext/busybox
export PATH=/usr/local/go/bin:$PATH GOBIN=/usr/local/bin

apt_packages=(
	containernetworking-plugins # bridge, host-local, loopback for the CNI-backed tests
	iproute2                    # ip netns / link in tests and the demo
	busybox-static              # the busybox test image
	protobuf-compiler           # protoc, to regenerate NRI's protobuf code
	libseccomp-dev pkg-config   # runc with seccomp
	util-linux mount            # unshare, findmnt, mount, ipcmk: upstream's integration tests, the kubelet suite, critest
	strace procps               # upstream's TestIssue7496 delays with strace; restart tests use pkill
	iptables                    # CNI portmap (hostPort) in make conformance
	nftables                    # nft: kube-proxy's nftables mode in make cluster and the cluster-e2e suite, kube-proxy-like rules in nri-bridge's Service tests
	lsof erofs-utils            # containerd's CRI integration tests: shim ptys (lsof), the erofs snapshotter (mkfs.erofs)
	mmdebstrap                  # the Debian root file system of the images make k8s-conformance rebuilds
	git make gcc
)
missing=()
for pkg in "${apt_packages[@]}"; do
	dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# runc at the version the pinned containerd tests against (Debian's 1.1.5 fails its tests).
containerd_dir=$(cd "$KNEXT_ROOT" && GOWORK=off GOFLAGS=-mod=mod go mod download -json \
	"$(module_path containerd)@$(pinned_version containerd)" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
runc_version=$(tr -d '[:space:]' <"$containerd_dir/script/setup/runc-version")
if ! /usr/local/bin/runc --version 2>/dev/null | grep -q "^runc version ${runc_version#v}$"; then
	GOFLAGS=-buildvcs=false go install -tags seccomp "github.com/opencontainers/runc@$runc_version"
fi

# go install stamps no version into crictl; the module version is in its build info.
if ! go version -m /usr/local/bin/crictl 2>/dev/null | grep -q "sigs.k8s.io/cri-tools[[:space:]]*$CRI_TOOLS_VERSION"; then
	go install "sigs.k8s.io/cri-tools/cmd/crictl@$CRI_TOOLS_VERSION"
fi

# golangci-lint (the lint suite of make test), built once per version: its build info names the
# module version, as crictl's does.
if ! go version -m /usr/local/bin/golangci-lint 2>/dev/null |
	grep -q "github.com/golangci/golangci-lint/v2[[:space:]]*$GOLANGCI_LINT_VERSION[[:space:]]"; then
	GOFLAGS=-buildvcs=false go install "github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$GOLANGCI_LINT_VERSION"
fi

# gotestsum (make test reads every suite's test2json stream with it), likewise.
if ! go version -m /usr/local/bin/gotestsum 2>/dev/null | grep -q "gotest.tools/gotestsum[[:space:]]*$GOTESTSUM_VERSION[[:space:]]"; then
	GOFLAGS=-buildvcs=false go install "gotest.tools/gotestsum@$GOTESTSUM_VERSION"
fi

# Package busybox conflicts with busybox-static (the knext test image), so only its binary is
# extracted from the package. It needs the host's libc6, which the images copy next to it.
if [ ! -x "$BUSYBOX_DYNAMIC" ]; then
	tmp=$(mktemp -d)
	download() { (cd "$tmp" && apt-get download -qq -o APT::Sandbox::User=root busybox); }
	download || { apt-get update -qq && download; }
	dpkg-deb -x "$tmp"/busybox_*.deb "$tmp/root"
	install -D -m 755 "$tmp/root/bin/busybox" "$BUSYBOX_DYNAMIC"
	rm -rf "$tmp"
fi

echo "dependencies installed: runc $runc_version, crictl $CRI_TOOLS_VERSION, golangci-lint $GOLANGCI_LINT_VERSION, gotestsum $GOTESTSUM_VERSION, $BUSYBOX_DYNAMIC, apt: ${apt_packages[*]}"
