#!/usr/bin/env bash
# upstream-branches.sh: write every patch series as it would be pushed upstream. For each module,
# OUT/<module> (KNEXT_UPSTREAM_BRANCHES_DIR, default build/upstream-branches) is a git repository
# whose branch `series` replays patches/<module> on the pristine upstream commit (tag
# `upstream-base`), and OUT/<module>.bundle holds that branch and its base.
#
# Unlike patches/, which never carry generated code (make src regenerates it), every commit here
# that changes generated code's inputs also commits the regenerated code: after each patch the
# module's postpatch script (postpatch-nri.sh) runs and the generated files it changed are added
# to that commit. Their `// protoc vX` header keeps the version upstream's committed files name
# (our protoc writes identical code otherwise; verify-proto.sh checks that on upstream's proto).
# Author and committer are the patch's author, with its date; messages are the patches' own.
#
# The base is the module's source from the Go module cache, which lacks the module's nested
# modules (NRI's plugins/*). KNEXT_UPSTREAM_GIT_<MODULE>=PATH@REV (e.g.
# KNEXT_UPSTREAM_GIT_NRI=/src/nri@v0.12.3) bases that module on commit REV of an upstream
# clone instead, after checking that REV's tree equals the module's source outside its nested
# modules; its bundle then needs REV on the receiving side, as a pull request does.
#
# The changes a patch needs in those nested modules (NRI's in-repo plugins implementing the
# API) cannot be in patches/<module>, which applies to the module source: they are in
# patches/<module>-repo/NNNN-*.patch, and with an upstream clone as the base they are folded into
# the commit of patches/<module>/NNNN-*.patch.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/lib.sh"

out=${KNEXT_UPSTREAM_BRANCHES_DIR:-$KNEXT_ROOT/build/upstream-branches}
tools=${KNEXT_TOOLS_DIR:-$KNEXT_ROOT/build/tools}
mkdir -p "$out"
out=$(cd "$out" && pwd)
rm -rf "$out/materialized"
KNEXT_TOOLS_DIR=$tools "$here/materialize.sh" "$out/materialized" >/dev/null

# upstream_protoc_version REPO REV: the protoc version REV's committed generated code names.
upstream_protoc_version() {
	local versions
	versions=$(git -C "$1" grep -h -E '^//[[:space:]]*protoc[[:space:]]+v[0-9][^[:space:]]*$' "$2" -- '*.pb.go' |
		sed 's/.*[[:space:]]\(v[0-9][0-9.]*\).*/\1/' | sort -u)
	[ "$(wc -w <<<"$versions")" = 1 ] || die "upstream-branches: $2's generated code names protoc versions '$versions', want one"
	echo "$versions"
}

# git_base NAME REPO: fetch the upstream commit KNEXT_UPSTREAM_GIT_<NAME> names into REPO, check
# it against the module source, and print its hash.
git_base() {
	local name=$1 repo=$2 var spec path rev commit excludes=() dir differing
	var=KNEXT_UPSTREAM_GIT_$(tr '[:lower:]-' '[:upper:]_' <<<"$name")
	spec=${!var}
	path=${spec%@*}
	rev=${spec##*@}
	[ "$path" != "$spec" ] && [ -n "$rev" ] || die "upstream-branches: $var=$spec, want PATH@REV"
	commit=$(git -C "$path" rev-parse --verify --quiet "$rev^{commit}") ||
		die "upstream-branches: $path has no commit $rev ($var)"
	git -C "$repo" fetch -q --no-tags "$(cd "$path" && pwd)" "$commit" ||
		die "upstream-branches: cannot fetch $rev from $path ($var)"
	# The module source leaves out nested modules (directories with their own go.mod).
	for dir in $(git -C "$repo" ls-tree -r --name-only "$commit" | sed -n 's;/go\.mod$;;p'); do
		excludes+=(":(exclude)$dir")
	done
	# Nor does it keep file modes: only contents count.
	differing=$(git -C "$repo" diff --raw --no-abbrev "$(upstream_tag "$name")" "$commit" -- . "${excludes[@]}" |
		awk '$3 != $4 { print $NF }')
	[ -z "$differing" ] ||
		die "upstream-branches: $rev of $path differs from $(module_path "$name") $(pinned_version "$name") outside its nested modules: $differing"
	echo "$commit"
}

# executable_base REPO TAG: TAG's tree with the executable bit back on the files that start with
# "#!" (the module source drops file modes; NRI's `go generate` runs such a script), committed
# on TAG as the base.
executable_base() {
	local repo=$1 tag=$2
	(
		cd "$repo"
		git checkout -q -f "$tag"
		git ls-files -z | xargs -0 awk 'FNR == 1 && /^#!/ { print FILENAME } { nextfile }' |
			xargs -r -d '\n' chmod +x --
		git add --all
		GIT_AUTHOR_DATE="2000-01-01T00:00:00Z" GIT_COMMITTER_DATE="2000-01-01T00:00:00Z" \
			git commit --quiet --no-verify --allow-empty -m "Restore the executable bit of scripts (the module source drops file modes)"
		git rev-parse HEAD
	)
}

write_branch() {
	local name=$1 repo=$out/$1 base patch protoc_version files subject var generated=0 signed=0 count=0
	local -a patches=("$KNEXT_ROOT/patches/$name"/*.patch)
	[ -e "${patches[0]}" ] || patches=()
	rm -rf "$repo" "$out/$name.bundle"
	mv "$out/materialized/src/$name" "$repo"
	git -C "$repo" ls-files -v | sed -n 's/^S //p' | (cd "$repo" && xargs -r git update-index --no-skip-worktree --)
	var=KNEXT_UPSTREAM_GIT_$(tr '[:lower:]-' '[:upper:]_' <<<"$name")
	if [ -n "${!var:-}" ]; then
		base=$(git_base "$name" "$repo")
	else
		base=$(executable_base "$repo" "$(upstream_tag "$name")")
	fi
	git -C "$repo" checkout -q -f -B series "$base"
	git -C "$repo" clean -q -f -d -x
	git -C "$repo" branch -q -D main
	git -C "$repo" tag -f upstream-base "$base" >/dev/null
	local postpatch=$here/postpatch-$name.sh
	[ -x "$postpatch" ] && protoc_version=$(upstream_protoc_version "$repo" "$base")

	for patch in "${patches[@]}"; do
		if ! msg=$(git -C "$repo" am --quiet --committer-date-is-author-date "$patch" 2>&1); then
			git -C "$repo" am --abort >/dev/null 2>&1 || true
			die "upstream-branches: patch $(basename "$patch") does not apply to $name's base $base:
$msg"
		fi
		count=$((count + 1))
		for nested in "$KNEXT_ROOT/patches/$name-repo/$(basename "$patch" | cut -c1-4)"-*.patch; do
			[ -e "$nested" ] || continue
			if [ -z "${!var:-}" ]; then
				echo "  $name: $(basename "$nested") left out: the base has no nested modules (set $var)"
				continue
			fi
			git -C "$repo" apply --index "$nested" ||
				die "upstream-branches: $(basename "$nested") does not apply after $(basename "$patch")"
			git -C "$repo" commit --quiet --amend --no-edit --no-verify
		done
		files=
		if [ -x "$postpatch" ]; then
			"$postpatch" "$repo" "$tools" >/dev/null || die "upstream-branches: regenerating code after $(basename "$patch") failed"
			(
				cd "$repo"
				git ls-files -v | sed -n 's/^S //p' | xargs -r git update-index --no-skip-worktree --
				mapfile -t regenerated < <(git ls-files --cached --others --exclude-standard -- "${KNEXT_GENERATED_PATHS[@]}")
				[ ${#regenerated[@]} -eq 0 ] || set_protoc_header "$protoc_version" "${regenerated[@]}"
				git add --all -- "${KNEXT_GENERATED_PATHS[@]}"
			)
			files=$(git -C "$repo" diff --cached --name-only | paste -sd' ' -)
			[ -z "$(git -C "$repo" status --porcelain)" ] || [ -n "$files" ] ||
				die "upstream-branches: regenerating code after $(basename "$patch") changed files that are not generated code: $(git -C "$repo" status --porcelain)"
		fi
		# The patch's author commits it too, on its date: the branch is the patch author's.
		(
			cd "$repo"
			export GIT_COMMITTER_NAME GIT_COMMITTER_EMAIL GIT_COMMITTER_DATE
			GIT_COMMITTER_NAME=$(git log -1 --format=%an)
			GIT_COMMITTER_EMAIL=$(git log -1 --format=%ae)
			GIT_COMMITTER_DATE=$(git log -1 --format=%aD)
			git commit --quiet --amend --no-edit --no-verify
		)
		[ -z "$(git -C "$repo" status --porcelain)" ] ||
			die "upstream-branches: $name is not clean after $(basename "$patch"): $(git -C "$repo" status --porcelain)"
		subject=$(git -C "$repo" log -1 --format=%s)
		if [ -n "$files" ]; then
			generated=$((generated + 1))
			echo "  $name: $subject (+ regenerated $files)"
		fi
		git -C "$repo" log -1 --format=%B | grep -q '^Signed-off-by: ' && signed=$((signed + 1))
	done

	if [ -z "${!var:-}" ]; then
		# A base made from the module cache exists nowhere else: the bundle carries it.
		git -C "$repo" bundle create -q "$out/$name.bundle" series upstream-base
	else
		git -C "$repo" bundle create -q "$out/$name.bundle" upstream-base..series
	fi
	echo "upstream-branches: $name: $count commit(s) on $base (branch series in $repo, bundle $out/$name.bundle); $generated commit(s) carry regenerated code; $signed of $count signed off"
}

for name in $(module_names); do
	write_branch "$name"
done
rm -rf "$out/materialized"
