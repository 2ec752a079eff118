// Package kubelethost holds what a kubelet needs of a machine it shares with others: the kernel
// settings it insists on, the KubeletConfiguration that keeps it off the host's resources, and
// its cgroup root in every hierarchy. The cluster runner and the tests' kubelet both start
// kubelets this way.
package kubelethost

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/moby/sys/mountinfo"
)

// KernelDefaults are the sysctls the kubelet insists on (k8s.io/component-helpers/node/util/sysctl),
// as files in its mount namespace. Names are /proc/sys paths with dots for slashes.
var KernelDefaults = map[string]int{
	"vm.overcommit_memory":      1,
	"vm.panic_on_oom":           0,
	"kernel.panic":              10,
	"kernel.panic_on_oops":      1,
	"kernel.keys.root_maxkeys":  1000000,
	"kernel.keys.root_maxbytes": 25000000,
}

// HostSettings are the KubeletConfiguration settings of a kubelet that shares this kind of
// machine: cgroupfs like containerd here, no iptables chains of its own, its OOM score left alone
// (no CAP_SYS_RESOURCE), the sysctls of KernelDefaults checked rather than written, and no
// eviction on a busy disk.
func HostSettings() map[string]any {
	return map[string]any{
		"cgroupDriver":           "cgroupfs",
		"failCgroupV1":           false,
		"failSwapOn":             false,
		"makeIPTablesUtilChains": false,
		"oomScoreAdj":            0,
		"protectKernelDefaults":  true,
		"evictionHard": map[string]string{
			"memory.available":  "1Mi",
			"nodefs.available":  "1%",
			"nodefs.inodesFree": "1%",
			"imagefs.available": "1%",
		},
		// Locally imported images cannot be pulled again: never collect them.
		"imageGCHighThresholdPercent": 100,
		"imageGCLowThresholdPercent":  99,
	}
}

// CreateCgroup creates cgroup (e.g. /knext-<id>/kubelet) and its parents in every mounted
// cgroup hierarchy: the kubelet requires its cgroup root to exist in all of them. A new cpuset
// cgroup has no CPUs and memory nodes until they are copied from its parent.
func CreateCgroup(cgroup string) error {
	mounts, err := mountinfo.GetMounts(mountinfo.FSTypeFilter("cgroup", "cgroup2"))
	if err != nil {
		return err
	}
	for _, m := range mounts {
		dir := m.Mountpoint
		for part := range strings.SplitSeq(strings.Trim(cgroup, "/"), "/") {
			parent := dir
			dir = filepath.Join(dir, part)
			if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
				return fmt.Errorf("create cgroup %s: %w", dir, err)
			}
			if !strings.Contains(m.VFSOptions, "cpuset") {
				continue
			}
			for _, file := range []string{"cpuset.cpus", "cpuset.mems"} {
				value, err := os.ReadFile(filepath.Join(parent, file))
				if err != nil {
					return err
				}
				if err := os.WriteFile(filepath.Join(dir, file), value, 0o644); err != nil {
					return fmt.Errorf("cgroup %s: copy %s from its parent: %w", dir, file, err)
				}
			}
		}
	}
	return nil
}
