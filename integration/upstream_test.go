package integration

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	criruntime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/knext-dev/knext/internal/stack"
)

// Pristine upstream containerd 2.4.2 (make upstream) runs NRI v0.12.3, which does not know
// PodSandboxStatus and announces no supported events at Configure: knext's stub leaves the event
// out of a plugin's subscription, and the plugin works with every other event.

// secondaryBridge is nri-bridge as a secondary network (interface net1) next to the harness's
// CNI network, on a bridge and subnets of its own.
type secondaryBridge struct {
	bridge, ipv4, ipv6 string
	args               []string // the configuration flags; -cleanup takes the same
	process            *stack.Process
}

// startSecondaryBridge starts nri-bridge with interface net1 on h's NRI socket and waits until
// NRI has synchronized it. Its subnets derive from the harness's /24 (10.240.0.0/12), so that
// concurrent harnesses never share them: 10.176.0.0/12 and fd6b:6e79::/32.
func startSecondaryBridge(t *testing.T, ctx context.Context, h *stack.Stack) *secondaryBridge {
	t.Helper()
	octets := h.Subnet.IP.To4()
	b := &secondaryBridge{
		bridge: "knb" + h.ID,
		ipv4:   fmt.Sprintf("10.%d.%d.0/24", 176+int(octets[1])-240, octets[2]),
		ipv6:   fmt.Sprintf("fd6b:6e79:%d:%d::/64", octets[1], octets[2]),
	}
	b.args = []string{"-bridge", b.bridge, "-state-dir", h.NRIBridgeStateDir(),
		"-ipv4-subnet", b.ipv4, "-ipv6-subnet", b.ipv6, "-interface", "net1"}
	// The bridge is the test's own: remove it even if the test fails before -cleanup does.
	t.Cleanup(func() {
		if link, err := netlink.LinkByName(b.bridge); err == nil {
			if err := netlink.LinkDel(link); err != nil {
				t.Errorf("deleting bridge %s: %v", b.bridge, err)
			}
		}
	})
	connected := nriConnections(t, h, nriBridgeName)
	var err error
	b.process, err = h.StartProcess("nri-bridge", nriBridgePath(t), append([]string{"-nri-socket", h.NRISocket}, b.args...)...)
	if err != nil {
		t.Fatal(err)
	}
	waitSynchronized(t, ctx, h, b.process, nriBridgeName, connected)
	return b
}

// logLines returns the lines of the file at path that contain every one of parts.
func logLines(t *testing.T, path string, parts ...string) []string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	for line := range strings.SplitSeq(string(data), "\n") {
		if !slices.ContainsFunc(parts, func(part string) bool { return !strings.Contains(line, part) }) {
			lines = append(lines, line)
		}
	}
	return lines
}

// bridgePortCount counts the veths attached to bridge.
func bridgePortCount(t *testing.T, bridge string) int {
	t.Helper()
	ports, err := stack.BridgePorts(bridge)
	if err != nil {
		t.Fatal(err)
	}
	return len(ports)
}

// defaultRouteDevs returns the interfaces of the default routes the container sees, per family
// flag ("-4", "-6").
func defaultRouteDevs(t *testing.T, ctx context.Context, h *stack.Stack, container, family string) []string {
	t.Helper()
	var devs []string
	for line := range strings.SplitSeq(execIn(t, ctx, h, container, "ip", family, "route", "show", "default"), "\n") {
		fields := strings.Fields(line)
		if i := slices.Index(fields, "dev"); i >= 0 && i+1 < len(fields) {
			devs = append(devs, fields[i+1])
		}
	}
	return devs
}

// nri-bridge built with knext's stub on pristine upstream containerd, as a secondary network on
// net1 next to CNI's eth0: it registers (it subscribes to no event upstream lacks), wires every
// pod, tears the pods down and releases their addresses; CRI shows CNI's IP alone.
func TestUpstreamContainerdRunsNRIBridgeNextToCNI(t *testing.T) {
	t.Parallel()
	h, ctx := startHarness(t, stack.Options{Containerd: upstreamContainerd(t)})
	wantUpstream(t, ctx, h, true)
	b := startSecondaryBridge(t, ctx, h)

	// Registered once, no refusal in containerd's log.
	registration := logLines(t, h.LogPath, nriBridgeName)
	for _, want := range []string{"registered as", "connected and synchronized"} {
		if got := slices.DeleteFunc(slices.Clone(registration), func(line string) bool { return !strings.Contains(line, want) }); len(got) != 1 {
			t.Errorf("containerd logged that %s %s %d times, want once: %v", nriBridgeName, want, len(got), registration)
		}
	}
	if refused := logLines(t, h.LogPath, "invalid plugin events"); len(refused) != 0 {
		t.Errorf("containerd refused a plugin: %v", refused)
	}
	for _, line := range append(logLines(t, b.process.LogPath, "level=warn"), registration...) {
		t.Logf("seen: %s", line)
	}

	// Both pods have CNI's eth0 (its IP, its default route) and nri-bridge's net1 with the
	// addresses nri-bridge allocated, and reach each other over net1.
	pods := []bridgePod{}
	for _, name := range []string{"a", "b"} {
		config := h.PodConfig(name)
		id := runPod(t, ctx, h, config)
		pods = append(pods, bridgePod{id: id, config: config, container: runContainer(t, ctx, h, id, config, "sleeper")})
	}
	net1 := map[string][]string{}
	for _, pod := range pods {
		cniIP := cniIPOf(t, h, pod.id)
		if got := netnsAddrs(t, ctx, h, pod.container, "eth0"); !slices.Equal(got, []string{cniIP}) {
			t.Errorf("pod %s: eth0 has %v, want CNI's %s", pod.id, got, cniIP)
		}
		addrs := netnsAddrs(t, ctx, h, pod.container, "net1")
		if len(addrs) != 2 {
			t.Fatalf("pod %s: net1 has %v, want an IPv4 and an IPv6 address", pod.id, addrs)
		}
		slices.SortFunc(addrs, func(x, y string) int { return netip.MustParseAddr(x).Compare(netip.MustParseAddr(y)) })
		inSubnet(t, addrs[0], b.ipv4)
		inSubnet(t, addrs[1], b.ipv6)
		net1[pod.id] = addrs
		wired := fmt.Sprintf("(sandbox %s): net1 [%s/24 %s/64] via ", pod.id, addrs[0], addrs[1])
		if got := logLines(t, b.process.LogPath, wired); len(got) != 1 {
			t.Errorf("nri-bridge did not log that it wired pod %s with the addresses of its net1 (%q)\n%s", pod.id, wired, processLog(b.process))
		}
		for _, family := range []string{"-4", "-6"} {
			if devs := defaultRouteDevs(t, ctx, h, pod.container, family); slices.Contains(devs, "net1") || (family == "-4" && !slices.Equal(devs, []string{"eth0"})) {
				t.Errorf("pod %s: ip %s default routes through %v, want eth0's alone", pod.id, family, devs)
			}
		}

		// Upstream never asks PodSandboxStatus: the kubelet and crictl see CNI's IP alone.
		if got := statusIPs(podStatus(t, ctx, h, pod.id)); !slices.Equal(got, []string{cniIP}) {
			t.Errorf("pod %s reports IPs %v, want CNI's %s alone", pod.id, got, cniIP)
		}
		shown := crictlInspectp(t, ctx, h, pod.id)
		if shown.Status.Network == nil || shown.Status.Network.IP != cniIP || len(shown.Status.Network.AdditionalIPs) != 0 || len(shown.PodNetwork.IPs) != 0 {
			t.Errorf("crictl inspectp %s shows network %+v, podNetwork %+v; want CNI's %s alone", pod.id, shown.Status.Network, shown.PodNetwork, cniIP)
		}
	}
	a, other := pods[0], pods[1]
	if slices.Equal(net1[a.id], net1[other.id]) {
		t.Fatalf("pods %s and %s share the addresses %v", a.id, other.id, net1[a.id])
	}
	for _, ip := range net1[other.id] {
		execIn(t, ctx, h, a.container, "ping", "-c", "1", "-W", "5", ip)
	}

	// Stop tears the pod's net1 down, stop and remove release its addresses.
	if ports := bridgePortCount(t, b.bridge); ports != 2 {
		t.Errorf("bridge %s has %d ports with two pods", b.bridge, ports)
	}
	if _, err := h.Runtime.StopPodSandbox(ctx, &criruntime.StopPodSandboxRequest{PodSandboxId: a.id}); err != nil {
		t.Fatal(err)
	}
	if ports := bridgePortCount(t, b.bridge); ports != 1 {
		t.Errorf("bridge %s has %d ports after pod %s stopped, want 1", b.bridge, ports, a.id)
	}
	for _, pod := range pods {
		if err := h.RemovePod(ctx, pod.id); err != nil {
			t.Fatal(err)
		}
		released := fmt.Sprintf("(sandbox %s): released [%s/24 %s/64]", pod.id, net1[pod.id][0], net1[pod.id][1])
		if got := logLines(t, b.process.LogPath, released); len(got) != 1 {
			t.Errorf("nri-bridge logged %q %d times, want once", released, len(got))
		}
	}
	if ports := bridgePortCount(t, b.bridge); ports != 0 {
		t.Errorf("bridge %s has %d ports after the pods were removed", b.bridge, ports)
	}
	// Proof from the store itself: -cleanup names every allocation left (there is none), then
	// removes the bridge.
	if err := b.process.Stop(); err != nil {
		t.Fatal(err)
	}
	out, err := exec.CommandContext(ctx, nriBridgePath(t), append([]string{"-cleanup"}, b.args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("nri-bridge -cleanup: %v\n%s", err, out)
	}
	if strings.Contains(string(out), "removed nbr") || !strings.Contains(string(out), "removed bridge "+b.bridge) {
		t.Errorf("nri-bridge -cleanup after the pods were removed:\n%s\nwant no allocation left, and the bridge removed", out)
	}
	t.Logf("nri-bridge -cleanup:\n%s%s", out, processLog(b.process))
}

// Without CNI, upstream containerd cannot start a pod, whatever an NRI plugin would do: it has no
// disable_cni, and RunPodSandbox fails before any NRI hook runs. nri-bridge cannot be the pod
// network there.
func TestUpstreamContainerdWithoutCNIStartsNoPod(t *testing.T) {
	t.Parallel()
	emptyConfDir := t.TempDir()
	h, ctx := startHarness(t, stack.Options{Containerd: upstreamContainerd(t), SkipNetworkReadyWait: true,
		ExtraConfig: fmt.Sprintf("[plugins.'io.containerd.cri.v1.runtime'.cni]\nconf_dir = %q\n", emptyConfDir)})
	wantUpstream(t, ctx, h, true)
	connected := nriConnections(t, h, nriBridgeName)
	bridge, err := h.StartProcess(stack.NRIBridgeProcess, nriBridgePath(t), h.NRIBridgeArgs("-ipv4-subnet", ipv4Subnet(h))...)
	if err != nil {
		t.Fatal(err)
	}
	waitSynchronized(t, ctx, h, bridge, nriBridgeName, connected)

	// The kubelet would start no pod: NetworkReady follows CNI alone.
	cond := networkCondition(t, ctx, h)
	t.Logf("NetworkReady %v, reason %q, message %q", cond.Status, cond.Reason, cond.Message)
	if cond.Status || cond.Reason != "NetworkPluginNotReady" || !strings.Contains(cond.Message, "cni plugin not initialized") {
		t.Errorf("upstream without CNI config: NetworkReady %v, reason %q, message %q; want false, NetworkPluginNotReady, cni plugin not initialized",
			cond.Status, cond.Reason, cond.Message)
	}
	_, err = h.Runtime.RunPodSandbox(ctx, &criruntime.RunPodSandboxRequest{Config: h.PodConfig("no-cni")})
	t.Logf("RunPodSandbox: %v", err)
	if err == nil || !strings.Contains(err.Error(), "failed to setup network for sandbox") || !strings.Contains(err.Error(), "cni plugin not initialized") {
		t.Fatalf("RunPodSandbox on upstream without CNI config: %v, want failed to setup network for sandbox ...: cni plugin not initialized", err)
	}
	// nri-bridge never saw the pod: its bridge, created for the first pod it wires, is absent.
	if ports, err := h.BridgePorts(); err == nil {
		t.Errorf("bridge %s exists (ports %v): a pod reached nri-bridge", h.Bridge, ports)
	}
	if wired := logLines(t, bridge.LogPath, "via nbr"); len(wired) != 0 {
		t.Errorf("nri-bridge wired a pod: %v", wired)
	}
}

// On pristine upstream containerd, a plugin built with knext's stub that reports IPs in its
// RunPodSandbox answer registers and gets the pod's events; the answer is ignored there: CRI shows
// CNI's IP alone. A plugin subscribed to PodSandboxStatus, an event upstream's NRI does not know,
// is refused at registration, naming the event mask.
func TestUpstreamContainerdIgnoresRunPodSandboxAnswers(t *testing.T) {
	t.Parallel()
	h, ctx := startHarness(t, stack.Options{Containerd: upstreamContainerd(t)})
	wantUpstream(t, ctx, h, true)
	reporter := startRunReporter(t, ctx, h, "10", "reporter")
	status, err := h.StartProcess("plugin-20-status", testPluginPath(t),
		"-socket", h.NRISocket, "-name", "status", "-idx", "20", "-dir", t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	waitLogLine(t, h, "invalid plugin events")
	deadline := time.Now().Add(30 * time.Second)
	for exited, _ := status.Exited(); !exited; exited, _ = status.Exited() {
		if time.Now().After(deadline) {
			t.Fatalf("the status plugin still runs 30s after upstream containerd refused it: %s", processLog(status))
		}
		time.Sleep(50 * time.Millisecond)
	}

	id := runPod(t, ctx, h, annotatedPodConfig(h, "ignored", map[string]string{
		runIPsAnnotation("reporter"): "10.99.0.7", annotationIP: "10.99.0.8",
	}))
	cniIP := cniIPOf(t, h, id)
	if got := statusIPs(podStatus(t, ctx, h, id)); !slices.Equal(got, []string{cniIP}) {
		t.Errorf("pod %s reports IPs %v on upstream containerd, want CNI's %s alone", id, got, cniIP)
	}
	if events := reporter.events(t, id); len(events) != 1 || events[0].Event != "RunPodSandbox" {
		t.Errorf("the reporter got %+v for pod %s, want its RunPodSandbox", events, id)
	}
}
