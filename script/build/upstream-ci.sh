#!/usr/bin/env bash
# upstream-ci.sh [-json]: run upstream's own CI checks on the upstream-form branches that
# upstream-branches.sh wrote (KNEXT_UPSTREAM_BRANCHES_DIR, default build/upstream-branches).
#
# NRI, with its own Makefile, as its CI workflow runs it:
#   nri/project-checks            every commit signed off by its author, its subject under 90
#                                 bytes, no whitespace errors (project-checks' git-validation)
#   nri/make-all                  after `touch pkg/api/api.proto`: build-proto, build-check, build-plugins
#   nri/generated-code            then `make validate-repo-no-changes`: the committed generated code
#                                 is what build-proto wrote
#   nri/make-build-plugins        the in-repo plugins (nested modules)
#   nri/make-test                 go-generate, `go test -race` of ./..., the plugins' tests
# containerd, on the packages the series touches, against the upstream-form NRI branch (NRI's
# pull requests merge first):
#   containerd/project-checks, containerd/vet (`go vet ./internal/cri/... ./internal/nri/...`),
#   containerd/test-race (`go test -race` of the same), containerd/build-linux (`go build
#   ./cmd/...`), containerd/build-windows (`GOOS=windows go build ./cmd/...`)
#
# Offline substitutions for NRI's Makefile, which downloads protoc 3.20.1 from GitHub:
#   PROTOC_PATH=<dir>  whose bin/protoc is the system protoc (Debian's 3.21.12) and include/ is
#                      /usr/include; the Makefile `go install`s the generators into <dir>/bin at
#                      the versions NRI's go.mod pins, as upstream's CI does
#   PROTOBUF_VERSION=<system protoc's version>  so that check-protoc accepts it instead of
#                      deleting PROTOC_PATH and downloading
#   before validate-repo-no-changes, the `// protoc vX` header line of the generated files is set
#   back to the version upstream's committed files name: protoc 3.21.12 writes code identical to
#   3.20.1's otherwise (verify-proto.sh), so every other difference still fails the check.
#
# Output is `go test -v` style, one test per target (test counts of a target in its output);
# with -json it is test2json. Logs: <dir>/logs. Exits non-zero when a target failed.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/lib.sh"

if [ "${1:-}" = -json ]; then
	shift
	"$0" "$@" | go tool test2json -t -p knext/upstream-ci
	exit "${PIPESTATUS[0]}"
fi

dir=${KNEXT_UPSTREAM_BRANCHES_DIR:-$KNEXT_ROOT/build/upstream-branches}
for name in $(module_names); do
	[ -d "$dir/$name/.git" ] || die "upstream-ci: no $dir/$name: run make upstream-branches first"
done
dir=$(cd "$dir" && pwd)
logs=$dir/logs
rm -rf "$logs" && mkdir -p "$logs"
# Upstream's CI runs in the module, without our workspace or flags.
export GOWORK=off GOFLAGS=
failures=0
summary=()

# count_tests LOG: "P passed, F failed, S skipped" from `go test -v` output (tests and subtests).
count_tests() {
	local p f s
	p=$(grep -c -E '^[[:space:]]*--- PASS: ' "$1" || true)
	f=$(grep -c -E '^[[:space:]]*--- FAIL: ' "$1" || true)
	s=$(grep -c -E '^[[:space:]]*--- SKIP: ' "$1" || true)
	echo "$p passed, $f failed, $s skipped"
}

# target NAME TESTS(yes|no) COMMAND...: run one check in the current directory and report it in
# `go test -v` form.
target() {
	local name=$1 tests=$2 log start secs counts= verdict=PASS
	shift 2
	log=$logs/${name//\//-}.log
	echo "=== RUN   $name"
	echo "    \$ $*"
	start=$(date +%s)
	"$@" >"$log" 2>&1 || verdict=FAIL
	secs=$(($(date +%s) - start))
	[ "$tests" = no ] || counts=$(count_tests "$log")
	echo "    ${counts:+$counts; }log: $log"
	summary+=("$(printf '%-28s %-5s %6ss  %s' "$name" "$verdict" "$secs" "$counts")")
	if [ "$verdict" = FAIL ]; then
		failures=$((failures + 1))
		failure_excerpt "$log"
	fi
	echo "--- $verdict: $name ($secs.00s)"
}

# project_checks REPO: the rules upstream's project-checks action has git-validation apply to every
# commit after upstream-base (DCO, short-subject, dangling-whitespace), but for the DCO stricter:
# the Signed-off-by line must be the author's. A subject of 90 bytes or more fails; over 72,
# git-validation passes it with a remark, repeated here.
project_checks() {
	local commits commit author subject bytes failed=0
	commits=$(git -C "$1" rev-list --reverse upstream-base..series) && [ -n "$commits" ] ||
		{ echo "no commits in upstream-base..series of $1"; return 1; }
	for commit in $commits; do
		author=$(git -C "$1" log -1 --format='%an <%ae>' "$commit")
		subject=$(git -C "$1" log -1 --format=%s "$commit")
		bytes=$(printf %s "$subject" | LC_ALL=C wc -c)
		if ! git -C "$1" log -1 --format=%B "$commit" | grep -qxF "Signed-off-by: $author"; then
			echo "not signed off by its author ($author): ${commit:0:12} $subject"
			failed=$((failed + 1))
		fi
		if [ "$bytes" -ge 90 ]; then
			echo "subject of $bytes bytes, 90 or more: ${commit:0:12} $subject"
			failed=$((failed + 1))
		elif [ "$bytes" -gt 72 ]; then
			echo "subject of $bytes bytes, more than 72 (passes): ${commit:0:12} $subject"
		fi
		if ! git -C "$1" show --check --format= "$commit" -- . ':(exclude)vendor' ':(exclude)script/validate/template'; then
			echo "whitespace errors (above): ${commit:0:12} $subject"
			failed=$((failed + 1))
		fi
	done
	echo "$failed problem(s) in $(wc -w <<<"$commits") commit(s)"
	[ "$failed" = 0 ]
}

# generated_code_unchanged PROTOC_VERSION: NRI's validate-repo-no-changes after setting the protoc
# header line back to upstream's.
generated_code_unchanged() {
	local -a files
	mapfile -t files < <(git ls-files --cached --others --exclude-standard -- "${KNEXT_GENERATED_PATHS[@]}")
	[ ${#files[@]} -eq 0 ] || set_protoc_header "$1" "${files[@]}"
	make validate-repo-no-changes
}

# clean_checkout REPO: the branch as committed, nothing else.
clean_checkout() {
	git -C "$1" checkout -q -f series
	git -C "$1" clean -q -f -d -x
}

start=$(date +%s)
if module_names | grep -qx nri; then
	nri=$dir/nri
	clean_checkout "$nri"
	protoc_path=$dir/protoc
	rm -rf "$protoc_path" && mkdir -p "$protoc_path/bin"
	ln -s "$(command -v protoc)" "$protoc_path/bin/protoc"
	ln -s /usr/include "$protoc_path/include"
	protoc_version=$(protoc --version | awk '{ print $2 }')
	upstream_protoc=$(sed -n 's/^PROTOBUF_VERSION[[:space:]]*=[[:space:]]*//p' "$nri/Makefile")
	[ -n "$upstream_protoc" ] || die "upstream-ci: NRI's Makefile sets no PROTOBUF_VERSION any more; re-check the substitutions"
	make_nri=(make PROTOC_PATH="$protoc_path" PROTOBUF_VERSION="$protoc_version")
	(
		cd "$nri"
		target nri/project-checks no project_checks "$nri"
		touch pkg/api/api.proto
		target nri/make-all no "${make_nri[@]}" all
		target nri/generated-code no generated_code_unchanged "v$upstream_protoc"
		target nri/make-build-plugins no "${make_nri[@]}" build-plugins
		target nri/make-test yes "${make_nri[@]}" test
		printf '%s\n' "${summary[@]}" >"$logs/summary-nri"
		exit "$failures"
	) || failures=$?
	if [ ! -f "$nri/plugins/wasm/go.mod" ]; then
		echo "    note: $nri has no nested modules (plugins/*): the Go module source leaves them out;"
		echo "    set KNEXT_UPSTREAM_GIT_NRI=PATH@REV (an NRI clone) for make upstream-branches"
	fi
fi

if module_names | grep -qx containerd; then
	containerd=$dir/containerd
	clean_checkout "$containerd"
	gover=$(sed -n 's/^go //p' "$KNEXT_ROOT/go.mod")
	printf 'go %s\n\nuse (\n\t./containerd\n\t./nri\n)\n' "$gover" >"$dir/upstream.work"
	packages=(./internal/cri/... ./internal/nri/...)
	(
		cd "$containerd"
		export GOWORK=$dir/upstream.work
		target containerd/project-checks no project_checks "$containerd"
		target containerd/vet no go vet "${packages[@]}"
		target containerd/test-race yes go test -v -race "${packages[@]}"
		target containerd/build-linux no go build ./cmd/...
		target containerd/build-windows no env GOOS=windows go build ./cmd/...
		printf '%s\n' "${summary[@]}" >"$logs/summary-containerd"
		exit "$failures"
	) || failures=$((failures + $?))
fi

echo
echo "upstream-ci summary (target, result, seconds, tests and subtests):"
cat "$logs/summary-nri" "$logs/summary-containerd" 2>/dev/null | sed 's/^/  /'
if [ "$failures" -gt 0 ]; then
	echo "FAIL"
	echo "upstream-ci: $failures target(s) failed ($(($(date +%s) - start)) s)"
	exit 1
fi
echo "PASS"
echo "upstream-ci: every target passed ($(($(date +%s) - start)) s)"
