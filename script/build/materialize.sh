#!/usr/bin/env bash
# materialize.sh OUTDIR: build OUTDIR/src/<tree> for every pinned upstream module (one
# deterministic upstream commit, tagged upstream-<version>, then patches/<tree>/*.patch applied
# with git am) and OUTDIR/go.work using this repository and those trees.
# KNEXT_TOOLS_DIR overrides where code generators are cached (default OUTDIR/tools).
set -euo pipefail
source "$(dirname "$0")/lib.sh"

out=${1:?usage: materialize.sh OUTDIR}
mkdir -p "$out/src"
out=$(cd "$out" && pwd)

materialize_tree() {
	local name=$1 mod ver dir tree patch
	mod=$(module_path "$name")
	ver=$(pinned_version "$name")
	dir=$(cd "$KNEXT_ROOT" && GOWORK=off GOFLAGS=-mod=mod go mod download -json "$mod@$ver" |
		sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
	[ -d "$dir" ] || die "go mod download $mod@$ver gave no source directory"
	tree="$out/src/$name"
	rm -rf "$tree"
	cp -r "$dir" "$tree"
	chmod -R u+w "$tree"
	(
		cd "$tree"
		git init --quiet --initial-branch=main
		git add --force --all
		GIT_AUTHOR_DATE="2000-01-01T00:00:00Z" GIT_COMMITTER_DATE="2000-01-01T00:00:00Z" \
			git commit --quiet --no-verify -m "$mod $ver (pristine module source)"
		git tag "upstream-$ver"
	)
	shopt -s nullglob
	for patch in "$KNEXT_ROOT/patches/$name"/*.patch; do
		if ! msg=$(git -C "$tree" am --quiet --committer-date-is-author-date "$patch" 2>&1); then
			git -C "$tree" am --abort >/dev/null 2>&1 || true
			die "patch $(basename "$patch") does not apply to $mod $ver:
$msg"
		fi
	done
	shopt -u nullglob
	# Remembered so that make src can tell local commits from an outdated series.
	git -C "$tree" rev-parse HEAD >"$tree/.git/knext-applied-head"
	# A tree whose patches touch inputs of generated code regenerates it here (never in a patch).
	if [ -x "$KNEXT_ROOT/script/build/postpatch-$name.sh" ]; then
		"$KNEXT_ROOT/script/build/postpatch-$name.sh" "$tree" "${KNEXT_TOOLS_DIR:-$out/tools}" ||
			die "regenerating code in $tree failed"
	fi
	echo "materialized $name: $mod $ver + $(git -C "$tree" rev-list --count "upstream-$ver..HEAD") patch(es)"
}

for name in $(module_names); do
	materialize_tree "$name"
done

gover=$(sed -n 's/^go //p' "$KNEXT_ROOT/go.mod")
{
	echo "go $gover"
	echo
	echo "use ("
	echo "	$KNEXT_ROOT"
	for name in $(module_names); do echo "	./src/$name"; done
	echo ")"
} >"$out/go.work"
