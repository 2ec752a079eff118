#!/usr/bin/env bash
# postpatch-nri.sh TREE TOOLSDIR: regenerate NRI's protobuf code in TREE (the patched nri tree)
# the way NRI's `make build-proto` does, with the generator versions TREE's go.mod pins.
#
# The generators (protoc-gen-go, protoc-gen-go-ttrpc, protoc-gen-go-plugin and NRI's in-tree
# protoc-gen-strip/-owners) are built once with GOWORK=off and cached in TOOLSDIR under a key made
# of their versions and a hash of their in-tree sources, so a changed pin never reuses stale
# binaries, and a cached run needs neither the network nor the Go build.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)

tree=${1:?usage: postpatch-nri.sh TREE TOOLSDIR}
tools=${2:?usage: postpatch-nri.sh TREE TOOLSDIR}
tree=$(cd "$tree" && pwd)
mkdir -p "$tools"
tools=$(cd "$tools" && pwd)

die() { echo "postpatch-nri: $*" >&2; exit 1; }

# Debian 12's protoc; another protoc may generate different code (docs/developing.md).
want_protoc="libprotoc 3.21.12"
have_protoc=$(protoc --version 2>/dev/null) || die "protoc not found (apt-get install protobuf-compiler)"
[ "$have_protoc" = "$want_protoc" ] || die "need $want_protoc, found $have_protoc"

# pinned MODULE: the version TREE's go.mod requires (read from the file: no network, no go.sum).
pinned() {
	local v
	v=$(awk -v m="$1" '$1 == m && $2 ~ /^v/ { print $2; exit }' "$tree/go.mod")
	[ -n "$v" ] || die "$tree/go.mod does not pin $1"
	echo "$v"
}

generators=(
	google.golang.org/protobuf/cmd/protoc-gen-go
	github.com/containerd/ttrpc/cmd/protoc-gen-go-ttrpc
	github.com/knqyf263/go-plugin/cmd/protoc-gen-go-plugin
	./tools/protoc-gen-strip
	./tools/protoc-gen-owners
)
versions="protobuf-$(pinned google.golang.org/protobuf)_ttrpc-$(pinned github.com/containerd/ttrpc)_go-plugin-$(pinned github.com/knqyf263/go-plugin)"
# The in-tree generators and every indirect pin (go.sum) are part of the key too.
sources=$(cd "$tree" && cat go.sum tools/protoc-gen-strip/*.go tools/protoc-gen-owners/*.go | sha256sum | cut -c1-16)
bin="$tools/nri-protoc-gen/${versions}_$sources"

if [ ! -x "$bin/protoc-gen-owners" ]; then
	echo "postpatch-nri: building protobuf generators into $bin"
	staging=$(mktemp -d "$tools/.nri-protoc-gen.XXXXXX")
	trap 'rm -rf "$staging"' EXIT
	(cd "$tree" && GOWORK=off GOFLAGS=-buildvcs=false go build -trimpath -o "$staging/" "${generators[@]}") ||
		die "building the protobuf generators failed"
	mkdir -p "$(dirname "$bin")"
	# Publish atomically: a concurrent run either sees no cache or a complete one.
	mv -T "$staging" "$bin" 2>/dev/null || [ -x "$bin/protoc-gen-owners" ] ||
		die "cannot install the generators into $bin"
fi

cd "$tree"
mapfile -t protos < <(find pkg -name '*.proto' -not -path '*/vendor/*' | LC_ALL=C sort)
for proto in "${protos[@]}"; do
	protoc --proto_path=. -I . -I /usr/include \
		--plugin=protoc-gen-go="$bin/protoc-gen-go" \
		--go_opt=paths=source_relative --go_out=. \
		--plugin=protoc-gen-go-ttrpc="$bin/protoc-gen-go-ttrpc" \
		--go-ttrpc_opt=paths=source_relative --go-ttrpc_out=. \
		--plugin=protoc-gen-go-plugin="$bin/protoc-gen-go-plugin" \
		--go-plugin_opt=paths=source_relative,disable_pb_gen=true --go-plugin_out=. \
		--plugin=protoc-gen-strip="$bin/protoc-gen-strip" \
		--strip_out=pkg/api --strip_opt=file=strip.go \
		--plugin=protoc-gen-owners="$bin/protoc-gen-owners" \
		--owners_out=pkg/api --owners_opt=file=owners_generated.go \
		"$proto" || die "protoc failed on $proto"
done
# NRI's Makefile keeps the ttrpc bindings out of WASM plugins with this build tag.
sed -i '1s;^;//go:build !wasip1\n\n;' pkg/api/api_ttrpc.pb.go

# Hide the regenerated files from git status and `git commit -a` in the development tree, so that
# generated code never ends up in a commit, hence never in patches/nri.
if [ -d .git ]; then
	source "$here/lib.sh"
	git ls-files -z -- "${KNEXT_GENERATED_PATHS[@]}" |
		xargs -0 --no-run-if-empty git update-index --skip-worktree --
fi
