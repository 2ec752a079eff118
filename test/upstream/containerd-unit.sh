#!/usr/bin/env bash
# containerd-unit.sh: containerd's unit tests of the code knext patches (the CRI server, the NRI
# adaptation and the CRI NRI API, the sandbox store, network namespaces, the shim runtime and the
# runc shim) on the patched tree, with the race detector. Prints the `go test -json` event stream.
#
# Packages whose tests call testutil.RequiresRoot skip those tests unless given -test.root, a
# flag only they define (upstream runs them as `sudo make root-test`). This suite runs them as
# root, inside a private mount namespace so that a mount a failing test leaves behind dies with it.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
require_root containerd-unit.sh "tests that mount and create namespaces would be skipped otherwise"

cd "$(tree_dir containerd)"
packages=(./internal/cri/server/... ./internal/nri/... ./internal/cri/nri/... ./core/metadata/... ./pkg/netns/...
	./core/runtime/v2/... ./cmd/containerd-shim-runc-v2/...)
testutil=github.com/containerd/containerd/v2/pkg/testutil
root_packages=() plain_packages=()
while read -r pkg imports; do
	if [[ " $imports " == *" $testutil "* ]]; then
		root_packages+=("$pkg")
	else
		plain_packages+=("$pkg")
	fi
done < <(go list -f '{{.ImportPath}} {{join .TestImports " "}} {{join .XTestImports " "}}' "${packages[@]}")
[ ${#root_packages[@]} -gt 0 ] || die "no package imports $testutil any more: re-check which tests need -test.root"

status=0
unshare --mount --propagation private go test -json -race -count=1 -p 2 "${plain_packages[@]}" || status=$?
unshare --mount --propagation private go test -json -race -count=1 -p 2 "${root_packages[@]}" -args -test.root || status=$?
exit $status
