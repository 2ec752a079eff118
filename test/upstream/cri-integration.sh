#!/usr/bin/env bash
# cri-integration.sh [-daemon knext|upstream] [-quick | -run REGEXP] [-count N]: containerd's own
# CRI integration tests (the package integration of the pinned module, every test that builds on
# Linux) against one daemon: knext (build/bin) or upstream containerd built from the pristine
# module (make upstream, build/upstream/bin). Prints the test2json event stream; containerd's, the
# registry's and the test containerds' logs go to $CRI_LOG_DIR (default
# build/test-logs/cri-integration-<daemon>).
#
# The test binary, its failpoint shim and CNI plugin come from the same source as the daemon: the
# patched tree for knext, the pristine module for upstream. The series' fixes to upstream's tests
# (its patches that change only files under integration/) are in the patched tree; the upstream
# column gets them too, on a copy of the module (build/cri-integration-upstream-src), so that both
# columns run the same tests and only the daemons differ. Build
# and flags are upstream's own (Makefile, script/test/cri-integration.sh): no -race (the race
# detector finds one in upstream's test harness, which builds in-process containerds in parallel
# tests; knext's own suites run the patched packages' tests with -race), -cri-endpoint,
# -containerd-bin, -build-dir, -image-list.
#
# -quick runs the tests of NRI and of containerd restarts only (every TestNri*,
# TestUpdatePodSandboxWithRestart, restart_test.go, restart_linux_test.go, issue7496*.go), a few
# minutes instead of the whole package; -run only the tests matching REGEXP (go test's -run);
# -count runs each test N times (go test's -count; default 1).
#
# What the whole package needs, none of it downloaded (see docs/conformance.md):
#   - the environment of upstream's CI (script/setup, script/test/utils.sh): containerd's config,
#     CNI config of install-cni with the CNI plugins at the version containerd pins, the failpoint
#     runtime runc-fp and its CNI network, containerd's root /var/lib/containerd-test, a supervisor
#     that restarts containerd when a test kills it (they kill every process named containerd);
#   - its images (test/upstream/criimages), served by a registry (ociregistry)
#     under the names -image-list gives them, plus the names tests or default configs use
#     literally; every image is pulled, as in upstream's CI;
#   - the previous releases the upgrade tests download from github.com (previous-releases.sh),
#     served with the git tags they list, as github.com would;
#   - a docker that "pulls" and "saves" the BusyBox image (TestImageLoad; no docker daemon here).
# So everything runs in new PID, mount, network and cgroup namespaces: a private /run, overlays
# on /etc, /opt, /var/lib and /usr/local/bin (the paths upstream's tests expect), loopback up,
# a private /etc/hosts naming the registry and github.com, and a cgroup subtree below this script's
# own cgroups that is removed afterwards. Nothing the tests create outlives the script.
#
# Excluded by name (-test.skip), each for the reason given where it is listed: TESTS_SKIPPED.
set -euo pipefail
source "$(dirname "$0")/lib.sh"

self=$(cd "$(dirname "$0")" && pwd)/$(basename "$0")
# The inner invocation (--inside) gets these from the outer one's environment.
if [ "${1:-}" != --inside ]; then
	DAEMON=knext TESTS='.*' COUNT=1
	while [ $# -gt 0 ]; do
		case $1 in
		-daemon) DAEMON=$2 && shift 2 ;;
		-run) TESTS=$2 && shift 2 ;;
		-count) COUNT=$2 && shift 2 ;;
		-quick) TESTS='^(TestNri.*|TestUpdatePodSandboxWithRestart|TestContainerdRestart.*|TestReload100Pods|TestIssue7496.*|TestKillShim.*|TestShutdownShimWhenPauseExitsBeforeWorkload)$' && shift ;;
		*) die "usage: $0 [-daemon knext|upstream] [-quick | -run REGEXP] [-count N]" ;;
		esac
	done
fi
# TestCRIImagePullTimeout/HoldingContentOpenWriter*: they hold content writers open for the
# digests of the manifests of ghcr.io/containerd/volume-ownership:2.1 as ghcr.io serves it, and
# expect the pull to wait for them; only that registry serves those exact bytes.
TESTS_SKIPPED='^TestCRIImagePullTimeout$/^HoldingContentOpenWriter'
CRI_LOG_DIR=${CRI_LOG_DIR:-${LOG_DIR:-$BUILD_DIR/test-logs}/cri-integration-$DAEMON}
# What upstream's script/test/utils.sh waits before restarting a killed containerd. The restart
# tests first wait to see no containerd running, so the restart must not be immediate.
RESTART_WAIT_PERIOD=10
CTRD_ROOT=/var/lib/containerd-test
CTRD_STATE=/run/containerd-test
CTRD_SOCK=$CTRD_STATE/containerd.sock
# Fixed by upstream's tests (integration/nri_test.go): they skip when it does not exist.
NRI_SOCK=/var/run/nri-test.sock

log() { echo "cri-integration ($DAEMON): $*" >&2; }

# ---------------------------------------------------------------------------------------------
# Inside the namespaces (PID 1 of the new PID namespace). $1 is the work directory.
# ---------------------------------------------------------------------------------------------
inside() {
	local work=$1 bin=$1/bin ns=$1/ns
	local -a REGISTRY_ARGS REGISTRY_HOSTS
	read -ra REGISTRY_ARGS <<<"$REGISTRY_ARGS_WORDS"
	read -ra REGISTRY_HOSTS <<<"$REGISTRY_HOSTS_WORDS"
	# /proc/self/mountinfo still lists the host's cgroup mounts; remember them before hiding them.
	local -a cgroup_mounts
	mapfile -t cgroup_mounts < <(awk '{ split($0, p, " - "); split(p[2], f, " ") }
		f[1] == "cgroup" || f[1] == "cgroup2" { print $5, f[1], f[3] }' /proc/self/mountinfo)
	local -A controllers
	local name
	while read -r name _; do controllers[$name]=1; done < <(tail -n +2 /proc/cgroups)

	mount -t tmpfs -o mode=755 knext-run /run
	mkdir -p "$ns" && mount -t tmpfs -o mode=755 knext-scratch "$ns"
	# The tests put containerd's sockets in their temporary directories, whose names hold the
	# test's: the directory must be as short as upstream's /tmp, for a socket path's 108 bytes.
	mount -t tmpfs -o mode=1777 knext-tmp /tmp
	export TMPDIR=/tmp

	# This cgroup namespace is rooted at the subtree the outer script created; mounting the
	# hierarchies again makes runc and containerd see (and create cgroups in) only that subtree.
	mount -t tmpfs -o mode=755 knext-cgroup /sys/fs/cgroup
	local entry point fstype opts opt hierarchy
	for entry in "${cgroup_mounts[@]}"; do
		read -r point fstype opts <<<"$entry"
		[[ $point == /sys/fs/cgroup/* ]] || continue
		mkdir -p "$point"
		if [ "$fstype" = cgroup2 ]; then
			mount -t cgroup2 cgroup2 "$point"
			continue
		fi
		# A v1 hierarchy is selected by its controllers and name=; other options stay as they are.
		hierarchy=()
		for opt in ${opts//,/ }; do
			[[ -n ${controllers[$opt]:-} || $opt == name=* ]] && hierarchy+=("$opt")
		done
		mount -t cgroup -o "$(IFS=,; echo "${hierarchy[*]}")" cgroup "$point"
	done

	# The host's directories as upstream's tests and their containerds expect them, writable here
	# and nowhere else: whatever is written goes to the overlays' upper layers in $ns.
	local dir upper
	for dir in /etc /opt /var/lib /usr/local/bin; do
		upper=$ns/overlay${dir//\//-}
		mkdir -p "$upper/upper" "$upper/work"
		mount -t overlay overlay -o "lowerdir=$dir,upperdir=$upper/upper,workdir=$upper/work" "$dir"
	done
	# containerd's root as upstream's CI has it; TestPodUserNS needs idmapped mounts on it, which
	# tmpfs supports and the overlay does not.
	mkdir -p "$CTRD_ROOT" && mount -t tmpfs -o mode=711 knext-containerd-root "$CTRD_ROOT"

	ip link set lo up
	printf '127.0.0.1 localhost %s\n::1 localhost\n' "${REGISTRY_HOSTS[*]}" >/etc/hosts

	# CNI as upstream's script/setup/install-cni and script/test/utils.sh set it up: the default
	# network for the tests' pods and for every containerd a test starts with a config of its own,
	# and the failpoint network of the runc-fp runtime handler.
	mkdir -p /opt/cni/bin /etc/cni/net.d "$work/net.d-fp"
	cp "$CNI_PLUGINS"/* "$bin/cni-bridge-fp" /opt/cni/bin/
	cni_network() { # cni_network NAME TYPE BRIDGE [EXTRA]
		cat <<-JSON
			{"cniVersion": "1.0.0", "name": "$1",
			 "plugins": [{"type": "$2", "bridge": "$3", "isGateway": true, "ipMasq": true, "promiscMode": true,
			   "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.88.0.0/16"}], [{"subnet": "2001:4860:4860::/64"}]],
			            "routes": [{"dst": "0.0.0.0/0"}, {"dst": "::/0"}]}${4:-}},
			  {"type": "portmap", "capabilities": {"portMappings": true}}]}
		JSON
	}
	cni_network containerd-net bridge cni0 >/etc/cni/net.d/10-containerd-net.conflist
	cni_network containerd-net-failpoint cni-bridge-fp cni-fp ', "capabilities": {"io.kubernetes.cri.pod-annotations": true}' \
		>"$work/net.d-fp/10-containerd-net.conflist"
	# The static binary TestIssue10244LoopbackV2 runs in a container, where upstream's CI installs it.
	cp "$bin/loopback-v2" /usr/local/bin/loopback-v2
	# No docker daemon here: TestImageLoad's `docker pull` and `docker save` of BusyBox get its
	# archive.
	cat >/usr/local/bin/docker <<-SH
		#!/bin/sh
		# docker as TestImageLoad uses it: pull IMAGE, save IMAGE -o FILE (of the BusyBox image).
		case "\$1 \$2" in
		"pull $BUSYBOX_IMAGE") exit 0 ;;
		"save $BUSYBOX_IMAGE") [ "\$3" = -o ] && exec cp "$BUSYBOX_ARCHIVE" "\$4" ;;
		esac
		echo "docker: only 'pull $BUSYBOX_IMAGE' and 'save $BUSYBOX_IMAGE -o FILE' are here: \$*" >&2
		exit 1
	SH
	chmod 755 /usr/local/bin/docker

	# The config of upstream's script/test/utils.sh, plus restrict_oom_score_adj: without
	# CAP_SYS_RESOURCE, as on knext's machines, runc cannot set the pause container's oom_score_adj.
	cat >"$work/config.toml" <<-TOML
		version = 2
		[plugins."io.containerd.grpc.v1.cri"]
		  drain_exec_sync_io_timeout = "10s"
		  restrict_oom_score_adj = true
		[plugins."io.containerd.snapshotter.v1.overlayfs"]
		  slow_chown = true
		[plugins."io.containerd.nri.v1.nri"]
		  disable = false
		  socket_path = "$NRI_SOCK"
		  plugin_path = "/no/pre-launched/nri/plugins"
		[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc-fp]
		  cni_conf_dir = "$work/net.d-fp"
		  cni_max_conf_num = 1
		  pod_annotations = ["io.containerd.runtime.v2.shim.failpoint.*"]
		  runtime_type = "runc-fp.v1"
	TOML

	"$bin/registry" -listen 127.0.0.1:443 -ca-file "$ns/ca.pem" "${REGISTRY_ARGS[@]}" >>"$CRI_LOG_DIR/registry.log" 2>&1 &
	wait_for "registry" 60 test -s "$ns/ca.pem"
	# Go reads the roots it trusts from here (the tests' pulls, containerd's); git from the other.
	export SSL_CERT_FILE=$ns/ca.pem GIT_SSL_CAINFO=$ns/ca.pem
	unset SSL_CERT_DIR

	# The supervisor upstream's restart tests expect: start containerd again whenever it dies.
	(
		while :; do
			"$DAEMON_BIN/containerd" --log-level debug --config "$work/config.toml" --address "$CTRD_SOCK" \
				--state "$CTRD_STATE" --root "$CTRD_ROOT" >>"$CRI_LOG_DIR/containerd.log" 2>&1 || true
			sleep "$RESTART_WAIT_PERIOD"
		done
	) &
	wait_for "containerd" 60 ctr --address "$CTRD_SOCK" version
	wait_for "the NRI socket $NRI_SOCK" 30 test -S "$NRI_SOCK"

	# A containerd a test starts with its own config runs through containerd-oom-wrapper.sh
	# (restrict_oom_score_adj), found first on the PATH or in -build-dir (TestOOMEventMonitor).
	mkdir -p "$work/build-dir"
	ln -s "$(dirname "$self")/containerd-oom-wrapper.sh" "$work/build-dir/containerd"
	ln -s "$DAEMON_BIN/containerd-shim-runc-v2" "$work/build-dir/containerd-shim-runc-v2"
	export KNEXT_CONTAINERD=$DAEMON_BIN/containerd
	log "running $TESTS $COUNT time(s), skipping $TESTS_SKIPPED"
	cd "$work"
	PATH=$work/build-dir:$PATH go tool test2json -t -p cri-integration "$bin/cri-integration.test" \
		-test.run "$TESTS" -test.skip "$TESTS_SKIPPED" -test.v=test2json -test.count "$COUNT" -test.timeout $((80 * COUNT))m \
		--cri-endpoint "unix://$CTRD_SOCK" --containerd-bin containerd --build-dir "$work/build-dir" \
		--image-list "$IMAGE_LIST"
}

# wait_for WHAT SECONDS CMD...: retry CMD once a second until it succeeds.
wait_for() {
	local what=$1 seconds=$2 i
	shift 2
	for ((i = 0; i < seconds; i++)); do
		"$@" >/dev/null 2>&1 && return 0
		sleep 1
	done
	die "$what not ready after ${seconds}s (logs: $CRI_LOG_DIR)"
}

# hierarchy_mountpoint CONTROLLERS: where the v1 hierarchy with these controllers (e.g.
# "cpu,cpuacct", "name=systemd") is mounted; with "", where the v2 hierarchy is.
hierarchy_mountpoint() {
	awk -v want="$1" '{ split($0, p, " - "); split(p[2], f, " ") }
		want == "" && f[1] == "cgroup2" { print $5; exit }
		want != "" && f[1] == "cgroup" {
			split("", have); n = split(f[3], o, ","); for (i = 1; i <= n; i++) have[o[i]] = 1
			m = split(want, w, ","); ok = 1; for (i = 1; i <= m; i++) if (!(w[i] in have)) ok = 0
			if (ok) { print $5; exit }
		}' /proc/self/mountinfo
}

# with_test_fixes SOURCE DIR: where to build the upstream column's tests from. The patches of the
# containerd series that change only files under integration/ are fixes to upstream's tests:
# without any, SOURCE itself; else DIR, a copy of SOURCE (the module cache is read-only, and
# go build -overlay refuses to replace its files) with those patches applied. DIR stays at the
# same path from run to run, for the Go build cache.
with_test_fixes() {
	local source=$1 dir=$2 patch path
	local -a fixes=() patch_paths
	for patch in "$KNEXT_ROOT"/patches/containerd/*.patch; do
		mapfile -t patch_paths < <(sed -n 's|^diff --git a/\([^ ]*\) b/\([^ ]*\)$|\1\n\2|p' "$patch")
		[ ${#patch_paths[@]} -gt 0 ] || continue
		for path in "${patch_paths[@]}"; do
			[[ $path == integration/* ]] || continue 2
		done
		fixes+=("$patch")
	done
	if [ ${#fixes[@]} -eq 0 ]; then
		echo "$source"
		return
	fi
	rm -rf "$dir" && mkdir -p "$(dirname "$dir")" && cp -r "$source" "$dir" && chmod -R u+w "$dir"
	# Its own repository, so that git apply reads the patches' paths from its top.
	git init -q "$dir" && git -C "$dir" apply "${fixes[@]}" ||
		die "the series' fixes to upstream's tests do not apply to $source: ${fixes[*]}"
	log "the series' fixes to upstream's tests, on the upstream column too: ${fixes[*]##*/}"
	echo "$dir"
}

if [ "${1:-}" = --inside ]; then
	inside "$2"
	exit
fi

# ---------------------------------------------------------------------------------------------
# On the host: build, set up the cgroup subtree, run inside the namespaces, clean up.
# ---------------------------------------------------------------------------------------------
require_root cri-integration.sh "it creates namespaces, mounts and cgroups"
for tool in go unshare strace lsof pkill pidof ip tar git mkfs.erofs /usr/local/bin/runc; do
	command -v "$tool" >/dev/null || die "$tool is missing: run script/ci/install-deps.sh"
done
case $DAEMON in
knext)
	DAEMON_BIN=$BUILD_DIR/bin
	test_source=$(tree_dir containerd)
	test_env=(GOWORK="$GOWORK")
	;;
upstream)
	DAEMON_BIN=$BUILD_DIR/upstream/bin
	test_source=$(upstream_module_dir containerd)
	test_env=(GOWORK=off)
	;;
*) die "-daemon $DAEMON: want knext or upstream" ;;
esac
for binary in containerd containerd-shim-runc-v2; do
	[ -x "$DAEMON_BIN/$binary" ] || die "$DAEMON_BIN/$binary is missing: run 'make build upstream'"
done
[ -x "$BUILD_DIR/bin/ctr" ] || die "$BUILD_DIR/bin/ctr is missing: run 'make build'"

mkdir -p "$CRI_LOG_DIR" && rm -rf "${CRI_LOG_DIR:?}"/*
# Not in /tmp, which the namespaces have a tmpfs of their own on.
work=$(mktemp -d "$BUILD_DIR/cri-integration.XXXXXX")
bin=$work/bin
cgroup_name=knext-cri-integration-$$
cgroup_dirs=()

cleanup() {
	local dir attempt leaked=0
	# Leave the subtree, then remove it bottom-up. Processes of a namespace killed by a signal
	# may take a moment to exit.
	for dir in "${cgroup_dirs[@]}"; do
		echo $$ >"$(dirname "$dir")/cgroup.procs" 2>/dev/null || true
	done
	for dir in "${cgroup_dirs[@]}"; do
		for ((attempt = 0; attempt < 20; attempt++)); do
			[ -d "$dir" ] || break
			find "$dir" -depth -type d -exec rmdir {} + 2>/dev/null || sleep 0.5
		done
		if [ -d "$dir" ]; then
			log "cgroup $dir could not be removed: $(find "$dir" -name cgroup.procs -exec cat {} + | wc -l) processes left"
			leaked=1
		fi
	done
	if grep -q "$work" /proc/self/mountinfo; then
		log "mounts under $work leaked onto the host:"
		grep "$work" /proc/self/mountinfo >&2
		leaked=1
	fi
	rm -rf "$work"
	return $leaked
}
trap 'cleanup || true' EXIT

[ "$DAEMON" != upstream ] || test_source=$(with_test_fixes "$test_source" "$BUILD_DIR/cri-integration-upstream-src")
log "building the test binary and its helpers from $test_source into $bin"
(cd "$test_source" &&
	env "${test_env[@]}" go test -c -o "$bin/cri-integration.test" ./integration &&
	env "${test_env[@]}" CGO_ENABLED=0 go build -o "$bin/" ./integration/failpoint/cmd/containerd-shim-runc-fp-v1 \
		./integration/failpoint/cmd/loopback-v2 &&
	env "${test_env[@]}" go build -o "$bin/" ./integration/failpoint/cmd/cni-bridge-fp) >&2
images=$work/images
(cd "$KNEXT_ROOT" &&
	go build -o "$bin/registry" ./test/upstream/ociregistry &&
	CGO_ENABLED=0 go build -trimpath -ldflags=-s -o "$images/bin/" ./internal/ociimage/pause ./test/upstream/criimages/stress \
		./internal/conformance/fakenginx &&
	go run ./test/upstream/criimages -pause "$images/bin/pause" -stress "$images/bin/stress" \
		-nginx "$images/bin/fakenginx" -out "$images") >&2
CNI_PLUGINS=$("$KNEXT_ROOT/test/upstream/cni-plugins.sh" "$BUILD_DIR/cni-plugins")
releases=$BUILD_DIR/previous-releases
"$KNEXT_ROOT/test/upstream/previous-releases.sh" "$releases" >/dev/null

# The images under the names of -image-list, and the names tests and default configs pull
# literally: upstream's default sandbox image (which the image list's Pause must be: a test checks
# it is the pinned sandbox image), that of each previous release, and the image
# TestCRIImagePullTimeout pulls by name.
image() { sed -n "s/^$1 = \"\(.*\)\"$/\1/p" "$images/image-list.toml"; }
default_sandbox=$("$DAEMON_BIN/containerd" config default | sed -n "s/^ *sandbox = '\(.*\)'$/\1/p")
[ -n "$default_sandbox" ] || die "cannot read the default sandbox image from 'containerd config default'"
pause=$(image Pause)
IMAGE_LIST=$work/image-list.toml
sed "s|^Pause = .*|Pause = \"$default_sandbox\"|" "$images/image-list.toml" >"$IMAGE_LIST"
REGISTRY_ARGS=(-github-releases "$releases")
for name in "$default_sandbox" $(cat "$releases/sandbox-images"); do
	REGISTRY_ARGS+=(-alias "$name=$pause")
done
REGISTRY_ARGS+=(-alias "ghcr.io/containerd/volume-ownership:2.1=$(image VolumeOwnership)")
REGISTRY_ARGS+=("$images"/*.tar)
# The hosts of every name served, and github.com, all at the registry's address.
mapfile -t REGISTRY_HOSTS < <({
	echo github.com
	sed -n 's/^[A-Za-z]* = "\([^/]*\)\/.*"$/\1/p' "$IMAGE_LIST"
	for arg in "${REGISTRY_ARGS[@]}"; do [[ $arg != *=* ]] || echo "${arg%%/*}"; done
} | sort -u)
BUSYBOX_IMAGE=$(image BusyBox)
BUSYBOX_ARCHIVE=$images/busybox.tar

# A child of this script's own cgroup in every hierarchy (so that limits and accounting of
# whoever runs us still apply), which becomes the root of the tests' cgroup namespace. Read
# /proc/self/cgroup whole first: moving between cgroups changes what a later read() would return.
mapfile -t own_cgroups </proc/self/cgroup
for line in "${own_cgroups[@]}"; do
	IFS=: read -r _ controllers path <<<"$line"
	mountpoint=$(hierarchy_mountpoint "$controllers")
	[ -n "$mountpoint" ] || die "no mount point for cgroup hierarchy '$controllers'"
	dir=$mountpoint${path%/}/$cgroup_name
	mkdir "$dir"
	cgroup_dirs+=("$dir")
	if [ -f "$dir/cpuset.cpus" ]; then
		cat "$(dirname "$dir")/cpuset.cpus" >"$dir/cpuset.cpus"
		cat "$(dirname "$dir")/cpuset.mems" >"$dir/cpuset.mems"
	fi
	echo $$ >"$dir/cgroup.procs"
done

export DAEMON DAEMON_BIN RESTART_WAIT_PERIOD CTRD_ROOT CTRD_STATE CTRD_SOCK NRI_SOCK TESTS COUNT TESTS_SKIPPED \
	CRI_LOG_DIR IMAGE_LIST BUSYBOX_IMAGE BUSYBOX_ARCHIVE CNI_PLUGINS
export PATH="$DAEMON_BIN:$BUILD_DIR/bin:$bin:/usr/local/bin:$PATH"
# Arrays do not cross exec; the inner script gets them as words (none contains a space).
# --kill-child: if unshare dies, PID 1 of the namespace dies, and with it every process in it.
# Only standard input, output and error go in: a descriptor left open by whoever runs this (a CI
# runner's pipe) would reach containerd and every shim, where TestContainerIOLeakAfterStartFailed
# counts a shim's pipes.
(
	for fd in /proc/$BASHPID/fd/*; do
		fd=${fd##*/}
		if [ "$fd" -gt 2 ] && [ "$fd" != 255 ]; then eval "exec $fd>&-"; fi
	done
	REGISTRY_ARGS_WORDS="${REGISTRY_ARGS[*]}" REGISTRY_HOSTS_WORDS="${REGISTRY_HOSTS[*]}" \
		exec unshare --kill-child=SIGKILL --cgroup --mount --net --pid --fork --mount-proc "$self" --inside "$work"
) &
ns_pid=$!
trap 'kill "$ns_pid" 2>/dev/null' INT TERM
status=0
wait "$ns_pid" || status=$?
# A signal ends the first wait early; this one returns once unshare is gone.
wait "$ns_pid" 2>/dev/null || true
trap - EXIT INT TERM
cleanup || status=1
exit $status
