package integration

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	criruntime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/knext-dev/knext/internal/stack"
)

// nriBridgeName is nri-bridge's NRI name with its default -idx and -name.
const nriBridgeName = "10-" + stack.NRIBridgePlugin

// cniDisabled is the daemon configuration of a CNI-less node without network_plugin: NetworkReady
// follows any plugin subscribed to PodSandboxStatus.
var cniDisabled = stack.CNILessConfig("")

// cniLessBridge is the daemon configuration of a CNI-less node whose pod network is nri-bridge:
// NetworkReady follows it (it reports pods' IPs at RunPodSandbox only, which is no subscription
// to PodSandboxStatus).
var cniLessBridge = stack.CNILessConfig(stack.NRIBridgePlugin)

// nriAtRunPodSandbox is how verbose status shows an IP a plugin reported in its RunPodSandbox
// answer, as nri-bridge does.
const nriAtRunPodSandbox = "run-pod-sandbox"

// cniPluginNames are the CNI plugins the harness's network uses.
var cniPluginNames = []string{"bridge", "host-local", "loopback"}

var nriBridgeBinary, podIPObserverBinary onceBuild

func nriBridgePath(t *testing.T) string {
	return nriBridgeBinary.get(t, func(dir string) (string, error) {
		path := filepath.Join(dir, "nri-bridge")
		_, err := goCommand(nil, "build", "-o", path, "github.com/knext-dev/knext/cmd/nri-bridge")
		return path, err
	})
}

func podIPObserverPath(t *testing.T) string {
	return podIPObserverBinary.get(t, func(dir string) (string, error) {
		path := filepath.Join(dir, "podipobserver")
		_, err := goCommand(nil, "build", "-o", path, "github.com/knext-dev/knext/test/plugins/podipobserver")
		return path, err
	})
}

// recordingCNIBinDir returns a CNI bin dir whose plugins append "<plugin> <CNI_COMMAND>" to the
// returned log, then run the real plugin of /usr/lib/cni: proof of every CNI invocation.
func recordingCNIBinDir(t *testing.T) (dir, invocations string) {
	t.Helper()
	dir = t.TempDir()
	invocations = filepath.Join(dir, "invocations")
	for _, name := range cniPluginNames {
		script := fmt.Sprintf("#!/bin/sh\necho \"%s $CNI_COMMAND\" >> %s\nexec /usr/lib/cni/%s \"$@\"\n", name, invocations, name)
		if err := os.WriteFile(filepath.Join(dir, name), []byte(script), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return dir, invocations
}

// cniInvocations returns the recorded CNI invocations.
func cniInvocations(t *testing.T, invocations string) []string {
	t.Helper()
	data, err := os.ReadFile(invocations)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return strings.Split(strings.TrimSpace(string(data)), "\n")
}

// cniLessNode is a harness with CNI disabled, the CNI invocations recorded, and nri-bridge.
type cniLessNode struct {
	h           *stack.Stack
	ctx         context.Context
	invocations string
	bridgeArgs  []string
	bridge      *stack.Process // nil while not started
}

// subnets of a node's nri-bridge: the harness's own /24 (no CNI bridge uses it without CNI) and
// an IPv6 /64 derived from it.
func ipv4Subnet(h *stack.Stack) string { return h.Subnet.String() }

func ipv6Subnet(h *stack.Stack) string { return h.NRIBridgeIPv6Subnet() }

// startCNILessNode starts a CNI-less containerd whose network nri-bridge provides; subnets gives
// nri-bridge's subnet flags (e.g. "-ipv4-subnet", ipv4Subnet(h)) once the harness exists.
// nri-bridge is not started.
func startCNILessNode(t *testing.T, subnets func(h *stack.Stack) []string) *cniLessNode {
	t.Helper()
	return startCNILessNodeFollowing(t, stack.NRIBridgePlugin, subnets)
}

// startCNILessNodeFollowing is startCNILessNode with network_plugin = networkPlugin (none if "").
func startCNILessNodeFollowing(t *testing.T, networkPlugin string, subnets func(h *stack.Stack) []string) *cniLessNode {
	t.Helper()
	return startCNILessNodeWith(t, stack.Options{ExtraConfig: stack.CNILessConfig(networkPlugin)}, subnets)
}

// startCNILessNodeWith is startCNILessNode with opts for the harness (ExtraConfig holds the
// CNI-less configuration).
func startCNILessNodeWith(t *testing.T, opts stack.Options, subnets func(h *stack.Stack) []string) *cniLessNode {
	t.Helper()
	binDir, invocations := recordingCNIBinDir(t)
	opts.SkipNetworkReadyWait, opts.CNIBinDir = true, binDir
	h, ctx := startHarness(t, opts)
	n := &cniLessNode{h: h, ctx: ctx, invocations: invocations, bridgeArgs: h.NRIBridgeArgs(subnets(h)...)}
	t.Cleanup(func() {
		if calls := cniInvocations(t, invocations); len(calls) > 0 {
			t.Errorf("CNI plugins ran with disable_cni = true: %v", calls)
		}
	})
	return n
}

func dualStack(h *stack.Stack) []string {
	return []string{"-ipv4-subnet", ipv4Subnet(h), "-ipv6-subnet", ipv6Subnet(h)}
}

// startBridge starts nri-bridge and waits until it provides the network (NetworkReady).
func (n *cniLessNode) startBridge(t *testing.T) {
	t.Helper()
	p, err := n.h.StartNRIBridge(n.ctx, nriBridgePath(t), n.bridgeArgs...)
	n.bridge = p
	if err != nil {
		t.Fatal(err)
	}
}

// killBridge SIGKILLs nri-bridge, as a crash would, and waits until the network is not ready.
func (n *cniLessNode) killBridge(t *testing.T) {
	t.Helper()
	if err := n.bridge.Kill(); err != nil {
		t.Fatal(err)
	}
	n.bridge = nil
	n.waitNetworkReady(t, false)
}

func (n *cniLessNode) bridgeLog() string {
	data, err := os.ReadFile(filepath.Join(n.h.Root, stack.NRIBridgeProcess+".log"))
	if err != nil {
		return fmt.Sprintf("(no nri-bridge log: %v)", err)
	}
	return "nri-bridge log:\n" + string(data)
}

// networkCondition returns the NetworkReady condition of CRI Status.
func networkCondition(t *testing.T, ctx context.Context, h *stack.Stack) *criruntime.RuntimeCondition {
	t.Helper()
	cond, err := h.NetworkCondition(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return cond
}

// waitNetworkReady waits for NetworkReady to become want.
func (n *cniLessNode) waitNetworkReady(t *testing.T, want bool) {
	t.Helper()
	if err := n.h.WaitNetworkReady(n.ctx, want, stack.NetworkReadyTimeout); err != nil {
		t.Fatalf("%v\n%s", err, n.bridgeLog())
	}
}

// execIn runs cmd in container id and returns its standard output; it fails the test unless cmd
// exits 0.
func execIn(t *testing.T, ctx context.Context, h *stack.Stack, id string, cmd ...string) string {
	t.Helper()
	resp, err := h.Runtime.ExecSync(ctx, &criruntime.ExecSyncRequest{ContainerId: id, Cmd: cmd, Timeout: 30})
	if err != nil {
		t.Fatalf("exec %v in container %s: %v", cmd, id, err)
	}
	if resp.ExitCode != 0 {
		t.Fatalf("exec %v in container %s exited %d: %s%s", cmd, id, resp.ExitCode, resp.Stdout, resp.Stderr)
	}
	return string(resp.Stdout)
}

// netnsAddrs returns the global addresses of interface dev as the pod's container sees them.
func netnsAddrs(t *testing.T, ctx context.Context, h *stack.Stack, containerID, dev string) []string {
	t.Helper()
	var addrs []string
	for line := range strings.SplitSeq(execIn(t, ctx, h, containerID, "ip", "-o", "addr", "show", "dev", dev), "\n") {
		fields := strings.Fields(line)
		for i, f := range fields {
			if (f == "inet" || f == "inet6") && i+1 < len(fields) && strings.Contains(line, "scope global") {
				prefix, err := netip.ParsePrefix(fields[i+1])
				if err != nil {
					t.Fatalf("container %s: %s address %q: %v", containerID, dev, fields[i+1], err)
				}
				addrs = append(addrs, prefix.Addr().String())
			}
		}
	}
	return addrs
}

// bridgePod is a pod on nri-bridge's network with a sleeping busybox container.
type bridgePod struct {
	id, container string
	config        *criruntime.PodSandboxConfig
}

func (n *cniLessNode) runBridgePod(t *testing.T, name string) bridgePod {
	t.Helper()
	config := n.h.PodConfig(name)
	id := runPod(t, n.ctx, n.h, config)
	return bridgePod{id: id, config: config, container: runContainer(t, n.ctx, n.h, id, config, "sleeper")}
}

// wantBridgeIPs checks that pod reports exactly ips (primary first) from live nri-bridge answers,
// that `crictl inspectp` shows them with that source, and that eth0 of the pod has them.
func (n *cniLessNode) wantBridgeIPs(t *testing.T, pod bridgePod, nriState string, ips ...string) {
	t.Helper()
	status, network := verbosePodStatus(t, n.ctx, n.h, pod.id)
	want := make([]reportedIP, 0, len(ips))
	for _, ip := range ips {
		want = append(want, reportedIP{IP: ip, Source: "nri:" + nriBridgeName, NRI: nriState})
	}
	wantIPs(t, pod.id, status, network, want...)
	if got := netnsAddrs(t, n.ctx, n.h, pod.container, "eth0"); !slices.Equal(sortedCopy(got), sortedCopy(ips)) {
		t.Errorf("pod %s: eth0 has %v, CRI reports %v", pod.id, got, ips)
	}
}

func sortedCopy(s []string) []string {
	return slices.Sorted(slices.Values(s))
}

// inspectpPodNetwork returns the podNetwork info that `crictl inspectp` shows.
func inspectpPodNetwork(t *testing.T, ctx context.Context, h *stack.Stack, id string) podNetworkInfo {
	t.Helper()
	out := crictlInspectpOutput(t, ctx, h, id)
	var shown struct {
		PodNetwork *podNetworkInfo `json:"podNetwork"`
	}
	if err := json.Unmarshal(out, &shown); err != nil {
		t.Fatalf("crictl inspectp %s: %v\n%s", id, err, out)
	}
	if shown.PodNetwork == nil {
		t.Fatalf("crictl inspectp %s shows no %q:\n%s", id, podNetworkInfoKey, out)
	}
	return *shown.PodNetwork
}

// inSubnet checks that ip is an address of subnet.
func inSubnet(t *testing.T, ip, subnet string) {
	t.Helper()
	addr, err := netip.ParseAddr(ip)
	if err != nil || !netip.MustParsePrefix(subnet).Contains(addr) {
		t.Errorf("IP %q is not an address of %s", ip, subnet)
	}
}

func TestCNILessPodsNetworkedByNRIBridge(t *testing.T) {
	t.Parallel()
	n := startCNILessNode(t, func(h *stack.Stack) []string { return []string{"-ipv4-subnet", ipv4Subnet(h)} })
	n.startBridge(t)
	gateway := netip.MustParsePrefix(ipv4Subnet(n.h)).Addr().Next().String()

	a, b := n.runBridgePod(t, "a"), n.runBridgePod(t, "b")
	ipA := podStatus(t, n.ctx, n.h, a.id).GetNetwork().GetIp()
	ipB := podStatus(t, n.ctx, n.h, b.id).GetNetwork().GetIp()
	inSubnet(t, ipA, ipv4Subnet(n.h))
	inSubnet(t, ipB, ipv4Subnet(n.h))
	if ipA == ipB || ipA == gateway || ipB == gateway {
		t.Fatalf("pods got %s and %s, gateway %s: want distinct addresses", ipA, ipB, gateway)
	}
	n.wantBridgeIPs(t, a, nriAtRunPodSandbox, ipA)
	n.wantBridgeIPs(t, b, nriAtRunPodSandbox, ipB)

	for _, pod := range []bridgePod{a, b} {
		shown := crictlInspectp(t, n.ctx, n.h, pod.id)
		info := inspectpPodNetwork(t, n.ctx, n.h, pod.id)
		if shown.Status.Network == nil || len(info.IPs) != 1 || info.IPs[0].IP != shown.Status.Network.IP ||
			info.IPs[0].Source != "nri:"+nriBridgeName {
			t.Errorf("crictl inspectp %s shows network %+v with provenance %+v, want its IP from nri:%s", pod.id, shown.Status.Network, info.IPs, nriBridgeName)
		}
	}

	execIn(t, n.ctx, n.h, a.container, "ping", "-c", "1", "-W", "5", ipB)
	execIn(t, n.ctx, n.h, b.container, "ping", "-c", "1", "-W", "5", ipA)
	execIn(t, n.ctx, n.h, a.container, "ping", "-c", "1", "-W", "5", gateway)
	routes := execIn(t, n.ctx, n.h, a.container, "ip", "route")
	if !strings.Contains(routes, "default via "+gateway) {
		t.Errorf("pod %s routes %q: want the default route via %s", a.id, routes, gateway)
	}
	lo := execIn(t, n.ctx, n.h, a.container, "ip", "-o", "link", "show", "lo")
	if !strings.Contains(lo, "UP") {
		t.Errorf("pod %s: lo is not up: %q", a.id, lo)
	}
	// startCNILessNode's cleanup checks that no CNI plugin ran, here and at the pods' removal.
}

func TestCNILessNetworkReadyFollowsThePlugin(t *testing.T) {
	t.Parallel()
	n := startCNILessNode(t, func(h *stack.Stack) []string { return []string{"-ipv4-subnet", ipv4Subnet(h)} })

	before := networkCondition(t, n.ctx, n.h)
	if before.Status || before.Reason != "NRINetworkPluginNotReady" || !strings.Contains(before.Message, `"bridge" (network_plugin)`) {
		t.Errorf("before nri-bridge connects: NetworkReady %v, reason %q, message %q; want false, NRINetworkPluginNotReady, naming network_plugin \"bridge\"",
			before.Status, before.Reason, before.Message)
	}
	n.startBridge(t)
	if after := networkCondition(t, n.ctx, n.h); after.Reason != "" || after.Message != "" {
		t.Errorf("with nri-bridge connected: reason %q, message %q; want none", after.Reason, after.Message)
	}

	if err := n.bridge.Stop(); err != nil {
		t.Fatal(err)
	}
	n.waitNetworkReady(t, false)
	if gone := networkCondition(t, n.ctx, n.h); gone.Reason != "NRINetworkPluginNotReady" {
		t.Errorf("after nri-bridge went: reason %q, want NRINetworkPluginNotReady", gone.Reason)
	}
	n.startBridge(t) // and back
}

func TestCNILessNRIDisabledIsNeverNetworkReady(t *testing.T) {
	t.Parallel()
	binDir, _ := recordingCNIBinDir(t)
	h, ctx := startHarness(t, stack.Options{SkipNetworkReadyWait: true, CNIBinDir: binDir,
		ExtraConfig: cniDisabled + "[plugins.'io.containerd.nri.v1.nri']\ndisable = true\n"})
	cond := networkCondition(t, ctx, h)
	if cond.Status || cond.Reason != "NRINetworkPluginNotReady" || !strings.Contains(cond.Message, "NRI is disabled") {
		t.Errorf("with CNI and NRI disabled: NetworkReady %v, reason %q, message %q; want false, NRINetworkPluginNotReady, saying NRI is disabled",
			cond.Status, cond.Reason, cond.Message)
	}
}

func TestCNILessRestartsKeepAllocations(t *testing.T) {
	t.Parallel()
	n := startCNILessNode(t, dualStack)
	n.startBridge(t)
	a, b := n.runBridgePod(t, "a"), n.runBridgePod(t, "b")
	ipsA := statusIPs(podStatus(t, n.ctx, n.h, a.id))
	ipsB := statusIPs(podStatus(t, n.ctx, n.h, b.id))

	// Plugin crash: the last known answers stand in, then the restarted plugin answers the same.
	n.killBridge(t)
	n.wantBridgeIPs(t, a, nriAtRunPodSandbox, ipsA...)
	n.startBridge(t)
	n.wantBridgeIPs(t, a, nriAtRunPodSandbox, ipsA...)
	n.wantBridgeIPs(t, b, nriAtRunPodSandbox, ipsB...)

	// containerd restart: the standalone plugin reconnects and still owns the same addresses.
	before := n.h.PID()
	if err := n.h.Restart(n.ctx); err != nil {
		t.Fatalf("restart containerd: %v", err)
	}
	if after := n.h.PID(); after == before || after == 0 {
		t.Fatalf("containerd pid %d before restart, %d after", before, after)
	}
	n.waitNetworkReady(t, true)
	n.wantBridgeIPs(t, a, nriAtRunPodSandbox, ipsA...)
	n.wantBridgeIPs(t, b, nriAtRunPodSandbox, ipsB...)
	execIn(t, n.ctx, n.h, a.container, "ping", "-c", "1", "-W", "5", ipsB[0])

	// The kept allocations are not handed out again.
	c := n.runBridgePod(t, "c")
	for _, ip := range statusIPs(podStatus(t, n.ctx, n.h, c.id)) {
		if slices.Contains(ipsA, ip) || slices.Contains(ipsB, ip) {
			t.Errorf("new pod %s got %s, which pods %s %v and %s %v still hold", c.id, ip, a.id, ipsA, b.id, ipsB)
		}
	}

	// A pod started before the restart goes with its network namespace: the restarted
	// containerd finds the namespace in the pod's persisted record.
	netns := podNetNSPath(t, n.ctx, n.h, a.id)
	if err := n.h.RemovePod(n.ctx, a.id); err != nil {
		t.Fatalf("remove pod %s after the restart: %v", a.id, err)
	}
	if _, err := os.Stat(netns); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("pod %s removed after the restart: its network namespace %s is left (stat: %v)", a.id, netns, err)
	}
}

// netnsCount counts containerd's network namespace mounts.
func netnsCount(t *testing.T, h *stack.Stack) int {
	t.Helper()
	mounts, err := filepath.Glob(filepath.Join(h.Root, "state", "*", "netns", "*"))
	if err != nil {
		t.Fatal(err)
	}
	return len(mounts)
}

func TestCNILessReleaseReuseAndExhaustion(t *testing.T) {
	t.Parallel()
	// A /30 holds one pod address: network, gateway and broadcast are never handed out.
	var pool string
	n := startCNILessNode(t, func(h *stack.Stack) []string {
		pool = netip.PrefixFrom(netip.MustParsePrefix(ipv4Subnet(h)).Addr(), 30).String()
		return []string{"-ipv4-subnet", pool}
	})
	n.startBridge(t)
	only := netip.MustParsePrefix(pool).Addr().Next().Next().String()

	first := runPod(t, n.ctx, n.h, n.h.PodConfig("first"))
	if ip := podStatus(t, n.ctx, n.h, first).GetNetwork().GetIp(); ip != only {
		t.Fatalf("pod %s got %q, want the pool's only address %s", first, ip, only)
	}
	portsBefore, netnsBefore := bridgePorts(t, n.h), netnsCount(t, n.h)

	_, err := n.h.Runtime.RunPodSandbox(n.ctx, &criruntime.RunPodSandboxRequest{Config: n.h.PodConfig("too-many")})
	if err == nil || !strings.Contains(err.Error(), "no free IPv4 address in "+pool) {
		t.Fatalf("second pod on a /30: error %v, want one saying no free IPv4 address in %s", err, pool)
	}
	pods, err := n.h.Runtime.ListPodSandbox(n.ctx, &criruntime.ListPodSandboxRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(pods.Items) != 1 {
		t.Errorf("after the failed pod start %d pods are listed, want 1: %v", len(pods.Items), pods.Items)
	}
	if ports, netns := bridgePorts(t, n.h), netnsCount(t, n.h); ports != portsBefore || netns != netnsBefore {
		t.Errorf("the failed pod start left bridge ports %d (before %d), network namespaces %d (before %d)", ports, portsBefore, netns, netnsBefore)
	}

	// Stop releases the address (and the veth); the next pod gets it.
	if _, err := n.h.Runtime.StopPodSandbox(n.ctx, &criruntime.StopPodSandboxRequest{PodSandboxId: first}); err != nil {
		t.Fatal(err)
	}
	if ports := bridgePorts(t, n.h); ports != 0 {
		t.Errorf("stopped pod %s: bridge %s still has %d ports", first, n.h.Bridge, ports)
	}
	second := runPod(t, n.ctx, n.h, n.h.PodConfig("second"))
	if ip := podStatus(t, n.ctx, n.h, second).GetNetwork().GetIp(); ip != only {
		t.Errorf("pod %s after the stop got %q, want the released %s", second, ip, only)
	}
	if _, err := n.h.Runtime.RemovePodSandbox(n.ctx, &criruntime.RemovePodSandboxRequest{PodSandboxId: first}); err != nil {
		t.Fatalf("remove stopped pod %s: %v", first, err)
	}

	// Remove (stop included) releases it too.
	if err := n.h.RemovePod(n.ctx, second); err != nil {
		t.Fatal(err)
	}
	third := runPod(t, n.ctx, n.h, n.h.PodConfig("third"))
	if ip := podStatus(t, n.ctx, n.h, third).GetNetwork().GetIp(); ip != only {
		t.Errorf("pod %s after the removal got %q, want the released %s", third, ip, only)
	}
	if netns := netnsCount(t, n.h); netns != 1 {
		t.Errorf("%d network namespaces with one pod", netns)
	}
}

func TestCNILessDualStackAndIPv6Only(t *testing.T) {
	t.Parallel()
	t.Run("dual-stack", func(t *testing.T) {
		t.Parallel()
		n := startCNILessNode(t, dualStack)
		n.startBridge(t)
		a, b := n.runBridgePod(t, "a"), n.runBridgePod(t, "b")
		ipsA, ipsB := statusIPs(podStatus(t, n.ctx, n.h, a.id)), statusIPs(podStatus(t, n.ctx, n.h, b.id))
		for pod, ips := range map[string][]string{a.id: ipsA, b.id: ipsB} {
			if len(ips) != 2 {
				t.Fatalf("dual-stack pod %s reports %v, want an IPv4 and an IPv6 address", pod, ips)
			}
			inSubnet(t, ips[0], ipv4Subnet(n.h))
			inSubnet(t, ips[1], ipv6Subnet(n.h))
		}
		n.wantBridgeIPs(t, a, nriAtRunPodSandbox, ipsA...)
		execIn(t, n.ctx, n.h, a.container, "ping", "-c", "1", "-W", "5", ipsB[0])
		execIn(t, n.ctx, n.h, a.container, "ping", "-c", "1", "-W", "5", ipsB[1])
	})
	t.Run("IPv6-only", func(t *testing.T) {
		t.Parallel()
		n := startCNILessNode(t, func(h *stack.Stack) []string { return []string{"-ipv6-subnet", ipv6Subnet(h)} })
		n.startBridge(t)
		a, b := n.runBridgePod(t, "a"), n.runBridgePod(t, "b")
		ipsA, ipsB := statusIPs(podStatus(t, n.ctx, n.h, a.id)), statusIPs(podStatus(t, n.ctx, n.h, b.id))
		if len(ipsA) != 1 || len(ipsB) != 1 {
			t.Fatalf("IPv6-only pods report %v and %v, want one IPv6 address each", ipsA, ipsB)
		}
		inSubnet(t, ipsA[0], ipv6Subnet(n.h))
		n.wantBridgeIPs(t, a, nriAtRunPodSandbox, ipsA...)
		gateway := netip.MustParsePrefix(ipv6Subnet(n.h)).Addr().Next().String()
		execIn(t, n.ctx, n.h, a.container, "ping", "-c", "1", "-W", "5", ipsB[0])
		execIn(t, n.ctx, n.h, a.container, "ping", "-c", "1", "-W", "5", gateway)
	})
}

func TestCNILessHostNetworkPodUnaffected(t *testing.T) {
	t.Parallel()
	n := startCNILessNode(t, func(h *stack.Stack) []string { return []string{"-ipv4-subnet", ipv4Subnet(h)} })
	n.startBridge(t)
	config := n.h.HostNetworkPodConfig("host-net")
	id := runPod(t, n.ctx, n.h, config)
	network := podStatus(t, n.ctx, n.h, id).GetNetwork()
	if network.GetIp() != "" || len(network.GetAdditionalIps()) != 0 {
		t.Errorf("host-network pod %s reports IP %q, additional %v; want none", id, network.GetIp(), network.GetAdditionalIps())
	}
	// nri-bridge creates its bridge for the first pod it wires: none here.
	if ports, err := n.h.BridgePorts(); err == nil {
		t.Errorf("nri-bridge created bridge %s (ports %v) for a host-network pod", n.h.Bridge, ports)
	}
	// The container is in the host's network namespace.
	container := runContainer(t, n.ctx, n.h, id, config, "sleeper")
	hostNetNS, err := os.Readlink("/proc/self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	if netNS := strings.TrimSpace(execIn(t, n.ctx, n.h, container, "readlink", "/proc/self/ns/net")); netNS != hostNetNS {
		t.Errorf("host-network container is in network namespace %s, the host in %s", netNS, hostNetNS)
	}
}

// With CNI enabled (the default), pods still get their network from CNI alone: the recording
// wrappers prove the CNI plugins run (and that the proof used above works), and nri-bridge's
// absence changes nothing, verbose status included (no NRI provenance without NRI plugins).
func TestCNIEnabledUnchanged(t *testing.T) {
	t.Parallel()
	binDir, invocations := recordingCNIBinDir(t)
	h, ctx := startHarness(t, stack.Options{CNIBinDir: binDir})
	if cond := networkCondition(t, ctx, h); !cond.Status {
		t.Errorf("with CNI: NetworkReady false (%s: %s)", cond.Reason, cond.Message)
	}
	id := runPod(t, ctx, h, h.PodConfig("cni"))
	resp, err := h.Runtime.PodSandboxStatus(ctx, &criruntime.PodSandboxStatusRequest{PodSandboxId: id, Verbose: true})
	if err != nil {
		t.Fatal(err)
	}
	ip := resp.Status.GetNetwork().GetIp()
	if parsed := net.ParseIP(ip); parsed == nil || !h.Subnet.Contains(parsed) {
		t.Fatalf("pod %s reports %q, want an address of the CNI subnet %s", id, ip, h.Subnet)
	}
	if ips := statusIPs(resp.Status); len(ips) != 1 || ips[0] != cniIPOf(t, h, id) {
		t.Errorf("pod %s reports IPs %v, want only the one host-local allocated", id, ips)
	}
	wantNoPodNetworkInfo(t, id, resp.Info)
	if err := h.RemovePod(ctx, id); err != nil {
		t.Fatal(err)
	}
	calls := cniInvocations(t, invocations)
	for _, want := range []string{"bridge ADD", "bridge DEL", "loopback ADD"} {
		if !slices.Contains(calls, want) {
			t.Errorf("CNI invocations %v lack %q", calls, want)
		}
	}
}

// observedPodIPs is one record of the podipobserver plugin.
type observedPodIPs struct {
	Event    string   `json:"event"`
	Pod      string   `json:"pod"`
	IPs      []string `json:"ips"`
	NetNS    string   `json:"netns"`
	NetNSIPs []string `json:"netnsIPs"`
	Error    string   `json:"error"`
}

func readObservations(t *testing.T, path string) []observedPodIPs {
	t.Helper()
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var records []observedPodIPs
	scanner := bufio.NewScanner(f)
	for scanner.Scan() {
		var r observedPodIPs
		if err := json.Unmarshal(scanner.Bytes(), &r); err != nil {
			t.Fatalf("podipobserver record %q: %v", scanner.Text(), err)
		}
		records = append(records, r)
	}
	return records
}

// waitObserved waits until the observer recorded event for pod, and returns that record.
func waitObserved(t *testing.T, path, event, pod string) observedPodIPs {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		for _, r := range readObservations(t, path) {
			if r.Event == event && r.Pod == pod {
				return r
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("podipobserver recorded no %s for pod %s after 30s: %+v", event, pod, readObservations(t, path))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Every NRI plugin sees a pod's IPs in every pod event, whatever its index, as upstream's
// TestNriPluginNetworking* check with CNI. Without CNI, the network plugin (nri-bridge, 10-bridge)
// handles RunPodSandbox before every other plugin, so plugins at 00, 10 and 99 see the IPs it
// reported, as they see CNI's with CNI; what they are shown is what the pod's netns has. After a
// plugin restarts, Synchronize shows them; after the netns is gone (RemovePodSandbox), the IPs
// the pod had are still shown, as upstream does.
func TestNRIPluginsSeePodIPsWhateverTheirIndex(t *testing.T) {
	t.Parallel()
	for _, cniLess := range []bool{true, false} {
		t.Run(map[bool]string{true: "CNI-less", false: "CNI"}[cniLess], func(t *testing.T) {
			t.Parallel()
			var (
				h   *stack.Stack
				ctx context.Context
				run func(name string) string
			)
			if cniLess {
				n := startCNILessNode(t, dualStack)
				n.startBridge(t)
				h, ctx = n.h, n.ctx
				run = func(name string) string { return n.runBridgePod(t, name).id }
			} else {
				h, ctx = startHarness(t, stack.Options{})
				run = func(name string) string { return runPod(t, ctx, h, h.PodConfig(name)) }
			}
			ipsOf := func(id string) []string { return statusIPs(podStatus(t, ctx, h, id)) }
			synced := run("synced")

			observers := []struct{ idx, name, out string }{{idx: "00", name: "early"}, {idx: "10", name: "peer"}, {idx: "99", name: "late"}}
			start := func(i int) *stack.Process {
				return startSynchronizedPlugin(t, ctx, h, observers[i].idx, observers[i].name, podIPObserverPath(t), "-out", observers[i].out)
			}
			var first *stack.Process
			for i := range observers {
				observers[i].out = filepath.Join(h.Root, "observed-"+observers[i].idx+".jsonl")
				if p := start(i); i == 0 {
					first = p
				}
			}
			wantSeen := func(event, pod string, ips []string) {
				t.Helper()
				for _, o := range observers {
					r := waitObserved(t, o.out, event, pod)
					if r.Error != "" {
						t.Fatalf("plugin %s-%s: %s of pod %s: %s", o.idx, o.name, r.Event, r.Pod, r.Error)
					}
					if !slices.Equal(sortedCopy(r.IPs), sortedCopy(ips)) {
						t.Errorf("plugin %s-%s: %s of pod %s shows IPs %v, want %v", o.idx, o.name, event, pod, r.IPs, ips)
					}
					if r.NetNS != "" && !slices.Equal(sortedCopy(r.NetNSIPs), sortedCopy(r.IPs)) {
						t.Errorf("plugin %s-%s: %s of pod %s: its netns %s has %v, NRI shows %v", o.idx, o.name, event, pod, r.NetNS, r.NetNSIPs, r.IPs)
					}
				}
			}
			wantSeen("Synchronize", synced, ipsOf(synced))

			pod := run("lifecycle")
			ips := ipsOf(pod)
			if want := map[bool]int{true: 2, false: 1}[cniLess]; len(ips) != want {
				t.Fatalf("pod %s reports %v, want %d IPs", pod, ips, want)
			}
			wantSeen("RunPodSandbox", pod, ips)

			// The first plugin, restarted, is shown the running pods' IPs again.
			if err := first.Kill(); err != nil {
				t.Fatal(err)
			}
			if err := os.Remove(observers[0].out); err != nil {
				t.Fatal(err)
			}
			start(0)
			if r := waitObserved(t, observers[0].out, "Synchronize", pod); !slices.Equal(sortedCopy(r.IPs), sortedCopy(ips)) {
				t.Errorf("plugin 00-early, restarted: Synchronize of pod %s shows IPs %v, want %v", pod, r.IPs, ips)
			}

			if err := h.RemovePod(ctx, pod); err != nil {
				t.Fatal(err)
			}
			wantSeen("StopPodSandbox", pod, ips)
			wantSeen("RemovePodSandbox", pod, ips)
		})
	}
}

// containerd asks the plugins once right after their RunPodSandbox hooks: the pod's first CRI
// container events (created, started) carry its IPs, and the answer is its last known answer
// before any status query.
func TestCNILessFirstContainerEventsCarryPodIPs(t *testing.T) {
	t.Parallel()
	n := startCNILessNode(t, dualStack)
	n.startBridge(t)
	streamCtx, cancel := context.WithCancel(n.ctx)
	defer cancel()
	events, err := n.h.Runtime.GetContainerEvents(streamCtx, &criruntime.GetEventsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	id := runPod(t, n.ctx, n.h, n.h.PodConfig("events"))

	seen := map[criruntime.ContainerEventType][]string{}
	for len(seen) < 2 {
		event, err := events.Recv()
		if err != nil {
			t.Fatalf("container events after %v: %v", seen, err)
		}
		if event.ContainerId == id {
			seen[event.ContainerEventType] = statusIPs(event.PodSandboxStatus)
		}
	}
	// No status query was made yet: the events show what containerd learned at RunPodSandbox.
	ips := statusIPs(podStatus(t, n.ctx, n.h, id))
	for _, kind := range []criruntime.ContainerEventType{criruntime.ContainerEventType_CONTAINER_CREATED_EVENT, criruntime.ContainerEventType_CONTAINER_STARTED_EVENT} {
		if got := seen[kind]; len(ips) != 2 || !slices.Equal(got, ips) {
			t.Errorf("%s of pod %s carries IPs %v, its status reports %v", kind, id, got, ips)
		}
	}
}

// preinstallBridge installs nri-bridge (dual-stack) in NRI's plugin_path with its drop-in
// configuration, and restarts containerd, which starts it; it returns once the network is ready.
func (n *cniLessNode) preinstallBridge(t *testing.T) {
	t.Helper()
	config := fmt.Sprintf("bridge: %s\nstateDir: %s\nipv4:\n  subnet: %s\nipv6:\n  subnet: %s\n",
		n.h.Bridge, n.h.NRIBridgeStateDir(), ipv4Subnet(n.h), ipv6Subnet(n.h))
	if err := os.WriteFile(filepath.Join(n.h.NRIPluginConfigDir, nriBridgeName+".conf"), []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}
	binary, err := os.ReadFile(nriBridgePath(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(n.preinstalledBridgePath(), binary, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := n.h.Restart(n.ctx); err != nil {
		t.Fatalf("restart containerd with nri-bridge in plugin_path: %v", err)
	}
	n.waitNetworkReady(t, true)
}

func (n *cniLessNode) preinstalledBridgePath() string {
	return filepath.Join(n.h.NRIPluginDir, nriBridgeName)
}

// nri-bridge pre-installed in NRI's plugin_path: containerd starts it (with its drop-in
// configuration) and starts a new one after its own restart, which finds its allocations again.
func TestCNILessPreinstalledNRIBridge(t *testing.T) {
	t.Parallel()
	n := startCNILessNode(t, func(*stack.Stack) []string { return nil })
	n.preinstallBridge(t)
	a, b := n.runBridgePod(t, "a"), n.runBridgePod(t, "b")
	ipsA, ipsB := statusIPs(podStatus(t, n.ctx, n.h, a.id)), statusIPs(podStatus(t, n.ctx, n.h, b.id))
	if len(ipsA) != 2 {
		t.Fatalf("pod %s reports %v, want an IPv4 and an IPv6 address", a.id, ipsA)
	}
	n.wantBridgeIPs(t, a, nriAtRunPodSandbox, ipsA...)

	if err := n.h.Restart(n.ctx); err != nil {
		t.Fatalf("restart containerd: %v", err)
	}
	n.waitNetworkReady(t, true)
	n.wantBridgeIPs(t, a, nriAtRunPodSandbox, ipsA...)
	n.wantBridgeIPs(t, b, nriAtRunPodSandbox, ipsB...)
	execIn(t, n.ctx, n.h, a.container, "ping", "-c", "1", "-W", "5", ipsB[0])
}
