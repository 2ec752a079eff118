#!/usr/bin/env bash
# gotools.sh [-path] [-version-var VAR] MODULE_DIR PINNED_MODULE OUT_DIR NAME=PACKAGE...
#
# Builds main packages of the tools module MODULE_DIR (a module of ours that pins in its go.mod
# programs whose own go.mod cannot be `go install`ed) into OUT_DIR/<version>/NAME, where <version>
# is the version MODULE_DIR/go.mod requires of PINNED_MODULE: a cache by version, each binary
# built only while it is not there. Prints the binaries' paths, one a line; with -path it only
# prints them. -version-var VAR stamps <version> into the string variable VAR (-ldflags -X).
# A NAME ending in .test is a test binary: `go test -c` of PACKAGE.
# Static (CGO_ENABLED=0); everything comes from the Go module proxy.
set -euo pipefail
path_only=false version_var=
while [ $# -gt 0 ]; do
	case $1 in
	-path) path_only=true; shift ;;
	-version-var) version_var=$2; shift 2 ;;
	*) break ;;
	esac
done
[ $# -ge 4 ] || { echo "usage: $0 [-path] [-version-var VAR] MODULE_DIR PINNED_MODULE OUT_DIR NAME=PACKAGE..." >&2; exit 2; }
module_dir=$(cd "$1" && pwd) pinned=$2 out_dir=$3
shift 3
# The version as go.mod requires it (in a require block or on a require line); no module
# download just to name the binaries.
version=$(awk -v m="$pinned" '{ sub(/^require[[:space:]]+/, "") } $1 == m && $2 ~ /^v/ { print $2; exit }' "$module_dir/go.mod")
[ -n "$version" ] || { echo "$module_dir/go.mod requires no $pinned" >&2; exit 1; }
mkdir -p "$out_dir"
out=$(cd "$out_dir" && pwd)/$version
for pair in "$@"; do
	name=${pair%%=*} package=${pair#*=}
	if ! $path_only && [ ! -x "$out/$name" ]; then
		mkdir -p "$out"
		echo "building $name ($pinned $version) into $out" >&2
		ldflags="-s -w"
		[ -z "$version_var" ] || ldflags+=" -X $version_var=$version"
		# The tools module is not part of knext's workspace; -mod=readonly keeps its go.mod and
		# go.sum as committed.
		command=(build -C "$module_dir")
		[[ $name != *.test ]] || command=(test -C "$module_dir" -c)
		GOWORK=off GOFLAGS="-mod=readonly -buildvcs=false" CGO_ENABLED=0 go "${command[@]}" -trimpath \
			-ldflags "$ldflags" -o "$out/.$name.tmp" "$package"
		mv "$out/.$name.tmp" "$out/$name"
	fi
	echo "$out/$name"
done
