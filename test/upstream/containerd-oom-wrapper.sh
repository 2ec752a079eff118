#!/usr/bin/env bash
# containerd-oom-wrapper.sh: run as "containerd" (a symlink of that name first on the tests' PATH)
# by upstream tests that start a containerd of their own with a config of their own
# (TestReload100Pods: an empty one). Starts the real containerd, $KNEXT_CONTAINERD, with that
# config plus restrict_oom_score_adj = true. Without it the pause container asks for upstream's
# default oom_score_adj -998, and runc fails ("failed to update /proc/self/oom_score_adj:
# Permission denied") wherever CAP_SYS_RESOURCE is missing, as on knext's CI machines.
set -euo pipefail

args=() config=
while [ $# -gt 0 ]; do
	case $1 in
	--config | -c) config=$2 && shift 2 ;;
	--config=*) config=${1#*=} && shift ;;
	*) args+=("$1") && shift ;;
	esac
done
[ -n "$config" ] || { echo "containerd-oom-wrapper: no --config in the arguments" >&2; exit 2; }
[ -n "${KNEXT_CONTAINERD:-}" ] || { echo "containerd-oom-wrapper: KNEXT_CONTAINERD is not set" >&2; exit 2; }

# The test's config is imported, so whatever it sets wins.
wrapped=$(mktemp "${TMPDIR:-/tmp}/knext-restricted-oom.XXXXXX")
cat >"$wrapped" <<TOML
version = 3
imports = ['$config']
[plugins.'io.containerd.cri.v1.runtime']
  restrict_oom_score_adj = true
TOML
exec "$KNEXT_CONTAINERD" --config "$wrapped" "${args[@]}"
