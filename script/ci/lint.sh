#!/usr/bin/env bash
# lint.sh: gofmt and go vet on our code and on the packages our patches touch.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
source "$root/script/build/lib.sh"
cd "$root"
status=0

bad=$(gofmt -l $(git ls-files '*.go') 2>&1 || true)
[ -z "$bad" ] || { echo "gofmt would change: $bad" >&2; status=1; }
go vet ./... || status=1

# Upstream packages touched by the series, in each patched tree.
for name in $(module_names); do
	tree=$root/build/src/$name
	dirs=$(git -C "$tree" diff --name-only "$(upstream_tag "$name")" HEAD -- '*.go' |
		grep -v '/testdata/' | xargs -r -n1 dirname | sort -u)
	[ -n "$dirs" ] || continue
	bad=$(cd "$tree" && gofmt -l $dirs)
	[ -z "$bad" ] || { echo "gofmt would change in $name: $bad" >&2; status=1; }
	(cd "$tree" && go vet $(printf './%s ' $dirs)) || status=1
done
[ $status = 0 ] && echo "lint: gofmt and go vet clean"
exit $status
