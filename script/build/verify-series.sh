#!/usr/bin/env bash
# verify-series.sh [-json]: check every patch series patch by patch. For each module, at every
# step of its series (upstream tag + patches 1..i):
#   build    `go build ./...` of the module (containerd: against the fully patched NRI tree, as
#            NRI's pull requests merge first)
#   windows  containerd only: `GOOS=windows go build ./cmd/... ./internal/cri/...`
#   test     `go test` of every package directory holding a .go file the patch changes; containerd's
#            ./integration (its CRI integration suite) is only compiled (`go test -c`): its TestMain
#            connects to a running containerd and its restart tests kill every process named
#            containerd; the suite cri-integration runs it, in namespaces of its own
# NRI steps whose .proto files differ from upstream regenerate the protobuf code first, exactly as
# make src does (postpatch-nri.sh).
#
# One scratch tree per module (KNEXT_SERIES_DIR, default build/series) walks the commits with git
# checkout; Go's build and test caches are shared. A step that passed is remembered under a key of
# its commit (and NRI's head for containerd), the Go version and this script, and is not run again.
#
# Output is `go test -v` style, one test per step, named <module>/<patch file>; with -json it is
# test2json, for make test. A failing step names the patch, the phase and the packages; its log
# is in KNEXT_SERIES_DIR/logs. Exits non-zero when a step failed.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/lib.sh"

if [ "${1:-}" = -json ]; then
	shift
	set -o pipefail
	"$0" "$@" | go tool test2json -t -p knext/verify-series
	exit "${PIPESTATUS[0]}"
fi

work=${KNEXT_SERIES_DIR:-$KNEXT_ROOT/build/series}
tools=${KNEXT_TOOLS_DIR:-$KNEXT_ROOT/build/tools}
mkdir -p "$work" "$tools"
work=$(cd "$work" && pwd)
logs=$work/logs
passed=$work/passed-steps
rm -rf "$logs" && mkdir -p "$logs"
touch "$passed"
export GOFLAGS=-buildvcs=false

# Everything a step's verdict depends on besides the trees themselves.
checker_key=$( (go version && cat "$0" "$here/postpatch-nri.sh" && protoc --version) | sha256sum | cut -c1-16)

# Fresh trees from patches/ (deterministic: the same series gives the same commits).
KNEXT_TOOLS_DIR=$tools "$here/materialize.sh" "$work" >"$logs/materialize.log" 2>&1 || {
	cat "$logs/materialize.log" >&2
	die "verify-series: the series does not apply (see above)"
}
# clear_skip_worktree TREE: postpatch-nri.sh hides the regenerated files from git; the walk needs
# checkout to restore them at every step.
clear_skip_worktree() {
	git -C "$1" ls-files -v | sed -n 's/^S //p' | (cd "$1" && xargs -r git update-index --no-skip-worktree --)
}
for name in $(module_names); do clear_skip_worktree "$work/src/$name"; done
nri_head=$(git -C "$work/src/nri" rev-parse HEAD)
# The other modules' steps build in a workspace of the two trees only: our own code builds against
# the full series, not against an intermediate step.
gover=$(sed -n 's/^go //p' "$KNEXT_ROOT/go.mod")
{
	printf 'go %s\n\nuse (\n' "$gover"
	for name in $(module_names); do printf '\t./src/%s\n' "$name"; done
	printf ')\n'
} >"$work/series.work"

failures=0

# report NAME SECONDS VERDICT [LOG]: close one step in `go test -v` form, with LOG's failure.
report() {
	local name=$1 secs=$2 verdict=$3 log=${4:-}
	if [ "$verdict" = PASS ]; then
		echo "--- PASS: $name ($secs)"
		return
	fi
	failures=$((failures + 1))
	[ -z "$log" ] || failure_excerpt "$log"
	echo "--- FAIL: $name ($secs)"
}

# failed_packages LOG: the packages `go build` or `go test` reported as broken or failing.
failed_packages() {
	sed -n -e 's/^FAIL[[:space:]]\+\([^[:space:]]\+\).*/\1/p' -e 's/^# \([^[:space:]]\+\).*/\1/p' "$1" |
		grep -v '^\[' | sort -u | paste -sd' ' -
}

# touched_packages TREE COMMIT: ./dir for every directory of the main module that holds Go files
# and in which the commit changes, adds or removes a .go file (testdata excluded); nested:dir for
# such directories in nested modules.
touched_packages() {
	local tree=$1 commit=$2 dir
	git -C "$tree" diff --name-only "$commit^" "$commit" -- '*.go' | { grep -v -e '/testdata/' -e '^testdata/' || true; } |
		xargs -r -n1 dirname | sort -u |
		while read -r dir; do
			compgen -G "$tree/$dir/*.go" >/dev/null || continue
			# A directory in a nested module is not part of `go build ./...` of this module.
			if [ "$(module_root "$tree" "$dir")" = . ]; then echo "./$dir"; else echo "nested:$dir"; fi
		done
}

# module_root TREE DIR: the directory (relative to TREE) of the go.mod that owns DIR.
module_root() {
	local tree=$1 dir=$2
	while [ "$dir" != . ] && [ ! -f "$tree/$dir/go.mod" ]; do dir=$(dirname "$dir"); done
	echo "$dir"
}

# run_phase LOG PHASE COMMAND...: one phase of a step, logged to LOG; prints PHASE and fails
# when the command fails.
run_phase() {
	local log=$1 phase=$2
	shift 2
	echo "### $phase: $*" >>"$log"
	"$@" >>"$log" 2>&1 || { echo "$phase"; return 1; }
}

# check_tree NAME TREE LOG PACKAGES...: regenerate, build and test the checked-out tree; prints
# the failed phase and fails.
check_tree() {
	local name=$1 tree=$2 log=$3
	shift 3
	cd "$tree"
	if [ "$name" = nri ] && ! git diff --quiet "$(upstream_tag nri)" HEAD -- '*.proto'; then
		run_phase "$log" regenerate "$here/postpatch-nri.sh" . "$tools" || return 1
		clear_skip_worktree .
	fi
	if [ "$name" = nri ]; then
		export GOWORK=off
	else
		export GOWORK=$work/series.work
	fi
	run_phase "$log" build go build ./... || return 1
	if [ "$name" = containerd ]; then
		run_phase "$log" windows-build env GOOS=windows go build ./cmd/... ./internal/cri/... || return 1
	fi
	local pkg
	local -a run=() compile=()
	for pkg in "$@"; do
		if [ "$name" = containerd ] && [ "$pkg" = ./integration ]; then compile+=("$pkg"); else run+=("$pkg"); fi
	done
	[ ${#compile[@]} -eq 0 ] || run_phase "$log" test go test -c -o /dev/null "${compile[@]}" || return 1
	[ ${#run[@]} -eq 0 ] || run_phase "$log" test go test "${run[@]}"
}

# verify_step MODULE TREE INDEX COMMIT PATCHNAME KEY: check one step and print its result.
verify_step() {
	local name=$1 tree=$2 index=$3 commit=$4 patch=$5 key=$6
	local test_name="$name/$patch" start log pkgs nested phase secs
	local -a test_pkgs=()
	echo "=== RUN   $test_name"
	if grep -qxF "$key" "$passed"; then
		echo "    cached: passed before at the same commit, with the same Go and checks"
		report "$test_name" 0.00s PASS
		return
	fi
	start=$(date +%s%N)
	log=$logs/$name-$(printf %04d "$index").log
	: >"$log"
	git -C "$tree" checkout -q -f "$commit"
	git -C "$tree" clean -q -f -d -x
	pkgs=$(touched_packages "$tree" "$commit")
	nested=$(sed -n 's/^nested://p' <<<"$pkgs" | paste -sd' ' -)
	mapfile -t test_pkgs < <(grep -v -e '^nested:' -e '^$' <<<"$pkgs" || true)
	phase=$(check_tree "$name" "$tree" "$log" "${test_pkgs[@]}") && phase=
	secs=$(printf '%d.%02ds' $((($(date +%s%N) - start) / 1000000000)) $((($(date +%s%N) - start) / 10000000 % 100)))
	if [ -z "$phase" ]; then
		echo "    tested: ${test_pkgs[*]:-(no Go package changed)}"
		[ -z "$nested" ] || echo "    not tested here (in nested modules; see make upstream-ci): $nested"
		echo "$key" >>"$passed"
		report "$test_name" "$secs" PASS
		return
	fi
	local culprits
	culprits=$(failed_packages "$log")
	echo "    FAILED: patch $patch (step $index of $name): $phase failed${culprits:+ in $culprits}"
	echo "    log: $log"
	report "$test_name" "$secs" FAIL "$log"
}

# verify_module NAME [NRIHEAD]: every step of NAME's series, in order.
verify_module() {
	local name=$1 extra=${2:-} tree=$work/src/$1 tag index=0 commit patch
	tag=$(upstream_tag "$name")
	local -a patches=("$KNEXT_ROOT/patches/$name"/*.patch)
	[ -e "${patches[0]}" ] || return 0
	for commit in $(git -C "$tree" rev-list --reverse "$tag..HEAD"); do
		patch=$(basename "${patches[$index]}")
		index=$((index + 1))
		verify_step "$name" "$tree" "$index" "$commit" "$patch" "$checker_key-$name-$commit-$extra"
	done
	[ "$index" = "${#patches[@]}" ] || die "verify-series: $name has $index commits for ${#patches[@]} patches"
}

start=$(date +%s)
# NRI first: its pull requests merge first, so the other modules' steps build against its whole
# series, with its generated code.
for name in $(module_names | grep -x nri) $(module_names | grep -vx nri); do
	if [ "$name" = nri ]; then
		verify_module nri
		git -C "$work/src/nri" checkout -q -f "$nri_head"
		git -C "$work/src/nri" clean -q -f -d -x
		"$here/postpatch-nri.sh" "$work/src/nri" "$tools" >"$logs/nri-head.log" 2>&1 || {
			cat "$logs/nri-head.log" >&2
			die "verify-series: regenerating NRI's code at the head of its series failed"
		}
		clear_skip_worktree "$work/src/nri"
	else
		verify_module "$name" "$nri_head"
	fi
done
if [ "$failures" -gt 0 ]; then
	echo "FAIL"
	echo "verify-series: $failures step(s) failed ($(($(date +%s) - start)) s)"
	exit 1
fi
echo "PASS"
echo "verify-series: every step of every series builds and passes its packages' tests ($(($(date +%s) - start)) s)"
