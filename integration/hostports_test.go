package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/userdata"
	criruntime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/knext-dev/knext/internal/stack"
	"github.com/knext-dev/knext/test/netnstest"
)

// hostPorts and masquerade of nri-bridge on the real stack: the port mappings go from CRI
// through containerd and NRI to nri-bridge, which publishes them with nftables. The pods' ports
// are served by this test from inside the pods' network namespaces (netnstest.Serve), and a
// network namespace linked to the host by a veth stands for another host (netnstest.Peer).

func tcpPort(hostPort, containerPort int32, hostIP string) *criruntime.PortMapping {
	return &criruntime.PortMapping{Protocol: criruntime.Protocol_TCP, HostPort: hostPort, ContainerPort: containerPort, HostIp: hostIP}
}

// runPortPod runs a pod with port mappings on nri-bridge's network, with a sleeping busybox
// container, and returns it with the path of its network namespace.
func (n *cniLessNode) runPortPod(t *testing.T, name string, ports ...*criruntime.PortMapping) (bridgePod, string) {
	t.Helper()
	config := n.h.PodConfig(name)
	config.PortMappings = ports
	id := runPod(t, n.ctx, n.h, config)
	pod := bridgePod{id: id, config: config, container: runContainer(t, n.ctx, n.h, id, config, "sleeper")}
	return pod, podNetNSPath(t, n.ctx, n.h, id)
}

// podNetNSPath is the network namespace of pod id, from its verbose CRI status.
func podNetNSPath(t *testing.T, ctx context.Context, h *stack.Stack, id string) string {
	t.Helper()
	resp, err := h.Runtime.PodSandboxStatus(ctx, &criruntime.PodSandboxStatusRequest{PodSandboxId: id, Verbose: true})
	if err != nil {
		t.Fatal(err)
	}
	var info struct {
		RuntimeSpec struct {
			Linux struct {
				Namespaces []struct{ Type, Path string }
			}
		} `json:"runtimeSpec"`
	}
	if err := json.Unmarshal([]byte(resp.GetInfo()["info"]), &info); err != nil {
		t.Fatalf("verbose status of pod %s: %v", id, err)
	}
	for _, ns := range info.RuntimeSpec.Linux.Namespaces {
		if ns.Type == "network" && ns.Path != "" {
			return ns.Path
		}
	}
	t.Fatalf("pod %s has no network namespace in its runtime spec", id)
	return ""
}

func hostPort(addr netip.Addr, port int32) string {
	return net.JoinHostPort(addr.String(), strconv.Itoa(int(port)))
}

// reach asks addr:port over network from netnsPath (the host for "") until want answers, for up
// to 10 s (rules a restarted nri-bridge rebuilds come shortly after it connects).
func reach(t *testing.T, netnsPath, network string, addr netip.Addr, port int32, want string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		got, err := netnstest.Ask(netnsPath, network, hostPort(addr, port))
		if err == nil && got == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s %s port %d from %q: got %q (%v), want %q", network, addr, port, netnsPath, got, err, want)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// unreachable checks that nothing answers addr:port over network from netnsPath.
func unreachable(t *testing.T, netnsPath, network string, addr netip.Addr, port int32) {
	t.Helper()
	if got, err := netnstest.Ask(netnsPath, network, hostPort(addr, port)); err == nil {
		t.Errorf("%s %s port %d from %q: answered %q, want no answer", network, addr, port, netnsPath, got)
	}
}

// hostPortRules returns the comments of nri-bridge's DNAT rules (one per mapping and family,
// naming the pod), and whether its table exists.
func hostPortRules(t *testing.T, bridge string) (rules []string, table bool) {
	t.Helper()
	conn, err := nftables.New()
	if err != nil {
		t.Fatal(err)
	}
	tables, err := conn.ListTablesOfFamily(nftables.TableFamilyINet)
	if err != nil {
		t.Fatal(err)
	}
	for _, tb := range tables {
		if tb.Name != "nri-bridge-"+bridge {
			continue
		}
		got, err := conn.GetRules(tb, &nftables.Chain{Name: "hostports", Table: tb})
		if err != nil && !strings.Contains(err.Error(), "no such file or directory") {
			t.Fatal(err)
		}
		for _, r := range got {
			comment, _ := userdata.GetString(r.UserData, userdata.TypeComment)
			rules = append(rules, comment)
		}
		return rules, true
	}
	return nil, false
}

// deleteTable deletes nri-bridge's table, as a flush of the host's ruleset would.
func deleteTable(t *testing.T, bridge string) {
	t.Helper()
	conn, err := nftables.New()
	if err != nil {
		t.Fatal(err)
	}
	conn.DelTable(&nftables.Table{Name: "nri-bridge-" + bridge, Family: nftables.TableFamilyINet})
	if err := conn.Flush(); err != nil {
		t.Fatal(err)
	}
}

// gateways are the bridge addresses of a dual-stack node: what a masqueraded pod connection
// comes from.
func gateways(h *stack.Stack) (netip.Addr, netip.Addr) {
	return netip.MustParsePrefix(ipv4Subnet(h)).Addr().Next(), netip.MustParsePrefix(ipv6Subnet(h)).Addr().Next()
}

func TestCNILessHostPorts(t *testing.T) {
	t.Parallel()
	n := startCNILessNode(t, dualStack)
	n.startBridge(t)
	peer := netnstest.NewPeer(t) // another host; its link gives the node the addresses Host4, Host6
	gw4, gw6 := gateways(n.h)
	anyAddr, onHost4 := netnstest.Port(t), netnstest.Port(t)
	web, webNS := n.runPortPod(t, "web", tcpPort(anyAddr, 80, ""), tcpPort(onHost4, 81, peer.Host4.String()), tcpPort(0, 8080, ""))
	for _, serve := range []struct {
		network string
		port    int
	}{{"tcp4", 80}, {"tcp6", 80}, {"tcp4", 81}} {
		netnstest.Serve(t, webNS, serve.network, serve.port, "web")
	}
	if rules, _ := hostPortRules(t, n.h.Bridge); len(rules) != 3 {
		t.Errorf("DNAT rules %q, want 3 (hostPort %d: IPv4 and IPv6; hostPort %d on %s)", rules, anyAddr, onHost4, peer.Host4)
	}

	// From another host, over both families: the pod sees the client's address.
	reach(t, peer.NetNSPath, "tcp4", peer.Host4, anyAddr, "web saw "+peer.Peer4.String())
	reach(t, peer.NetNSPath, "tcp6", peer.Host6, anyAddr, "web saw "+peer.Peer6.String())
	// From the node: its own addresses, and localhost (masqueraded to the bridge's address).
	reach(t, "", "tcp4", peer.Host4, anyAddr, "web saw "+peer.Host4.String())
	reach(t, "", "tcp6", peer.Host6, anyAddr, "web saw "+peer.Host6.String())
	reach(t, "", "tcp4", netip.MustParseAddr("127.0.0.1"), anyAddr, "web saw "+gw4.String())
	// hostIP: that address only.
	reach(t, peer.NetNSPath, "tcp4", peer.Host4, onHost4, "web saw "+peer.Peer4.String())
	unreachable(t, "", "tcp4", netip.MustParseAddr("127.0.0.1"), onHost4)
	// Hairpin: the pod's own container reaches it through the node's addresses.
	for addr, want := range map[netip.Addr]string{peer.Host4: "web saw " + gw4.String(), peer.Host6: "web saw " + gw6.String()} {
		if got := strings.TrimSpace(execIn(t, n.ctx, n.h, web.container, "nc", "-w", "5", addr.String(), strconv.Itoa(int(anyAddr)))); got != want {
			t.Errorf("pod %s to its own hostPort on %s: got %q, want %q", web.id, addr, got, want)
		}
	}

	// Another pod cannot have the port: its RunPodSandbox fails naming the port and the holder.
	_, err := n.h.Runtime.RunPodSandbox(n.ctx, &criruntime.RunPodSandboxRequest{Config: func() *criruntime.PodSandboxConfig {
		c := n.h.PodConfig("second")
		c.PortMappings = []*criruntime.PortMapping{tcpPort(anyAddr, 80, "0.0.0.0")}
		return c
	}()})
	want := fmt.Sprintf("hostPort %d/TCP on every IPv4 address (container port 80) is taken: pod %s/web (sandbox %s) holds hostPort %d/TCP on every address (container port 80)",
		anyAddr, stack.PodNamespace, web.id, anyAddr)
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("a second pod with hostPort %d: got %v\nwant an error with %q", anyAddr, err, want)
	}
	pods, err := n.h.Runtime.ListPodSandbox(n.ctx, &criruntime.ListPodSandboxRequest{})
	if err != nil || len(pods.Items) != 1 {
		t.Errorf("after the refused pod: %d pods (%v), want 1", len(pods.GetItems()), err)
	}

	// Stop removes the rules (and the table, which holds nothing else).
	if _, err := n.h.Runtime.StopPodSandbox(n.ctx, &criruntime.StopPodSandboxRequest{PodSandboxId: web.id}); err != nil {
		t.Fatal(err)
	}
	if rules, table := hostPortRules(t, n.h.Bridge); table {
		t.Errorf("nri-bridge's table is left after the only pod with hostPorts stopped: %q", rules)
	}
	unreachable(t, peer.NetNSPath, "tcp4", peer.Host4, anyAddr)
	unreachable(t, "", "tcp4", netip.MustParseAddr("127.0.0.1"), anyAddr)
	// The port is free for the next pod.
	_, secondNS := n.runPortPod(t, "second", tcpPort(anyAddr, 80, "0.0.0.0"))
	netnstest.Serve(t, secondNS, "tcp4", 80, "second")
	reach(t, peer.NetNSPath, "tcp4", peer.Host4, anyAddr, "second saw "+peer.Peer4.String())
}

func TestCNILessHostPortsSurviveRestarts(t *testing.T) {
	t.Parallel()
	n := startCNILessNode(t, dualStack)
	n.startBridge(t)
	peer := netnstest.NewPeer(t)
	port := netnstest.Port(t)
	web, webNS := n.runPortPod(t, "web", tcpPort(port, 80, ""))
	netnstest.Serve(t, webNS, "tcp4", 80, "web")
	netnstest.Serve(t, webNS, "tcp6", 80, "web")
	reachBoth := func() {
		t.Helper()
		reach(t, peer.NetNSPath, "tcp4", peer.Host4, port, "web saw "+peer.Peer4.String())
		reach(t, peer.NetNSPath, "tcp6", peer.Host6, port, "web saw "+peer.Peer6.String())
	}
	reachBoth()

	// nri-bridge crashes: the rules stay. Then the table is lost (a flush of the host's
	// ruleset, say) while nri-bridge is away: the next nri-bridge rebuilds it on Synchronize.
	n.killBridge(t)
	reachBoth()
	deleteTable(t, n.h.Bridge)
	unreachable(t, peer.NetNSPath, "tcp4", peer.Host4, port)
	n.startBridge(t)
	reachBoth()

	// containerd restarts: nri-bridge reconnects and synchronizes again.
	deleteTable(t, n.h.Bridge)
	if err := n.h.Restart(n.ctx); err != nil {
		t.Fatalf("restart containerd: %v", err)
	}
	n.waitNetworkReady(t, true)
	reachBoth()

	// The pod goes while nri-bridge is away: its rules go at the next Synchronize.
	n.killBridge(t)
	if err := n.h.RemovePod(n.ctx, web.id); err != nil {
		t.Fatal(err)
	}
	if rules, _ := hostPortRules(t, n.h.Bridge); len(rules) != 2 {
		t.Errorf("rules while nri-bridge is away: %q, want pod %s's 2 still there", rules, web.id)
	}
	n.startBridge(t)
	deadline := time.Now().Add(10 * time.Second)
	for {
		rules, table := hostPortRules(t, n.h.Bridge)
		if !table {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("10s after nri-bridge came back, the rules of removed pod %s are still there: %q", web.id, rules)
		}
		time.Sleep(100 * time.Millisecond)
	}

	// Uninstall: nri-bridge -cleanup removes the bridge (with the veth of a running pod), the
	// table and the state; nothing of nri-bridge is left.
	late, _ := n.runPortPod(t, "late", tcpPort(port, 80, ""))
	if _, table := hostPortRules(t, n.h.Bridge); !table {
		t.Fatal("no table for pod late's hostPort")
	}
	if err := n.bridge.Stop(); err != nil {
		t.Fatal(err)
	}
	n.bridge = nil
	out, err := exec.Command(nriBridgePath(t), append([]string{"-cleanup"}, n.bridgeArgs...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("nri-bridge -cleanup: %v\n%s", err, out)
	}
	for _, want := range []string{"of pod " + stack.PodNamespace + "/late (sandbox " + late.id + ")", "removed nftables table inet nri-bridge-" + n.h.Bridge,
		"removed bridge " + n.h.Bridge, "removed " + n.h.NRIBridgeStateDir()} {
		if !strings.Contains(string(out), want) {
			t.Errorf("nri-bridge -cleanup said:\n%s\nwant a line with %q", out, want)
		}
	}
	if _, table := hostPortRules(t, n.h.Bridge); table {
		t.Error("nri-bridge's table is left after -cleanup")
	}
	if ports, err := n.h.BridgePorts(); err == nil {
		t.Errorf("bridge %s is left after -cleanup, with ports %v", n.h.Bridge, ports)
	}
	if _, err := os.Stat(n.h.NRIBridgeStateDir()); !os.IsNotExist(err) {
		t.Errorf("nri-bridge's state directory after -cleanup: %v", err)
	}
}

func TestCNILessMasquerade(t *testing.T) {
	t.Parallel()
	outside := netnstest.NewPeer(t) // a network beyond the node, with no route back to the pods
	netnstest.Serve(t, outside.NetNSPath, "tcp4", 80, "outside")
	netnstest.Serve(t, outside.NetNSPath, "tcp6", 80, "outside")
	for _, masquerade := range []bool{false, true} {
		t.Run(fmt.Sprintf("masquerade=%v", masquerade), func(t *testing.T) {
			t.Parallel()
			n := startCNILessNode(t, dualStack)
			if masquerade {
				n.bridgeArgs = append(n.bridgeArgs, "-masquerade")
			}
			n.startBridge(t)
			pod := n.runBridgePod(t, "egress")
			for _, target := range []struct{ addr, source netip.Addr }{{outside.Peer4, outside.Host4}, {outside.Peer6, outside.Host6}} {
				resp, err := n.h.Runtime.ExecSync(n.ctx, &criruntime.ExecSyncRequest{ContainerId: pod.container,
					Cmd: []string{"nc", "-w", "3", target.addr.String(), "80"}, Timeout: 30})
				if err != nil {
					t.Fatal(err)
				}
				got := strings.TrimSpace(string(resp.Stdout))
				if want := "outside saw " + target.source.String(); masquerade && (resp.ExitCode != 0 || got != want) {
					t.Errorf("pod to %s with masquerade: exit %d, %q%s; want %q", target.addr, resp.ExitCode, got, resp.Stderr, want)
				}
				if !masquerade && got != "" {
					t.Errorf("pod to %s without masquerade: answered %q, want no answer (no route back)", target.addr, got)
				}
			}
		})
	}
}
