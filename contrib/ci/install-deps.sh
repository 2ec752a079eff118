#!/usr/bin/env bash
# Installs everything `make demo`, `make test` and `make bench` need on Debian 12, as root.
# Idempotent: a second run changes nothing. Versions of Go tools come from the pinned upstream
# (runc) or are fixed here (crictl), never "latest".
set -euo pipefail
source "$(dirname "$0")/../build/lib.sh"

CRICTL_VERSION=v1.37.0
export PATH=/usr/local/go/bin:$PATH GOBIN=/usr/local/bin

apt_packages=(
	containernetworking-plugins # bridge, host-local, loopback for the CNI-backed tests
	iproute2                    # ip netns / link in tests and the demo
	busybox-static              # the busybox test image
	protobuf-compiler           # protoc, to regenerate NRI's protobuf code
	libseccomp-dev pkg-config   # runc with seccomp
	util-linux mount            # unshare, findmnt, mount: upstream's integration tests, the kubelet suite
	strace procps               # upstream's TestIssue7496 delays with strace; restart tests use pkill
	iptables git make gcc
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
if ! go version -m /usr/local/bin/crictl 2>/dev/null | grep -q "sigs.k8s.io/cri-tools[[:space:]]*$CRICTL_VERSION"; then
	go install "sigs.k8s.io/cri-tools/cmd/crictl@$CRICTL_VERSION"
fi

echo "dependencies installed: runc $runc_version, crictl $CRICTL_VERSION, apt: ${apt_packages[*]}"
