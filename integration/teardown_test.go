package integration

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/moby/sys/mountinfo"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	criruntime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/knext-dev/knext/internal/ociimage"
	"github.com/knext-dev/knext/internal/stack"
)

// crashingOwnerEnv makes the test binary start a harness with a running container, print its
// footprint, and wait to be SIGKILLed: a test process that dies without Close.
const crashingOwnerEnv = "KNEXT_TEST_CRASHING_OWNER"

// footprint is what a harness instance leaves on the host while it runs.
type footprint struct {
	ID, Root, Address, Bridge, CgroupParent string
	PodID                                   string // a pod with a running container
}

// startFootprint runs a pod with a sleeping busybox container and returns what h now occupies.
func startFootprint(ctx context.Context, h *stack.Stack) (footprint, error) {
	f := footprint{ID: h.ID, Root: h.Root, Address: h.Address, Bridge: h.Bridge, CgroupParent: h.CgroupParent}
	podConfig := h.PodConfig("footprint")
	pod, err := h.Runtime.RunPodSandbox(ctx, &criruntime.RunPodSandboxRequest{Config: podConfig})
	if err != nil {
		return f, err
	}
	f.PodID = pod.PodSandboxId
	created, err := h.Runtime.CreateContainer(ctx, &criruntime.CreateContainerRequest{PodSandboxId: pod.PodSandboxId,
		Config: h.ContainerConfig("sleeper", ociimage.BusyboxImage, "sleep", "3600"), SandboxConfig: podConfig})
	if err != nil {
		return f, err
	}
	_, err = h.Runtime.StartContainer(ctx, &criruntime.StartContainerRequest{ContainerId: created.ContainerId})
	return f, err
}

func runCrashingOwner() int {
	ctx := context.Background()
	h, err := stack.New(ctx, stack.Options{})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	f, err := startFootprint(ctx, h)
	if err != nil {
		fmt.Fprintln(os.Stderr, withCloseError(err, h.Close()))
		return 1
	}
	if err := json.NewEncoder(os.Stdout).Encode(f); err != nil {
		return 1
	}
	select {} // until SIGKILL
}

func withCloseError(err, closeErr error) string {
	return fmt.Sprintf("%v (close: %v)", err, closeErr)
}

// holdSweeps takes the harness lease directory's lock, which every stack.New needs to sweep
// leases of dead owners, and returns its release (safe to call twice).
func holdSweeps(t *testing.T) func() {
	t.Helper()
	lock, err := os.OpenFile("/run/knext-harness/.lock", os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	return func() { once.Do(func() { lock.Close() }) }
}

// processesWithArg lists processes that have arg in their command line.
func processesWithArg(t *testing.T, arg string) []string {
	t.Helper()
	matches, err := filepath.Glob("/proc/[0-9]*/cmdline")
	if err != nil {
		t.Fatal(err)
	}
	var found []string
	for _, m := range matches {
		data, err := os.ReadFile(m)
		if err == nil && strings.Contains(string(data), "\x00"+arg+"\x00") {
			found = append(found, strings.ReplaceAll(strings.TrimRight(string(data), "\x00"), "\x00", " "))
		}
	}
	return found
}

// checkFootprint reports, for each kind of resource, whether it is present.
func checkFootprint(t *testing.T, f footprint) map[string]bool {
	t.Helper()
	mounts, err := mountinfo.GetMounts(mountinfo.PrefixFilter(f.Root))
	if err != nil {
		t.Fatal(err)
	}
	_, rootErr := os.Stat(f.Root)
	_, bridgeErr := netlink.LinkByName(f.Bridge)
	cgroupMounts, err := mountinfo.GetMounts(mountinfo.FSTypeFilter("cgroup", "cgroup2"))
	if err != nil {
		t.Fatal(err)
	}
	cgroups := 0
	for _, m := range cgroupMounts {
		if _, err := os.Stat(filepath.Join(m.Mountpoint, f.CgroupParent)); err == nil {
			cgroups++
		}
	}
	_, leaseErr := os.Stat(filepath.Join("/run/knext-harness", f.ID+".json"))
	// libcni caches one result per pod and network: the bridge's and containerd's loopback.
	cniCache, err := filepath.Glob("/var/lib/cni/results/*-" + f.PodID + "-*")
	if err != nil {
		t.Fatal(err)
	}
	return map[string]bool{
		"root directory":                      rootErr == nil,
		"mounts under the root":               len(mounts) > 0,
		"bridge":                              bridgeErr == nil,
		"containerd or shim processes":        len(processesWithArg(t, f.Address)) > 0,
		"cgroups of the pods":                 cgroups > 0,
		"lease file under /run/knext-harness": leaseErr == nil,
		"CNI cache entries of the pod":        len(cniCache) > 0,
	}
}

func assertFootprintGone(t *testing.T, f footprint) {
	t.Helper()
	for what, present := range checkFootprint(t, f) {
		if present {
			t.Errorf("harness %s: %s still present", f.ID, what)
		}
	}
	if procs := processesWithArg(t, f.Address); len(procs) > 0 {
		t.Errorf("harness %s: processes left: %v", f.ID, procs)
	}
}

func TestCloseRemovesEverything(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	h, err := stack.New(ctx, stack.Options{Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	f, err := startFootprint(ctx, h)
	if err != nil {
		t.Fatal(withCloseError(err, h.Close()))
	}
	for what, present := range checkFootprint(t, f) {
		if !present {
			t.Errorf("harness %s with a running container has no %s: the check below proves nothing", f.ID, what)
		}
	}
	if err := h.Close(); err != nil {
		t.Fatal(err)
	}
	assertFootprintGone(t, f)
}

// TestCrashedOwnerIsSweptByNextHarness kills a process that runs a harness with a container, and
// checks that the next harness to start removes what it left: shims, container processes,
// mounts, bridge, cgroups, root and lease.
func TestCrashedOwnerIsSweptByNextHarness(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	child := exec.CommandContext(ctx, os.Args[0])
	child.Env = append(os.Environ(), crashingOwnerEnv+"=1")
	child.Stderr = os.Stderr
	stdout, err := child.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	var f footprint
	decodeErr := json.NewDecoder(bufio.NewReader(stdout)).Decode(&f)
	// Until the checks below are done, no harness (of any test process) may sweep the lease.
	resumeSweeps := holdSweeps(t)
	defer resumeSweeps()
	if err := child.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = child.Wait()
	if decodeErr != nil {
		t.Fatalf("crashing owner printed no footprint: %v", decodeErr)
	}

	// containerd dies with its owner (Pdeathsig); shims, containers, mounts and the rest stay.
	deadline := time.Now().Add(10 * time.Second)
	for len(processesWithArg(t, filepath.Join(f.Root, "config.toml"))) > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("containerd of killed owner %s still runs: Pdeathsig did not fire", f.ID)
		}
		time.Sleep(50 * time.Millisecond)
	}
	for what, present := range checkFootprint(t, f) {
		if !present {
			t.Errorf("killed owner %s left no %s: the sweep below proves nothing", f.ID, what)
		}
	}
	resumeSweeps()

	h, err := stack.New(ctx, stack.Options{Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := h.Close(); err != nil {
			t.Error(err)
		}
	}()
	assertFootprintGone(t, f)
}

func TestNonEmptyRootIsRefusedAndKept(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	precious := filepath.Join(root, "precious")
	if err := os.WriteFile(precious, []byte("keep me"), 0o644); err != nil {
		t.Fatal(err)
	}
	h, err := stack.New(context.Background(), stack.Options{Root: root, Logf: t.Logf})
	if err == nil {
		h.Close()
		t.Fatalf("harness started in non-empty root %s", root)
	}
	if !strings.Contains(err.Error(), "not empty") {
		t.Errorf("error %q does not say the root is not empty", err)
	}
	if data, err := os.ReadFile(precious); err != nil || string(data) != "keep me" {
		t.Errorf("file in the refused root: %q, %v; want it untouched", data, err)
	}
}
