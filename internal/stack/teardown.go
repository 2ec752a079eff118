package stack

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/google/nftables"
	"github.com/moby/sys/mountinfo"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// cniCacheDir is libcni's cache, shared by every CNI user of the host; harness entries are those
// of its unique network name.
const cniCacheDir = "/var/lib/cni/results"

// teardown removes everything res names, whatever state the instance is in: processes (the
// daemon, its shims, the containers in its cgroup parent), mounts under the root, the bridge
// (and the nftables table of an nri-bridge on it), the cgroups, CNI cache entries, then the
// root. It is idempotent.
func teardown(res resources) error {
	var errs []error
	errs = append(errs, killInstanceProcesses(res))
	errs = append(errs, KillCgroupTree(res.CgroupParent))
	unmountErr := UnmountUnder(res.Root)
	errs = append(errs, unmountErr)
	errs = append(errs, DeleteLink(res.Bridge))
	errs = append(errs, deleteNRIBridgeTable(res.Bridge))
	errs = append(errs, RemoveCgroupTree(res.CgroupParent))
	errs = append(errs, removeCNICache(res.Network))
	// Never delete through a mount that is still there: it could reach outside the root.
	if unmountErr == nil {
		errs = append(errs, os.RemoveAll(res.Root))
	}
	return errors.Join(errs...)
}

// killInstanceProcesses SIGKILLs the instance's containerd (found by its unique config path),
// its shims (found by its unique socket address) and the shims' children (container init
// processes, also of pods outside the harness's cgroup parent), and waits for them to be gone.
func killInstanceProcesses(res resources) error {
	return killMatching(func(p process) bool {
		return hasArgPair(p.argv, "--config", res.ConfigPath) || hasArgPair(p.argv, "-address", res.Address)
	}, "processes of containerd "+res.Address)
}

// KillInMountNamespace SIGKILLs every process in the mount namespace bound at nsFile and their
// children, and waits for them to be gone. A node of a cluster is such a namespace: its shims
// name the node's own socket path, which no host path matches, but they stay in its namespace.
func KillInMountNamespace(nsFile string) error {
	in, err := inMountNamespace(nsFile)
	if err != nil || in == nil {
		return err
	}
	return killMatching(in, "processes in mount namespace "+nsFile)
}

// MountNamespaceProcesses returns the PIDs of the processes in the mount namespace bound at nsFile.
func MountNamespaceProcesses(nsFile string) ([]int, error) {
	in, err := inMountNamespace(nsFile)
	if err != nil || in == nil {
		return nil, err
	}
	procs, err := listProcesses()
	if err != nil {
		return nil, err
	}
	var pids []int
	for _, p := range procs {
		if in(p) {
			pids = append(pids, p.pid)
		}
	}
	return pids, nil
}

// inMountNamespace returns whether a process is in the mount namespace bound at nsFile; nil if
// there is no such file.
func inMountNamespace(nsFile string) (func(process) bool, error) {
	var ns unix.Stat_t
	if err := unix.Stat(nsFile, &ns); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil, nil
		}
		return nil, fmt.Errorf("mount namespace %s: %w", nsFile, err)
	}
	return func(p process) bool {
		var st unix.Stat_t
		err := unix.Stat(fmt.Sprintf("/proc/%d/ns/mnt", p.pid), &st)
		return err == nil && st.Dev == ns.Dev && st.Ino == ns.Ino
	}, nil
}

// killMatching SIGKILLs every process match accepts, and their children.
func killMatching(match func(process) bool, what string) error {
	procs, err := listProcesses()
	if err != nil {
		return err
	}
	matched := map[int]bool{}
	for _, p := range procs {
		if match(p) {
			matched[p.pid] = true
		}
	}
	var pids []int
	for _, p := range procs {
		if matched[p.pid] || matched[p.ppid] {
			pids = append(pids, p.pid)
		}
	}
	return killAndWait(pids, what)
}

type process struct {
	pid, ppid int
	argv      []string
}

// listProcesses returns the host's user-space processes, except this one.
func listProcesses() ([]process, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	var procs []process
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || len(cmdline) == 0 {
			continue // exited meanwhile, or a kernel thread
		}
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// "pid (comm) state ppid ...": comm may contain spaces and parentheses.
		fields := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
		if len(fields) < 2 {
			continue
		}
		ppid, _ := strconv.Atoi(fields[1])
		procs = append(procs, process{pid: pid, ppid: ppid,
			argv: strings.Split(strings.TrimSuffix(string(cmdline), "\x00"), "\x00")})
	}
	return procs, nil
}

func hasArgPair(argv []string, flag, value string) bool {
	for i, arg := range argv {
		if arg == flag+"="+value || (arg == flag && i+1 < len(argv) && argv[i+1] == value) {
			return true
		}
	}
	return false
}

// argValue returns the value of flag in argv ("-flag value" or "-flag=value"), "" without it.
func argValue(argv []string, flag string) string {
	for i, arg := range argv {
		if value, ok := strings.CutPrefix(arg, flag+"="); ok {
			return value
		}
		if arg == flag && i+1 < len(argv) {
			return argv[i+1]
		}
	}
	return ""
}

// killAndWait SIGKILLs pids and waits up to 10 s until none is alive (zombies of other parents
// count as gone: they hold no resources).
func killAndWait(pids []int, what string) error {
	for _, pid := range pids {
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil && err != syscall.ESRCH {
			return fmt.Errorf("kill %s (pid %d): %w", what, pid, err)
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for _, pid := range pids {
		for ProcessAlive(pid) {
			if time.Now().After(deadline) {
				return fmt.Errorf("%s: pid %d still alive 10s after SIGKILL", what, pid)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	return nil
}

// ProcessAlive reports whether pid runs (a zombie does not).
func ProcessAlive(pid int) bool {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// The state follows the parenthesized command name, which may itself contain spaces.
	if i := bytes.LastIndexByte(data, ')'); i >= 0 && i+2 < len(data) {
		return data[i+2] != 'Z' && data[i+2] != 'X'
	}
	return true
}

// cgroupDirs returns parent's directory in every mounted cgroup hierarchy (v1 controllers and the
// v2 unified tree of a hybrid host), existing or not.
func cgroupDirs(parent string) ([]string, error) {
	if parent == "" {
		return nil, nil
	}
	mounts, err := mountinfo.GetMounts(mountinfo.FSTypeFilter("cgroup", "cgroup2"))
	if err != nil {
		return nil, err
	}
	var dirs []string
	for _, m := range mounts {
		dirs = append(dirs, filepath.Join(m.Mountpoint, parent))
	}
	return dirs, nil
}

// cgroupTree lists dir and its descendants, parents first.
func cgroupTree(dir string) []string {
	var tree []string
	_ = filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			tree = append(tree, path)
		}
		return nil
	})
	return tree
}

// KillCgroupTree kills every process left in the cgroup parent and below, in every hierarchy:
// containers whose shim is gone keep running otherwise.
func KillCgroupTree(parent string) error {
	dirs, err := cgroupDirs(parent)
	if err != nil {
		return err
	}
	for _, dir := range dirs {
		for _, cg := range cgroupTree(dir) {
			// A frozen (paused) container cannot die; thawing is a no-op elsewhere.
			if state := filepath.Join(cg, "freezer.state"); fileExists(state) {
				_ = os.WriteFile(state, []byte("THAWED"), 0)
			}
		}
	}
	pids, err := CgroupProcesses(parent)
	if err != nil {
		return err
	}
	return killAndWait(pids, "processes in cgroup "+parent)
}

// CgroupProcesses lists the processes in parent's cgroups and their descendants, in every
// hierarchy, each once.
func CgroupProcesses(parent string) ([]int, error) {
	dirs, err := cgroupDirs(parent)
	if err != nil {
		return nil, err
	}
	seen := map[int]bool{}
	var pids []int
	for _, dir := range dirs {
		for _, cg := range cgroupTree(dir) {
			data, err := os.ReadFile(filepath.Join(cg, "cgroup.procs"))
			if err != nil {
				continue
			}
			for field := range strings.FieldsSeq(string(data)) {
				if pid, err := strconv.Atoi(field); err == nil && !seen[pid] {
					seen[pid] = true
					pids = append(pids, pid)
				}
			}
		}
	}
	return pids, nil
}

// PodProcesses returns the PIDs of the processes in the cgroup parent of the instance's pods
// (pause and container processes, dead ones that are not yet reaped included).
func (h *Stack) PodProcesses() ([]int, error) {
	return CgroupProcesses(h.CgroupParent)
}

// Shims returns the ID (-id) each running shim of the instance was started for: a pod
// sandbox's ID for the shim of its pod.
func (h *Stack) Shims() ([]string, error) {
	procs, err := listProcesses()
	if err != nil {
		return nil, err
	}
	var ids []string
	for _, p := range procs {
		if hasArgPair(p.argv, "-address", h.Address) && ProcessAlive(p.pid) {
			ids = append(ids, argValue(p.argv, "-id"))
		}
	}
	return ids, nil
}

// RemoveCgroupTree removes parent's cgroups in every hierarchy, children first.
func RemoveCgroupTree(parent string) error {
	dirs, err := cgroupDirs(parent)
	if err != nil {
		return err
	}
	var errs []error
	for _, dir := range dirs {
		tree := cgroupTree(dir)
		for _, t := range slices.Backward(tree) {
			// The kernel may need a moment to release a cgroup whose last task just died.
			var err error
			for range 50 {
				if err = unix.Rmdir(t); err != unix.EBUSY {
					break
				}
				time.Sleep(20 * time.Millisecond)
			}
			if err != nil && err != unix.ENOENT {
				errs = append(errs, fmt.Errorf("remove cgroup %s: %w", t, err))
			}
		}
	}
	return errors.Join(errs...)
}

// UnmountUnder detaches every mount at or below root (netns bind mounts, container rootfs, shm),
// deepest first, until none is left.
func UnmountUnder(root string) error {
	if root == "" {
		return nil
	}
	for range 10 {
		mounts, err := mountinfo.GetMounts(mountinfo.PrefixFilter(root))
		if err != nil {
			return err
		}
		if len(mounts) == 0 {
			return nil
		}
		sort.Slice(mounts, func(i, j int) bool { return len(mounts[i].Mountpoint) > len(mounts[j].Mountpoint) })
		for _, m := range mounts {
			if err := unix.Unmount(m.Mountpoint, unix.MNT_DETACH); err != nil && err != unix.EINVAL && err != unix.ENOENT {
				return fmt.Errorf("unmount %s: %w", m.Mountpoint, err)
			}
		}
	}
	return fmt.Errorf("mounts under %s keep reappearing", root)
}

// DeleteLink deletes the host's interface name, if there is one.
func DeleteLink(name string) error {
	if name == "" {
		return nil
	}
	link, err := netlink.LinkByName(name)
	if err != nil {
		if _, notFound := err.(netlink.LinkNotFoundError); notFound {
			return nil
		}
		return fmt.Errorf("find interface %s: %w", name, err)
	}
	if err := netlink.LinkDel(link); err != nil {
		return fmt.Errorf("delete interface %s: %w", name, err)
	}
	return nil
}

// deleteNRIBridgeTable deletes the nftables table that an nri-bridge on the instance's bridge
// keeps for hostPorts and masquerade (internal/nribridge/firewall names it nri-bridge-<bridge>).
func deleteNRIBridgeTable(bridge string) error {
	if bridge == "" {
		return nil
	}
	conn, err := nftables.New()
	if err != nil {
		return err
	}
	table := &nftables.Table{Name: "nri-bridge-" + bridge, Family: nftables.TableFamilyINet}
	conn.AddTable(table) // the deletion cannot fail on a missing table
	conn.DelTable(table)
	if err := conn.Flush(); err != nil {
		return fmt.Errorf("delete nftables table inet %s: %w", table.Name, err)
	}
	return nil
}

// removeCNICache removes libcni's cached results of the instance's network and of the loopback
// network containerd adds to each of those pods ("<network>-<sandbox>-<ifname>" and
// "cni-loopback-<sandbox>-lo"). Pods torn down through CRI leave none; killed ones do.
func removeCNICache(network string) error {
	if network == "" {
		return nil
	}
	entries, err := filepath.Glob(filepath.Join(cniCacheDir, network+"-*"))
	if err != nil {
		return err
	}
	var errs []error
	for _, entry := range entries {
		sandbox := strings.TrimPrefix(filepath.Base(entry), network+"-")
		if i := strings.LastIndexByte(sandbox, '-'); i > 0 {
			loopback := filepath.Join(cniCacheDir, "cni-loopback-"+sandbox[:i]+"-lo")
			if err := os.Remove(loopback); err != nil && !os.IsNotExist(err) {
				errs = append(errs, err)
			}
		}
		errs = append(errs, os.Remove(entry))
	}
	return errors.Join(errs...)
}

func fileExists(name string) bool {
	_, err := os.Stat(name)
	return err == nil
}
