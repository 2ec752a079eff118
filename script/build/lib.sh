# Shared helpers for the patch-queue build. Sourced, never run.
# The upstream modules knext patches: <tree name>=<module path>. Versions come from go.mod only.
# Tests of these scripts may narrow it to one module through the environment.
KNEXT_MODULES=${KNEXT_MODULES:-"containerd=github.com/containerd/containerd/v2 nri=github.com/containerd/nri"}
KNEXT_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)

# A fresh machine has no git identity; every commit we make names this one explicitly.
export GIT_AUTHOR_NAME="knext build" GIT_AUTHOR_EMAIL="build@knext.invalid"
export GIT_COMMITTER_NAME="knext build" GIT_COMMITTER_EMAIL="build@knext.invalid"
export GIT_CONFIG_NOSYSTEM=1 GIT_CONFIG_GLOBAL=/dev/null

die() { echo "$*" >&2; exit 1; }

# module_path NAME -> the Go module path of tree NAME.
module_path() {
	local entry
	for entry in $KNEXT_MODULES; do
		[ "${entry%%=*}" = "$1" ] && { echo "${entry#*=}"; return; }
	done
	die "unknown upstream tree '$1'"
}

module_names() {
	local entry
	for entry in $KNEXT_MODULES; do echo "${entry%%=*}"; done
}

# pinned_version NAME -> the version go.mod requires for tree NAME.
pinned_version() {
	local mod
	mod=$(module_path "$1")
	(cd "$KNEXT_ROOT" && GOWORK=off GOFLAGS=-mod=mod go list -m -f '{{.Version}}' "$mod") ||
		die "cannot read the pinned version of $mod from go.mod"
}

upstream_tag() { echo "upstream-$(pinned_version "$1")"; }

# export_series TREE NAME OUTDIR: write TREE's commits after its upstream tag as a stable patch series.
export_series() {
	local tree=$1 name=$2 out=$3
	rm -rf "$out" && mkdir -p "$out" && out=$(cd "$out" && pwd) # git -C would resolve it in tree
	git -C "$tree" format-patch --quiet --no-signature --zero-commit --full-index \
		-o "$out" "$(upstream_tag "$name")..HEAD" >/dev/null ||
		die "cannot export the patch series of $tree"
}

# Files that make src regenerates after applying the series: never part of a patch, and not
# "work" that make src could lose.
KNEXT_GENERATED_PATHS=('*.pb.go' 'pkg/api/strip.go' 'pkg/api/owners_generated.go')
KNEXT_GENERATED_PATHSPEC=("${KNEXT_GENERATED_PATHS[@]/#/:(exclude)}")

# Generated protobuf code names the protoc that wrote it in one header line (`// protoc v3.x`).
# Protoc releases that generate identical code differ only there (verify-proto.sh checks ours).
# set_protoc_header VERSION FILE...: write VERSION (e.g. v3.20.1) into that line of each FILE,
# keeping what follows the version number (protoc-gen-strip writes "v3.20.1-").
set_protoc_header() {
	local version=$1
	shift
	sed -i "s;^\(//[[:space:]]*protoc[[:space:]]\+\)v[0-9][0-9.]*\([^[:space:]]*\)\$;\1$version\2;" "$@"
}

# failure_excerpt LOG: what a failed check's log says of the failure, indented under a bar so
# that test2json reads it as output, not as test events: go test's failure reports when there
# are any, then the log's last lines.
failure_excerpt() {
	grep -E -A 12 '^[[:space:]]*--- FAIL: ' "$1" | grep -v -E '^[[:space:]]*time="' | head -n 50 | sed 's/^/    | /' || true
	tail -n 20 "$1" | sed 's/^/    | /'
}

# same_series A B: whether the patch series in directories A and B are identical (a missing
# directory is an empty series). Prints a unified diff when they are not.
same_series() {
	diff -r -u -N -x '.*' "$1" "$2" 2>/dev/null && return
	[ -d "$1" ] || [ -d "$2" ] || return 0
	[ -d "$1" ] && [ -d "$2" ] && return 1
	# One side is missing: equal only when the other holds no patch.
	[ -z "$(find "$1" "$2" -name '*.patch' 2>/dev/null)" ]
}
