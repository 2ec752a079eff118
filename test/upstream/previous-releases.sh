#!/usr/bin/env bash
# previous-releases.sh OUT_DIR: builds each containerd release of ./previous-releases from the Go
# module proxy, as the release tarball upstream's upgrade tests download
# (OUT_DIR/containerd-<version without v>-linux-<arch>.tar.gz: bin/containerd,
# bin/containerd-shim-runc-v2 and, for 1.x, bin/containerd-shim-runc-v1). A tarball that exists is
# not built again: a release never changes. Prints the tarballs' paths, one a line, and writes
# OUT_DIR/sandbox-images: each release's default sandbox image (kept per release beside its
# tarball, as <tarball without .tar.gz>.sandbox-image), which a containerd the tests start with a
# config of their own pulls.
#
# bin/containerd is a wrapper (named containerd, so that pkill and pidof see it as the tests
# expect) that runs the release's daemon, bin/real/containerd, with a copy of the test's config
# plus restrict_oom_score_adj: without CAP_SYS_RESOURCE, as on knext's machines, runc cannot give
# the pause container the daemon's default oom_score_adj. Config version 2 (1.x and 2.0) replaces a
# whole plugin table with an imported one, so the wrapper appends instead of importing.
set -euo pipefail
source "$(dirname "$0")/../../script/build/lib.sh"
[ $# -eq 1 ] || die "usage: $0 OUT_DIR"
mkdir -p "$1"
out=$(cd "$1" && pwd)
arch=$(go env GOARCH)

wrapper() {
	cat <<'SH'
#!/bin/sh
# Runs the release's containerd with the caller's config plus restrict_oom_score_adj (see
# knext's test/upstream/previous-releases.sh).
set -eu
real=$(dirname "$0")/real/containerd
config= i=0 n=$#
while [ $i -lt $n ]; do
	arg=$1 && shift && i=$((i + 1))
	case $arg in
	--config | -c) config=$1 && shift && i=$((i + 1)) ;;
	--config=*) config=${arg#*=} ;;
	*) set -- "$@" "$arg" ;;
	esac
done
[ -n "$config" ] || exec "$real" "$@"
wrapped=$(mktemp "${TMPDIR:-/tmp}/previous-release-config.XXXXXX")
cat "$config" >"$wrapped"
printf '\n[plugins."io.containerd.grpc.v1.cri"]\n  restrict_oom_score_adj = true\n' >>"$wrapped"
exec "$real" --config "$wrapped" "$@"
SH
}

# Several suites may run this at once: each works in a scratch directory of its own and moves
# what it made into place.
scratch=$(mktemp -d "$out/.scratch.XXXXXX")
trap 'rm -rf "$scratch"' EXIT
: >"$scratch/sandbox-images"
for version in $(grep -v '^#' "$KNEXT_ROOT/test/upstream/previous-releases"); do
	tarball=$out/containerd-${version#v}-linux-$arch.tar.gz
	if [ ! -f "$tarball" ]; then
		module=github.com/containerd/containerd
		shims=(containerd-shim-runc-v2 containerd-shim-runc-v1)
		if [[ $version != v1.* ]]; then
			module=$module/${version%%.*}
			shims=(containerd-shim-runc-v2)
		fi
		dir=$(GOWORK=off GOFLAGS=-mod=mod go mod download -json "$module@$version" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
		[ -n "$dir" ] || die "cannot download $module@$version from the Go module proxy"
		echo "building containerd $version from $dir" >&2
		stage=$scratch/stage
		ldflags="-s -w -X $module/version.Version=$version -X $module/version.Package=github.com/containerd/containerd"
		# As upstream's release builds: no man pages in the daemon, shims static and without gRPC;
		# no btrfs (its headers are not installed, and no test uses it). Some releases' module
		# source carries a vendor directory: the module cache has what it vendors.
		export GOWORK=off GOFLAGS="-buildvcs=false -mod=mod"
		go build -C "$dir" -trimpath -tags "urfave_cli_no_docs no_btrfs" \
			-ldflags "$ldflags" -o "$stage/bin/real/containerd" ./cmd/containerd
		for shim in "${shims[@]}"; do
			CGO_ENABLED=0 go build -C "$dir" -trimpath -tags "urfave_cli_no_docs no_grpc no_btrfs" \
				-ldflags "$ldflags" -o "$stage/bin/$shim" "./cmd/$shim"
		done
		wrapper >"$stage/bin/containerd"
		chmod 755 "$stage/bin/containerd"
		tar -C "$stage" -czf "$scratch/tarball" --owner=0 --group=0 bin
		mv "$scratch/tarball" "$tarball"
		rm -rf "$stage"
	fi
	# The release's default sandbox image, read once from its daemon (a release never changes).
	# 1.x: sandbox_image = "..."; 2.x: sandbox = '...' (pinned_images).
	sandbox_image=${tarball%.tar.gz}.sandbox-image
	if [ ! -f "$sandbox_image" ]; then
		tar -xzOf "$tarball" bin/real/containerd >"$scratch/containerd"
		chmod 755 "$scratch/containerd"
		"$scratch/containerd" config default |
			sed -n "s/^ *sandbox\(_image\)\? = [\"']\([^\"']*\)[\"']\$/\2/p" >"$scratch/sandbox-image"
		# Kept for good, so never kept empty: a release whose default config names its sandbox
		# image another way needs the pattern above taught, not a test that pulls nothing.
		[ -s "$scratch/sandbox-image" ] || die "no sandbox image in the default config of containerd $version"
		mv "$scratch/sandbox-image" "$sandbox_image"
		rm -f "$scratch/containerd"
	fi
	cat "$sandbox_image" >>"$scratch/sandbox-images"
	echo "$tarball"
done
sort -u "$scratch/sandbox-images" >"$scratch/sandbox-images.sorted"
mv "$scratch/sandbox-images.sorted" "$out/sandbox-images"
