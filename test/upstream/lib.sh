# shellcheck shell=bash
# Shared setup of the upstream regression suites. Sourced, never run.
# Each suite writes the `go test -json` event stream of its tests to stdout and exits non-zero
# when a test failed or the suite could not run. Its stderr is for errors only: make test reads it
# through gotestsum, which counts every line there as a package error; progress goes to a log.
#
# The suites test the materialized trees of the workspace $GOWORK (default: build/go.work of this
# repository), so they always test exactly what `make build` compiles.
source "$(dirname "${BASH_SOURCE[0]}")/../../script/build/lib.sh"

export PATH=/usr/local/go/bin:$PATH
export GOWORK=${GOWORK:-$KNEXT_ROOT/build/go.work}
export GOFLAGS=${GOFLAGS:--buildvcs=false}
BUILD_DIR=$(dirname "$GOWORK")
[ -f "$GOWORK" ] || die "no workspace $GOWORK: run 'make src' first"

# tree_dir NAME -> the materialized source tree of upstream module NAME.
tree_dir() {
	local dir="$BUILD_DIR/src/$1"
	[ -d "$dir" ] || die "no tree $dir: run 'make src' first"
	echo "$dir"
}

require_root() {
	[ "$(id -u)" -eq 0 ] || die "$1 must run as root: $2"
}

# upstream_module_dir NAME -> the pristine source of upstream module NAME at its pinned version,
# in the Go module cache (read-only).
upstream_module_dir() {
	local dir
	dir=$(cd "$KNEXT_ROOT" && GOWORK=off GOFLAGS=-mod=mod go mod download -json "$(module_path "$1")@$(pinned_version "$1")" |
		sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
	[ -n "$dir" ] || die "cannot download $(module_path "$1")@$(pinned_version "$1") from the Go module proxy"
	echo "$dir"
}
