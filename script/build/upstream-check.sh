#!/usr/bin/env bash
# upstream-check.sh (`make upstream-check`): the pinned and the newest versions the Go module proxy
# serves of the upstream modules knext follows, and whether each patch series still applies to the
# newest release of its module. Informational: it never fails.
set -uo pipefail
. "$(dirname "$0")/lib.sh"

# newest MODULE -> the newest release (no pre-release) the module proxy serves.
newest() {
	GOWORK=off go list -m -versions "$1" 2>/dev/null | tr ' ' '\n' | tail -n +2 | grep -v -- - | tail -1
}

# pinned MODDIR MODULE -> the version MODDIR's go.mod requires.
pinned() {
	(cd "$1" && GOWORK=off GOFLAGS=-mod=mod go list -m -f '{{.Version}}' "$2" 2>/dev/null)
}

# applies NAME MODULE VERSION -> whether patches/NAME applies to MODULE@VERSION's source.
applies() {
	local dir work result
	dir=$(GOWORK=off go mod download -json "$2@$3" 2>/dev/null | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
	[ -n "$dir" ] || { echo "cannot download $2@$3"; return; }
	work=$(mktemp -d)
	cp -r "$dir/." "$work" && chmod -R u+w "$work"
	(
		cd "$work" && git init -q && git add -A && git commit -qm "$2 $3" &&
			git am -q -3 "$KNEXT_ROOT"/patches/"$1"/*.patch >/dev/null 2>&1
	) && result="the series applies" ||
		result="the series does not apply: $(cd "$work" && git am --show-current-patch=raw 2>/dev/null | sed -n 's/^Subject: //p' | head -1)"
	rm -rf "$work"
	echo "$result"
}

printf '%-36s %-12s %-12s %s\n' module pinned newest "series on the newest"
for entry in "nri=github.com/containerd/nri=$KNEXT_ROOT" \
	"containerd=github.com/containerd/containerd/v2=$KNEXT_ROOT" \
	"=k8s.io/cri-api=$KNEXT_ROOT" \
	"=k8s.io/kubernetes=$KNEXT_ROOT/third_party/kubernetes"; do
	IFS== read -r name module moddir <<<"$entry"
	have=$(pinned "$moddir" "$module")
	latest=$(newest "$module")
	status=-
	if [ -n "$name" ]; then
		if [ "$have" = "$latest" ]; then status="pinned is newest"; else status=$(applies "$name" "$module" "$latest"); fi
	fi
	printf '%-36s %-12s %-12s %s\n' "$module" "${have:-?}" "${latest:-?}" "$status"
done
exit 0
