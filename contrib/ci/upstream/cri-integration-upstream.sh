#!/usr/bin/env bash
# cri-integration-upstream.sh: containerd's own CRI integration tests (the tree's ./integration)
# for NRI and for containerd restarts, against the knext binaries of $BUILD_DIR/bin. Prints the
# test2json event stream; containerd's and the registry's logs go to $LOG_DIR/cri-integration
# (default build/test-logs/cri-integration).
#
# Selection: every TestNri*, TestUpdatePodSandboxWithRestart (NRI pod resources across a
# restart), and the restart tests of restart_test.go, restart_linux_test.go and issue7496*.go.
# The test binary is built with -race: the tests' mock NRI plugins run NRI's stub in it.
#
# Upstream's restart tests kill every process named containerd and expect a supervisor to start
# it again, as script/test/utils.sh does. So everything runs in new PID, mount, network and cgroup
# namespaces: a private tmpfs /run (state, sockets, /var/run/nri-test.sock, netns mounts),
# loopback up, private CNI networks, a private /etc/hosts, and a cgroup subtree below this
# script's own cgroups that is removed afterwards. Nothing the tests create outlives the script.
#
# No registry is reachable, so the tests use the local test images through -image-list, imported
# beforehand. The few tests that pull by name anyway (the containerd client's Pull, a containerd
# started with a default config whose sandbox image is upstream's pause) pull from ociregistry,
# which serves the same archives inside the network namespace. A containerd a test starts with
# its own config runs through containerd-oom-wrapper.sh (restrict_oom_score_adj, see there).
#
# Environment: CRI_INTEGRATION_RUN overrides the test selection (a -test.run regexp);
# KNEXT_IMAGES_DIR names a directory holding pause.tar and busybox.tar to use instead of
# building them.
set -euo pipefail
source "$(dirname "$0")/lib.sh"

self=$(cd "$(dirname "$0")" && pwd)/$(basename "$0")
TESTS=${CRI_INTEGRATION_RUN:-'^(TestNri.*|TestUpdatePodSandboxWithRestart|TestContainerdRestart.*|TestReload100Pods|TestIssue7496.*|TestKillShim.*|TestShutdownShimWhenPauseExitsBeforeWorkload)$'}
# Set once by the outer script; the inner one inherits it.
CRI_LOG_DIR=${CRI_LOG_DIR:-${LOG_DIR:-$BUILD_DIR/test-logs}/cri-integration}
# What upstream's script/test/utils.sh waits before restarting a killed containerd. The restart
# tests first wait to see no containerd running, so the restart must not be immediate.
RESTART_WAIT_PERIOD=10
CTRD_STATE=/run/containerd-test
CTRD_SOCK=$CTRD_STATE/containerd.sock
# Fixed by upstream's tests (integration/nri_test.go): they skip when it does not exist.
NRI_SOCK=/var/run/nri-test.sock

log() { echo "cri-integration: $*" >&2; }

# ---------------------------------------------------------------------------------------------
# Inside the namespaces (PID 1 of the new PID namespace). $1 is the work directory.
# ---------------------------------------------------------------------------------------------
inside() {
	local work=$1 bin=$1/bin ns=$1/ns
	local -a IMAGE_ARCHIVES REGISTRY_HOSTS
	read -ra IMAGE_ARCHIVES <<<"$IMAGE_ARCHIVES_WORDS"
	read -ra REGISTRY_HOSTS <<<"$REGISTRY_HOSTS_WORDS"
	# /proc/self/mountinfo still lists the host's cgroup mounts; remember them before hiding them.
	local -a cgroup_mounts
	mapfile -t cgroup_mounts < <(awk '{ split($0, p, " - "); split(p[2], f, " ") }
		f[1] == "cgroup" || f[1] == "cgroup2" { print $5, f[1], f[3] }' /proc/self/mountinfo)
	local -A controllers
	local name
	while read -r name _; do controllers[$name]=1; done < <(tail -n +2 /proc/cgroups)

	mount -t tmpfs -o mode=755 knext-run /run
	mkdir -p "$ns" && mount -t tmpfs -o mode=700 knext-scratch "$ns"
	mkdir -p "$ns/root" "$ns/tmp" "$ns/cni-ipam" "$ns/nri-conf"
	export TMPDIR=$ns/tmp

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

	ip link set lo up
	printf '127.0.0.1 localhost %s\n::1 localhost\n' "${REGISTRY_HOSTS[*]}" >"$ns/hosts"
	mount --bind "$ns/hosts" /etc/hosts

	# CNI: the default network for the tests' pods, and the failpoint network upstream's
	# runc-fp runtime handler uses (script/test/utils.sh).
	mkdir -p "$work/net.d" "$work/net.d-fp"
	cat >"$work/net.d/10-knext-upstream.conflist" <<-JSON
		{"cniVersion": "1.0.0", "name": "knext-upstream",
		 "plugins": [{"type": "bridge", "bridge": "knup0", "isGateway": true,
		   "ipam": {"type": "host-local", "dataDir": "$ns/cni-ipam",
		            "ranges": [[{"subnet": "10.231.0.0/16"}]], "routes": [{"dst": "0.0.0.0/0"}]}}]}
	JSON
	cat >"$work/net.d-fp/10-knext-upstream-fp.conflist" <<-JSON
		{"cniVersion": "1.0.0", "name": "knext-upstream-fp",
		 "plugins": [{"type": "cni-bridge-fp", "bridge": "knupfp0", "isGateway": true,
		   "ipam": {"type": "host-local", "dataDir": "$ns/cni-ipam",
		            "ranges": [[{"subnet": "10.232.0.0/16"}]], "routes": [{"dst": "0.0.0.0/0"}]},
		   "capabilities": {"io.kubernetes.cri.pod-annotations": true}}]}
	JSON

	# The config of upstream's script/test/utils.sh, plus what this machine and CI need: the
	# sandbox image pinned to the local pause image (nothing is pulled), cgroupfs, and
	# restrict_oom_score_adj (no CAP_SYS_RESOURCE, so no negative oom_score_adj).
	cat >"$work/config.toml" <<-TOML
		version = 3
		[plugins.'io.containerd.cri.v1.images'.pinned_images]
		  sandbox = '$PAUSE_IMAGE'
		[plugins.'io.containerd.cri.v1.runtime']
		  drain_exec_sync_io_timeout = '10s'
		  restrict_oom_score_adj = true
		  [plugins.'io.containerd.cri.v1.runtime'.cni]
		    bin_dirs = ['/usr/lib/cni', '$bin']
		    conf_dir = '$work/net.d'
		  [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
		    runtime_type = 'io.containerd.runc.v2'
		    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
		      BinaryName = '/usr/local/bin/runc'
		      SystemdCgroup = false
		  [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc-fp]
		    runtime_type = 'runc-fp.v1'
		    cni_conf_dir = '$work/net.d-fp'
		    cni_max_conf_num = 1
		    pod_annotations = ['io.containerd.runtime.v2.shim.failpoint.*']
		[plugins.'io.containerd.nri.v1.nri']
		  disable = false
		  socket_path = '$NRI_SOCK'
		  plugin_path = '/no/pre-launched/nri/plugins'
		  plugin_config_path = '$ns/nri-conf'
		[plugins.'io.containerd.snapshotter.v1.overlayfs']
		  slow_chown = true
	TOML

	"$bin/ociregistry" -listen 127.0.0.1:443 -ca-file "$ns/registry-ca.pem" \
		-alias "$DEFAULT_SANDBOX_IMAGE=$PAUSE_IMAGE" "${IMAGE_ARCHIVES[@]}" >>"$CRI_LOG_DIR/registry.log" 2>&1 &
	wait_for "registry" 30 test -s "$ns/registry-ca.pem"
	# Go reads the roots it trusts from here: the tests' client pulls and containerd's pulls.
	export SSL_CERT_FILE=$ns/registry-ca.pem

	# The supervisor the restart tests expect: start containerd again whenever it dies.
	(
		while :; do
			"$KNEXT_CONTAINERD" --log-level debug --config "$work/config.toml" --address "$CTRD_SOCK" \
				--state "$CTRD_STATE" --root "$ns/root" >>"$CRI_LOG_DIR/containerd.log" 2>&1 || true
			sleep "$RESTART_WAIT_PERIOD"
		done
	) &
	wait_for "containerd" 60 ctr --address "$CTRD_SOCK" version
	wait_for "the NRI socket $NRI_SOCK" 30 test -S "$NRI_SOCK"
	local archive
	for archive in "${IMAGE_ARCHIVES[@]}"; do
		ctr --address "$CTRD_SOCK" -n k8s.io images import "$archive" >&2
	done

	# Upstream's image aliases (integration/images/image_list.go) the selected tests use.
	printf 'Pause = "%s"\nBusyBox = "%s"\n' "$PAUSE_IMAGE" "$BUSYBOX_IMAGE" >"$work/image-list.toml"

	# Tests that start a containerd of their own find the wrapper first (containerd-oom-wrapper.sh).
	mkdir -p "$work/wrap"
	ln -s "$(dirname "$self")/containerd-oom-wrapper.sh" "$work/wrap/containerd"
	log "running $TESTS"
	cd "$work"
	PATH=$work/wrap:$PATH go tool test2json -t -p cri-integration "$bin/cri-integration.test" \
		-test.run "$TESTS" -test.v=test2json -test.count=1 -test.timeout 15m \
		--cri-endpoint "unix://$CTRD_SOCK" --containerd-bin containerd --build-dir "$BUILD_DIR/bin" \
		--image-list "$work/image-list.toml"
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

# image_name ARCHIVE: the name an OCI archive's index gives its image.
image_name() {
	tar -xOf "$1" index.json | grep -o '"io.containerd.image.name":"[^"]*"' | head -1 | cut -d'"' -f4
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

if [ "${1:-}" = --inside ]; then
	inside "$2"
	exit
fi

# ---------------------------------------------------------------------------------------------
# On the host: build, set up the cgroup subtree, run inside the namespaces, clean up.
# ---------------------------------------------------------------------------------------------
require_root cri-integration-upstream.sh "it creates namespaces, mounts and cgroups"
for tool in go unshare strace pkill pidof ip tar /usr/local/bin/runc /usr/lib/cni/bridge /usr/lib/cni/host-local /usr/lib/cni/loopback; do
	command -v "$tool" >/dev/null || die "$tool is missing: run contrib/ci/install-deps.sh"
done
for binary in containerd containerd-shim-runc-v2 ctr; do
	[ -x "$BUILD_DIR/bin/$binary" ] || die "$BUILD_DIR/bin/$binary is missing: run 'make build'"
done

containerd_tree=$(tree_dir containerd)
mkdir -p "$CRI_LOG_DIR" && rm -f "$CRI_LOG_DIR"/*.log
work=$(mktemp -d "${TMPDIR:-/tmp}/knext-cri-integration.XXXXXX")
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

log "building the test binary and helpers into $bin"
(cd "$containerd_tree" &&
	go test -race -c -o "$bin/cri-integration.test" ./integration &&
	CGO_ENABLED=0 go build -o "$bin/" ./integration/failpoint/cmd/containerd-shim-runc-fp-v1 &&
	go build -o "$bin/" ./integration/failpoint/cmd/cni-bridge-fp) >&2
(cd "$KNEXT_ROOT" && go build -o "$bin/" ./contrib/ci/upstream/ociregistry) >&2
images_dir=${KNEXT_IMAGES_DIR:-}
if [ -z "$images_dir" ]; then
	images_dir=$work/images
	(cd "$KNEXT_ROOT" &&
		CGO_ENABLED=0 go build -o "$work/pause" ./contrib/images/pause &&
		go run ./contrib/images -pause-binary "$work/pause" -busybox /bin/busybox -out "$images_dir") >&2
fi
IMAGE_ARCHIVES=("$images_dir/pause.tar" "$images_dir/busybox.tar")
PAUSE_IMAGE=$(image_name "$images_dir/pause.tar")
BUSYBOX_IMAGE=$(image_name "$images_dir/busybox.tar")
if [ -z "$PAUSE_IMAGE" ] || [ -z "$BUSYBOX_IMAGE" ]; then
	die "no image names in $images_dir/{pause,busybox}.tar"
fi
# TestReload100Pods starts a containerd with an empty config, i.e. upstream's default sandbox image.
DEFAULT_SANDBOX_IMAGE=$("$BUILD_DIR/bin/containerd" config default | sed -n "s/^ *sandbox = '\(.*\)'$/\1/p")
[ -n "$DEFAULT_SANDBOX_IMAGE" ] || die "cannot read the default sandbox image from 'containerd config default'"
REGISTRY_HOSTS=()
for image in "$PAUSE_IMAGE" "$BUSYBOX_IMAGE" "$DEFAULT_SANDBOX_IMAGE"; do
	host=${image%%/*}
	[[ " ${REGISTRY_HOSTS[*]} " == *" $host "* ]] || REGISTRY_HOSTS+=("$host")
done

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

export KNEXT_CONTAINERD=$BUILD_DIR/bin/containerd
export RESTART_WAIT_PERIOD CTRD_STATE CTRD_SOCK NRI_SOCK TESTS CRI_LOG_DIR PAUSE_IMAGE BUSYBOX_IMAGE DEFAULT_SANDBOX_IMAGE
export PATH="$BUILD_DIR/bin:$bin:/usr/local/bin:$PATH"
# Arrays do not cross exec; the inner script gets them as words (none contains a space).
# --kill-child: if unshare dies, PID 1 of the namespace dies, and with it every process in it.
IMAGE_ARCHIVES_WORDS="${IMAGE_ARCHIVES[*]}" REGISTRY_HOSTS_WORDS="${REGISTRY_HOSTS[*]}" \
	unshare --kill-child=SIGKILL --cgroup --mount --net --pid --fork --mount-proc "$self" --inside "$work" &
ns_pid=$!
trap 'kill "$ns_pid" 2>/dev/null' INT TERM
status=0
wait "$ns_pid" || status=$?
# A signal ends the first wait early; this one returns once unshare is gone.
wait "$ns_pid" 2>/dev/null || true
trap - EXIT INT TERM
cleanup || status=1
exit $status
