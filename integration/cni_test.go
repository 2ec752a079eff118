package integration

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
	criruntime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/knext-dev/knext/internal/ociimage"
	"github.com/knext-dev/knext/internal/stack"
)

// allocationFile is where host-local records that ip is allocated.
func allocationFile(h *stack.Stack, ip string) string {
	return filepath.Join(h.IPAMDataDir, h.Network, ip)
}

// bridgePorts counts the interfaces attached to the instance's bridge (one veth per live pod).
func bridgePorts(t *testing.T, h *stack.Stack) int {
	t.Helper()
	ports, err := h.BridgePorts()
	if err != nil {
		t.Fatal(err)
	}
	return len(ports)
}

func TestPodGetsCNIIP(t *testing.T) {
	t.Parallel()
	h, ctx := startHarness(t, stack.Options{})
	id := runPod(t, ctx, h, h.PodConfig("cni-ip"))

	status := podStatus(t, ctx, h, id)
	ip := status.GetNetwork().GetIp()
	if parsed := net.ParseIP(ip); parsed == nil || !h.Subnet.Contains(parsed) {
		t.Fatalf("pod %s: CRI reports IP %q, want an address of the CNI subnet %s", id, ip, h.Subnet)
	}
	if extra := status.GetNetwork().GetAdditionalIps(); len(extra) != 0 {
		t.Errorf("pod %s: additional IPs %v on a single-stack IPv4 network", id, extra)
	}

	shown := crictlInspectp(t, ctx, h, id)
	if shown.Status.Network == nil || shown.Status.Network.IP != ip {
		t.Errorf("crictl inspectp %s shows network %+v, want ip %s", id, shown.Status.Network, ip)
	}
	if shown.Status.State != "SANDBOX_READY" {
		t.Errorf("crictl inspectp %s shows state %q, want SANDBOX_READY", id, shown.Status.State)
	}

	owner, err := os.ReadFile(allocationFile(h, ip))
	if err != nil {
		t.Fatalf("host-local has no allocation for %s: %v", ip, err)
	}
	if !strings.HasPrefix(string(owner), id) {
		t.Errorf("host-local allocation %s belongs to %q, want pod %s", ip, owner, id)
	}
}

func TestContainerExec(t *testing.T) {
	t.Parallel()
	h, ctx := startHarness(t, stack.Options{})
	podConfig := h.PodConfig("exec")
	podID := runPod(t, ctx, h, podConfig)
	podIP := podStatus(t, ctx, h, podID).GetNetwork().GetIp()

	created, err := h.Runtime.CreateContainer(ctx, &criruntime.CreateContainerRequest{
		PodSandboxId:  podID,
		Config:        h.ContainerConfig("sleeper", ociimage.BusyboxImage, "sleep", "3600"),
		SandboxConfig: podConfig,
	})
	if err != nil {
		t.Fatalf("create container in pod %s: %v", podID, err)
	}
	id := created.ContainerId
	if _, err := h.Runtime.StartContainer(ctx, &criruntime.StartContainerRequest{ContainerId: id}); err != nil {
		t.Fatalf("start container %s: %v", id, err)
	}
	status, err := h.Runtime.ContainerStatus(ctx, &criruntime.ContainerStatusRequest{ContainerId: id})
	if err != nil {
		t.Fatal(err)
	}
	if state := status.GetStatus().GetState(); state != criruntime.ContainerState_CONTAINER_RUNNING {
		t.Fatalf("container %s is %s after start, want running", id, state)
	}

	// Over CRI: the container shares the pod's network namespace and sees the pod's IP on eth0.
	exec, err := h.Runtime.ExecSync(ctx, &criruntime.ExecSyncRequest{
		ContainerId: id, Cmd: []string{"sh", "-c", "echo hello from $(hostname); ip -4 -o addr show eth0"}, Timeout: 30,
	})
	if err != nil {
		t.Fatalf("exec in container %s: %v", id, err)
	}
	if exec.ExitCode != 0 {
		t.Fatalf("exec in container %s exited %d: %s", id, exec.ExitCode, exec.Stderr)
	}
	out := string(exec.Stdout)
	if !strings.Contains(out, "hello from exec\n") || !strings.Contains(out, " "+podIP+"/24 ") {
		t.Errorf("exec in container %s printed %q, want the pod hostname exec and eth0 with %s/24", id, out, podIP)
	}

	// With crictl: stdout and the exit code come through.
	crictlOut, err := h.Crictl(ctx, "exec", id, "sh", "-c", "echo via crictl")
	if err != nil {
		t.Fatal(err)
	}
	if string(crictlOut) != "via crictl\n" {
		t.Errorf("crictl exec printed %q, want %q", crictlOut, "via crictl\n")
	}
	if _, err := h.Crictl(ctx, "exec", id, "sh", "-c", "exit 3"); err == nil || !strings.Contains(err.Error(), "exit code 3") {
		t.Errorf("crictl exec of `exit 3` gave error %v, want one reporting exit code 3", err)
	}
}

func TestHostNetworkPodHasNoIP(t *testing.T) {
	t.Parallel()
	h, ctx := startHarness(t, stack.Options{})
	id := runPod(t, ctx, h, h.HostNetworkPodConfig("host-net"))

	network := podStatus(t, ctx, h, id).GetNetwork()
	if network.GetIp() != "" || len(network.GetAdditionalIps()) != 0 {
		t.Errorf("host-network pod %s reports IP %q, additional %v; want none", id, network.GetIp(), network.GetAdditionalIps())
	}
	shown := crictlInspectp(t, ctx, h, id)
	if shown.Status.Network != nil && (shown.Status.Network.IP != "" || len(shown.Status.Network.AdditionalIPs) != 0) {
		t.Errorf("crictl inspectp %s shows network %+v for a host-network pod, want no IP", id, shown.Status.Network)
	}
	// CNI creates the bridge on its first ADD: none may have run.
	if _, err := netlink.LinkByName(h.Bridge); err == nil {
		t.Errorf("bridge %s exists although the only pod uses the host network", h.Bridge)
	}
	entries, err := os.ReadDir(filepath.Join(h.IPAMDataDir, h.Network))
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	for _, e := range entries {
		if net.ParseIP(e.Name()) != nil {
			t.Errorf("host-local allocated %s although the only pod uses the host network", e.Name())
		}
	}
}

func TestStopAndRemoveReleaseIP(t *testing.T) {
	t.Parallel()
	h, ctx := startHarness(t, stack.Options{})
	id := runPod(t, ctx, h, h.PodConfig("release"))
	ip := podStatus(t, ctx, h, id).GetNetwork().GetIp()
	if _, err := os.Stat(allocationFile(h, ip)); err != nil {
		t.Fatalf("pod %s: no host-local allocation for its IP %q: %v", id, ip, err)
	}
	if ports := bridgePorts(t, h); ports != 1 {
		t.Fatalf("bridge %s has %d ports with one pod, want 1", h.Bridge, ports)
	}

	if _, err := h.Runtime.StopPodSandbox(ctx, &criruntime.StopPodSandboxRequest{PodSandboxId: id}); err != nil {
		t.Fatalf("stop pod %s: %v", id, err)
	}
	if _, err := os.Stat(allocationFile(h, ip)); !os.IsNotExist(err) {
		t.Errorf("stopped pod %s: allocation file of %s still there (err %v)", id, ip, err)
	}
	if ports := bridgePorts(t, h); ports != 0 {
		t.Errorf("stopped pod %s: bridge %s still has %d ports", id, h.Bridge, ports)
	}
	if state := podStatus(t, ctx, h, id).GetState(); state != criruntime.PodSandboxState_SANDBOX_NOTREADY {
		t.Errorf("stopped pod %s is %s, want NOTREADY", id, state)
	}

	if _, err := h.Runtime.RemovePodSandbox(ctx, &criruntime.RemovePodSandboxRequest{PodSandboxId: id}); err != nil {
		t.Fatalf("remove pod %s: %v", id, err)
	}
	if _, err := h.Runtime.PodSandboxStatus(ctx, &criruntime.PodSandboxStatusRequest{PodSandboxId: id}); err == nil {
		t.Errorf("removed pod %s still has a status", id)
	}
	entries, err := os.ReadDir(filepath.Join(h.IPAMDataDir, h.Network))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if net.ParseIP(e.Name()) != nil {
			t.Errorf("removed pod %s: host-local still holds %s", id, e.Name())
		}
	}

	// The network keeps working after the release: a new pod gets an address.
	next := runPod(t, ctx, h, h.PodConfig("after-release"))
	if nextIP := podStatus(t, ctx, h, next).GetNetwork().GetIp(); net.ParseIP(nextIP) == nil {
		t.Errorf("pod %s after the release got IP %q", next, nextIP)
	}
}

func TestRestartKeepsPodAndIP(t *testing.T) {
	t.Parallel()
	h, ctx := startHarness(t, stack.Options{})
	id := runPod(t, ctx, h, h.PodConfig("restart"))
	ip := podStatus(t, ctx, h, id).GetNetwork().GetIp()
	before := h.PID()

	if err := h.Restart(ctx); err != nil {
		t.Fatalf("restart: %v", err)
	}
	if after := h.PID(); after == before || after == 0 {
		t.Fatalf("containerd pid %d before restart, %d after: no new process", before, after)
	}
	status := podStatus(t, ctx, h, id)
	if status.GetState() != criruntime.PodSandboxState_SANDBOX_READY || status.GetNetwork().GetIp() != ip {
		t.Errorf("after restart pod %s is %s with IP %q, want READY with %s", id, status.GetState(), status.GetNetwork().GetIp(), ip)
	}
}
