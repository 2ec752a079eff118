package plugin

import (
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containerd/nri/pkg/api"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/knext-dev/knext/internal/nribridge/config"
	"github.com/knext-dev/knext/internal/nribridge/firewall"
	"github.com/knext-dev/knext/internal/nribridge/store"
	"github.com/knext-dev/knext/internal/nribridge/wiring"
	"github.com/knext-dev/knext/test/netnstest"
)

// These tests change the host: they create network namespaces, a bridge with a random name
// and random subnets, and remove them again.

func requireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (creates network namespaces and a bridge)")
	}
}

// freeNetworkDoc returns a configuration with a fresh bridge name and random subnets that
// overlap nothing on the host (the plugin's own host check decides), and its settings.
func freeNetworkDoc(t testing.TB) (string, *config.Settings) {
	t.Helper()
	bridge := "nbt" + netnstest.RandomHex(t, 8)
	t.Cleanup(func() {
		if link, err := netlink.LinkByName(bridge); err == nil {
			netlink.LinkDel(link)
		}
		if err := firewall.DeleteTable(bridge); err != nil {
			t.Errorf("deleting the nftables table of bridge %s: %v", bridge, err)
		}
	})
	for range 20 {
		r := netnstest.RandomHex(t, 8)
		b, _ := hex.DecodeString(r[:4])
		doc := fmt.Sprintf(`{bridge: %s, mtu: 1400, stateDir: %q, ipv4: {subnet: 10.%d.%d.0/24}, ipv6: {subnet: "fd%s:%s::/64"}}`,
			bridge, t.TempDir(), 200+int(b[0])%50, b[1], r[4:6], r[:4])
		s, err := config.Load([]byte(doc), &config.Flags{})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := wiring.New(s); err == nil {
			return doc, s
		} else if !strings.Contains(err.Error(), "overlaps the host route") {
			t.Fatal(err)
		}
	}
	t.Fatal("no free random subnet found")
	return "", nil
}

// hostPlugin returns an unconfigured plugin on the host's network and nftables.
func hostPlugin(t testing.TB) *plugin {
	t.Helper()
	p, err := newPlugin(&config.Flags{})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// newNetnsPlugin configures a real plugin on a fresh bridge.
func newNetnsPlugin(t testing.TB) (*plugin, *config.Settings) {
	t.Helper()
	doc, s := freeNetworkDoc(t)
	return configuredNetnsPlugin(t, doc), s
}

// configuredNetnsPlugin configures a real plugin with doc.
func configuredNetnsPlugin(t testing.TB, doc string) *plugin {
	t.Helper()
	p := hostPlugin(t)
	if err := p.configure([]byte(doc)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.close() })
	return p
}

// newNetns creates a named network namespace and returns a pod that lives in it.
func newNetns(t testing.TB, id string) (*api.PodSandbox, string) {
	t.Helper()
	pod, name := addNetns(t, id)
	t.Cleanup(func() { exec.Command("ip", "netns", "del", name).Run() })
	return pod, name
}

// addNetns creates a named network namespace, for the caller to delete, and returns a pod that
// lives in it.
func addNetns(t testing.TB, id string) (*api.PodSandbox, string) {
	t.Helper()
	name := "nbt-" + netnstest.RandomHex(t, 10)
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add: %v: %s", err, out)
	}
	// Random sandbox IDs keep host veth names apart from concurrent test runs.
	pod := testPod(id + "-" + netnstest.RandomHex(t, 12))
	pod.Linux.Namespaces[1].Path = "/run/netns/" + name
	return pod, name
}

// BenchmarkNetnsPodLifecycle measures nri-bridge's own hooks for a pod in a fresh netns:
// RunPodSandbox (store the allocation, wire the pod), then StopPodSandbox + RemovePodSandbox
// (detach the pod), as the runtime calls them. The netns is created and deleted, and the
// background release awaited, outside the timing. As root:
// go test -run '^$' -bench NetnsPodLifecycle -benchtime 100x ./internal/nribridge/plugin
func BenchmarkNetnsPodLifecycle(b *testing.B) {
	requireRoot(b)
	p, _ := newNetnsPlugin(b)
	var run, remove time.Duration
	b.ResetTimer()
	for i := range b.N {
		b.StopTimer()
		pod, name := addNetns(b, fmt.Sprintf("bench%d", i))
		b.StartTimer()
		start := time.Now()
		if _, err := p.RunPodSandbox(ctx, pod); err != nil {
			b.Fatal(err)
		}
		wired := time.Now()
		if err := p.StopPodSandbox(ctx, pod); err != nil {
			b.Fatal(err)
		}
		if err := p.RemovePodSandbox(ctx, pod); err != nil {
			b.Fatal(err)
		}
		run, remove = run+wired.Sub(start), remove+time.Since(wired)
		b.StopTimer()
		p.waitReleases()
		if out, err := exec.Command("ip", "netns", "del", name).CombinedOutput(); err != nil {
			b.Fatalf("ip netns del: %v: %s", err, out)
		}
		b.StartTimer()
	}
	b.ReportMetric(float64(run.Microseconds())/float64(b.N)/1000, "run-ms/op")
	b.ReportMetric(float64(remove.Microseconds())/float64(b.N)/1000, "stop+remove-ms/op")
}

// podNetlink opens a netlink handle inside the pod's netns.
func podNetlink(t *testing.T, pod *api.PodSandbox) *netlink.Handle {
	t.Helper()
	return netnstest.Netlink(t, podNetNS(pod))
}

// podState describes eth0, lo and the default routes inside the pod netns.
func podState(t *testing.T, pod *api.PodSandbox) string {
	t.Helper()
	h := podNetlink(t, pod)
	lo, err := h.LinkByName("lo")
	if err != nil {
		t.Fatal(err)
	}
	eth0, err := h.LinkByName("eth0")
	if errors.As(err, &netlink.LinkNotFoundError{}) {
		return fmt.Sprintf("lo up=%v; no eth0", lo.Attrs().Flags&unix.IFF_UP != 0)
	}
	if err != nil {
		t.Fatal(err)
	}
	addrs, err := h.AddrList(eth0, netlink.FAMILY_ALL)
	if err != nil {
		t.Fatal(err)
	}
	var global []string
	for _, a := range addrs {
		if a.IP.IsGlobalUnicast() {
			global = append(global, a.IPNet.String())
		}
	}
	slices.Sort(global)
	routes, err := h.RouteList(eth0, netlink.FAMILY_ALL)
	if err != nil {
		t.Fatal(err)
	}
	var defaults []string
	for _, r := range routes {
		if r.Dst == nil || r.Dst.IP.IsUnspecified() {
			defaults = append(defaults, "default via "+r.Gw.String())
		}
	}
	slices.Sort(defaults)
	return fmt.Sprintf("lo up=%v; eth0 %s up=%v mtu=%d addrs=%v %v", lo.Attrs().Flags&unix.IFF_UP != 0,
		eth0.Type(), eth0.Attrs().Flags&unix.IFF_UP != 0, eth0.Attrs().MTU, global, defaults)
}

func wantPodState(s *config.Settings, addrs ...string) string {
	slices.Sort(addrs)
	var defaults []string
	for _, p := range s.Pools {
		defaults = append(defaults, "default via "+p.Gateway.String())
	}
	slices.Sort(defaults)
	return fmt.Sprintf("lo up=true; eth0 veth up=true mtu=%d addrs=%v %v", s.MTU, addrs, defaults)
}

// withPrefix renders the pod's reported IPs with their subnet lengths.
func withPrefix(s *config.Settings, ips string) []string {
	var out []string
	for i, ip := range strings.Split(ips, ",") {
		out = append(out, netip.PrefixFrom(netip.MustParseAddr(ip), s.Pools[i].Subnet.Bits()).String())
	}
	return out
}

func ping(t *testing.T, netnsName, addr string) error {
	t.Helper()
	out, err := exec.Command("ip", "netns", "exec", netnsName, "busybox", "ping", "-c", "1", "-W", "2", addr).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ping %s from %s: %v: %s", addr, netnsName, err, out)
	}
	return nil
}

func TestNetnsRunAndStop(t *testing.T) {
	requireRoot(t)
	p, s := newNetnsPlugin(t)
	podA, nsA := newNetns(t, "a")
	podB, nsB := newNetns(t, "b")

	for _, pod := range []*api.PodSandbox{podA, podB} {
		if _, err := p.RunPodSandbox(ctx, pod); err != nil {
			t.Fatal(err)
		}
	}
	ipsA, ipsB := podIPsOK(t, p, podA), podIPsOK(t, p, podB)
	if got, want := podState(t, podA), wantPodState(s, withPrefix(s, ipsA)...); got != want {
		t.Errorf("pod a:\n got %s\nwant %s", got, want)
	}

	// Host side: the bridge carries the gateways, the veth is attached to it.
	bridge, err := netlink.LinkByName(s.Bridge)
	if err != nil {
		t.Fatal(err)
	}
	hostVeth, err := netlink.LinkByName(wiring.HostVethName(podA.Id))
	if err != nil {
		t.Fatal(err)
	}
	if hostVeth.Attrs().MasterIndex != bridge.Attrs().Index || hostVeth.Attrs().Flags&unix.IFF_UP == 0 || hostVeth.Attrs().MTU != s.MTU {
		t.Errorf("host veth %s: master %d (bridge %d), flags %v, mtu %d", hostVeth.Attrs().Name,
			hostVeth.Attrs().MasterIndex, bridge.Attrs().Index, hostVeth.Attrs().Flags, hostVeth.Attrs().MTU)
	}
	brAddrs, err := netlink.AddrList(bridge, netlink.FAMILY_ALL)
	if err != nil {
		t.Fatal(err)
	}
	for _, pl := range s.Pools {
		if !slices.ContainsFunc(brAddrs, func(a netlink.Addr) bool { return a.IPNet.String() == pl.GatewayPrefix().String() }) {
			t.Errorf("bridge lacks gateway %s: %v", pl.GatewayPrefix(), brAddrs)
		}
	}

	// The pods reach the gateways and each other over both families.
	for _, target := range append(strings.Split(ipsB, ","), s.Pools[0].Gateway.String(), s.Pools[1].Gateway.String()) {
		if err := ping(t, nsA, target); err != nil {
			t.Error(err)
		}
	}

	// Replaying RunPodSandbox changes nothing: same addresses, same interface.
	h := podNetlink(t, podA)
	eth0Before, err := h.LinkByName("eth0")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.RunPodSandbox(ctx, podA); err != nil {
		t.Fatal(err)
	}
	eth0After, err := h.LinkByName("eth0")
	if err != nil {
		t.Fatal(err)
	}
	if eth0After.Attrs().Index != eth0Before.Attrs().Index || podIPsOK(t, p, podA) != ipsA {
		t.Errorf("replay changed eth0 (index %d -> %d) or IPs (%s -> %s)", eth0Before.Attrs().Index,
			eth0After.Attrs().Index, ipsA, podIPsOK(t, p, podA))
	}
	if got, want := podState(t, podA), wantPodState(s, withPrefix(s, ipsA)...); got != want {
		t.Errorf("pod a after replay:\n got %s\nwant %s", got, want)
	}

	// Stop takes the pod off the bridge at once, then removes both veth ends and releases in
	// the background; stop and remove again are no-ops.
	gate := make(chan struct{})
	p.active.Load().net = &gatedTeardown{podNetwork: p.active.Load().net, gate: gate}
	if err := p.StopPodSandbox(ctx, podA); err != nil {
		t.Fatal(err)
	}
	if hostVeth, err := netlink.LinkByName(wiring.HostVethName(podA.Id)); err != nil || hostVeth.Attrs().MasterIndex != 0 {
		t.Errorf("host veth right after stop: %v (err %v), want it detached from the bridge", hostVeth, err)
	}
	close(gate)
	if err := p.StopPodSandbox(ctx, podA); err != nil {
		t.Fatal(err)
	}
	if err := p.RemovePodSandbox(ctx, podA); err != nil {
		t.Fatal(err)
	}
	p.waitReleases()
	if _, err := netlink.LinkByName(wiring.HostVethName(podA.Id)); !errors.As(err, &netlink.LinkNotFoundError{}) {
		t.Errorf("host veth after stop: %v", err)
	}
	if got := podState(t, podA); got != "lo up=true; no eth0" {
		t.Errorf("pod a after stop: %s", got)
	}
	if podIPsOK(t, p, podA) != "" {
		t.Error("pod a still reported after stop")
	}

	// Stop is safe when the runtime already destroyed the pod's netns.
	if out, err := exec.Command("ip", "netns", "del", nsB).CombinedOutput(); err != nil {
		t.Fatalf("ip netns del: %v: %s", err, out)
	}
	if err := p.StopPodSandbox(ctx, podB); err != nil {
		t.Fatalf("stop after netns deletion: %v", err)
	}
	p.waitReleases()
	if podIPsOK(t, p, podB) != "" {
		t.Error("pod b still reported after stop")
	}
	if _, err := netlink.LinkByName(wiring.HostVethName(podB.Id)); !errors.As(err, &netlink.LinkNotFoundError{}) {
		t.Errorf("host veth of pod b after stop: %v", err)
	}
}

// eventually polls get for up to 5 s until it returns want.
func eventually(t *testing.T, want string, get func() string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		got := get()
		if got == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 5 s: %s, want %s", got, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// gatedTeardown holds every teardown until gate is closed.
type gatedTeardown struct {
	podNetwork
	gate chan struct{}
}

func (g *gatedTeardown) Teardown(a *store.Allocation) error {
	<-g.gate
	return g.podNetwork.Teardown(a)
}

func TestNetnsSetupFailureLeaksNothing(t *testing.T) {
	requireRoot(t)
	p, s := newNetnsPlugin(t)
	// An interface that is not a bridge already has the bridge's name.
	notABridge := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: s.Bridge}, PeerName: s.Bridge + "p"}
	if err := netlink.LinkAdd(notABridge); err != nil {
		t.Fatal(err)
	}
	pod, _ := newNetns(t, "a")
	_, err := p.RunPodSandbox(ctx, pod)
	if want := "bridge " + s.Bridge + ": the existing interface is a veth, not a bridge"; err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("got %v, want %q", err, want)
	}
	if podIPsOK(t, p, pod) != "" {
		t.Error("failed pod kept its allocation")
	}
	if got := podState(t, pod); got != "lo up=false; no eth0" {
		t.Errorf("failed pod's netns: %s", got)
	}

	// A netns path that does not exist fails cleanly too.
	missing := testPod("m-" + netnstest.RandomHex(t, 12))
	missing.Linux.Namespaces[1].Path = "/run/netns/nbt-does-not-exist"
	if link, err := netlink.LinkByName(s.Bridge); err == nil {
		netlink.LinkDel(link)
	}
	_, err = p.RunPodSandbox(ctx, missing)
	if err == nil || !strings.Contains(err.Error(), "opening network namespace /run/netns/nbt-does-not-exist") {
		t.Fatalf("missing netns: got %v", err)
	}
	if podIPsOK(t, p, missing) != "" {
		t.Error("pod with missing netns kept its allocation")
	}
}

// TestNetnsGatewayKeepsItsMAC: the bridge's MAC address, the gateway's, stays what it was when
// nri-bridge first set the bridge up while ports with lower addresses come and go, whether
// nri-bridge created the bridge or found it (left by an earlier version, with a port or emptied
// of them): a pod that resolved the gateways before another pod went keeps reaching them.
func TestNetnsGatewayKeepsItsMAC(t *testing.T) {
	requireRoot(t)
	for _, tc := range []struct {
		name     string
		portMAC  net.HardwareAddr // a port's address on the bridge before nri-bridge sets it up, and so the bridge's
		portGone bool             // that port deleted before then: the bridge's address is all zeros
	}{
		{name: "created"},
		{name: "existing-with-port", portMAC: net.HardwareAddr{0, 0, 0, 0, 0, 2}},
		{name: "existing-emptied", portMAC: net.HardwareAddr{0, 0, 0, 0, 0, 2}, portGone: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			doc, s := freeNetworkDoc(t)
			var port netlink.Link
			if tc.portMAC != nil {
				port = leftBridge(t, s.Bridge, tc.portMAC)
				if tc.portGone {
					if err := netlink.LinkDel(port); err != nil {
						t.Fatal(err)
					}
				}
			}
			p := configuredNetnsPlugin(t, doc)
			podA, nsA := newNetns(t, "a")
			podB, _ := newNetns(t, "b")
			for _, pod := range []*api.PodSandbox{podA, podB} {
				if _, err := p.RunPodSandbox(ctx, pod); err != nil {
					t.Fatal(err)
				}
			}
			want := gatewayMAC(t, s.Bridge)
			if tc.portMAC != nil && !tc.portGone && want != tc.portMAC.String() {
				t.Errorf("gateway MAC %s, want %s, the address the bridge had", want, tc.portMAC)
			}
			// Pod b's port takes the lowest unicast address there is: an unpinned bridge would take it.
			if err := netlink.LinkSetHardwareAddr(linkNamed(t, wiring.HostVethName(podB.Id)), net.HardwareAddr{0, 0, 0, 0, 0, 1}); err != nil {
				t.Fatal(err)
			}
			if got := gatewayMAC(t, s.Bridge); got != want {
				t.Errorf("gateway MAC %s after a port's address became the lowest, want %s", got, want)
			}
			for _, pl := range s.Pools {
				if err := ping(t, nsA, pl.Gateway.String()); err != nil {
					t.Fatal(err)
				}
			}
			if err := p.StopPodSandbox(ctx, podB); err != nil {
				t.Fatal(err)
			}
			p.waitReleases()
			if port != nil && !tc.portGone {
				if err := netlink.LinkDel(port); err != nil {
					t.Fatal(err)
				}
			}
			if got := gatewayMAC(t, s.Bridge); got != want {
				t.Errorf("gateway MAC %s after those ports left, want %s", got, want)
			}
			for _, pl := range s.Pools {
				if err := ping(t, nsA, pl.Gateway.String()); err != nil {
					t.Errorf("pod a after those ports left: %v", err)
				}
			}
		})
	}
}

// TestNetnsEnsureBridgePinsIt: a bridge an earlier nri-bridge left, its MAC address not pinned,
// gets it pinned by EnsureBridge (Synchronize calls it when it keeps pods), before nri-bridge
// wires any pod.
func TestNetnsEnsureBridgePinsIt(t *testing.T) {
	requireRoot(t)
	doc, s := freeNetworkDoc(t)
	first := leftBridge(t, s.Bridge, net.HardwareAddr{0, 0, 0, 0, 0, 2})
	p := configuredNetnsPlugin(t, doc)
	a, err := p.current()
	if err != nil {
		t.Fatal(err)
	}
	if err := a.net.EnsureBridge(); err != nil {
		t.Fatal(err)
	}
	addPort(t, s.Bridge, net.HardwareAddr{0, 0, 0, 0, 0, 1})
	if err := netlink.LinkDel(first); err != nil {
		t.Fatal(err)
	}
	if got, want := gatewayMAC(t, s.Bridge), "00:00:00:00:00:02"; got != want {
		t.Errorf("gateway MAC %s after a port with a lower address joined and the first left, want %s", got, want)
	}
}

// leftBridge creates the bridge as an earlier nri-bridge left it, its MAC address not pinned, with
// a port of that MAC address, which it returns.
func leftBridge(t *testing.T, bridge string, portMAC net.HardwareAddr) netlink.Link {
	t.Helper()
	if err := netlink.LinkAdd(&netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: bridge}}); err != nil {
		t.Fatal(err)
	}
	return addPort(t, bridge, portMAC)
}

// addPort attaches a veth with that MAC address to the bridge, deleted at the end of the test.
func addPort(t *testing.T, bridge string, mac net.HardwareAddr) netlink.Link {
	t.Helper()
	name := "nbv" + netnstest.RandomHex(t, 8)
	port := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name, HardwareAddr: mac, MasterIndex: linkNamed(t, bridge).Attrs().Index}, PeerName: name + "p"}
	if err := netlink.LinkAdd(port); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { netlink.LinkDel(port) })
	return port
}

func gatewayMAC(t *testing.T, bridge string) string {
	t.Helper()
	return linkNamed(t, bridge).Attrs().HardwareAddr.String()
}

func linkNamed(t *testing.T, name string) netlink.Link {
	t.Helper()
	link, err := netlink.LinkByName(name)
	if err != nil {
		t.Fatal(err)
	}
	return link
}

func TestNetnsRecreatesVethAfterInterruptedSetup(t *testing.T) {
	requireRoot(t)
	p, s := newNetnsPlugin(t)
	pod, _ := newNetns(t, "a")
	if _, err := p.RunPodSandbox(ctx, pod); err != nil {
		t.Fatal(err)
	}
	ips := podIPsOK(t, p, pod)
	// Simulate a crash that left the allocation but lost eth0 (e.g. the pair was deleted).
	if link, err := netlink.LinkByName(wiring.HostVethName(pod.Id)); err == nil {
		netlink.LinkDel(link)
	}
	if _, err := p.RunPodSandbox(ctx, pod); err != nil {
		t.Fatal(err)
	}
	if got, want := podState(t, pod), wantPodState(s, withPrefix(s, ips)...); got != want {
		t.Errorf("after replay:\n got %s\nwant %s", got, want)
	}
}

func TestNetnsPreinstalledPlugin(t *testing.T) {
	requireRoot(t)
	doc, s := freeNetworkDoc(t)
	// The runtime launches <plugin dir>/10-bridge (this test binary, which then runs as the
	// plugin) with the drop-in configuration 10-bridge.conf.
	pluginDir := t.TempDir()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(self, filepath.Join(pluginDir, "10-bridge")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(pluginDir, "10-bridge.conf"), []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	socket := filepath.Join(t.TempDir(), "nri.sock")
	pod, _ := newNetns(t, "pre")
	netnsPath := podNetNS(pod)

	rt := startFakeRuntime(t, socket, pluginDir)
	wantIPs := fmt.Sprintf("ip=%s additional=[%s] owners=[%s@10-bridge %s@10-bridge]",
		s.Pools[0].Gateway.Next(), s.Pools[1].Gateway.Next(), s.Pools[0].Gateway.Next(), s.Pools[1].Gateway.Next())
	rt.ask(t, "runips "+pod.Id+" "+netnsPath, wantIPs)
	h := podNetlink(t, pod)
	eth0, err := h.LinkByName("eth0")
	if err != nil {
		t.Fatalf("no eth0 after RunPodSandbox through the pre-installed plugin: %v", err)
	}
	// The first pod gets the second address of each subnet (the first is the gateway).
	ip4, ip6 := s.Pools[0].Gateway.Next(), s.Pools[1].Gateway.Next()
	state := podState(t, pod)
	if want := wantPodState(s, withPrefix(s, ip4.String()+","+ip6.String())...); state != want {
		t.Fatalf("pod state:\n got %s\nwant %s", state, want)
	}

	// The runtime restarts (killing the plugin it launched); the pod is still there. A replay
	// answers the same IPs (the allocation survived the plugin's SIGKILL) and changes nothing.
	rt.stop()
	rt = startFakeRuntime(t, socket, pluginDir, pod.Id+"="+netnsPath)
	rt.ask(t, "runips "+pod.Id+" "+netnsPath, wantIPs)
	if got := podState(t, pod); got != state {
		t.Errorf("after a runtime restart:\n got %s\nwant %s", got, state)
	}
	if again, err := h.LinkByName("eth0"); err != nil || again.Attrs().Index != eth0.Attrs().Index {
		t.Errorf("eth0 was recreated by the replay: %v", err)
	}
	rt.do(t, "stop "+pod.Id+" "+netnsPath)
	// The veth is deleted and the address released in the background, right after the stop.
	eventually(t, "lo up=true; no eth0", func() string { return podState(t, pod) })
	rt.stop()

	// An invalid configuration fails the plugin's start. (The stub closes the connection before
	// the runtime reads the Configure error, so the reason is only in the plugin's own log.)
	bad := strings.Replace(doc, "/24}", "/31}", 1)
	if err := os.WriteFile(filepath.Join(pluginDir, "10-bridge.conf"), []byte(bad), 0o644); err != nil {
		t.Fatal(err)
	}
	rt = startFakeRuntime(t, socket, pluginDir)
	rt.stop()
	if want := `failed to start pre-installed NRI plugin \"bridge\": failed to configure plugin`; !strings.Contains(rt.stderr.String(), want) {
		t.Errorf("runtime log lacks %q:\n%s", want, rt.stderr.String())
	}
}

// defaultRoutes lists the default routes in the pod's netns as "dev <name> via <gateway>".
func defaultRoutes(t *testing.T, pod *api.PodSandbox) []string {
	t.Helper()
	h := podNetlink(t, pod)
	routes, err := h.RouteList(nil, netlink.FAMILY_ALL)
	if err != nil {
		t.Fatal(err)
	}
	var defaults []string
	for _, r := range routes {
		if r.Dst != nil && !r.Dst.IP.IsUnspecified() {
			continue
		}
		link, err := h.LinkByIndex(r.LinkIndex)
		if err != nil {
			t.Fatal(err)
		}
		defaults = append(defaults, "dev "+link.Attrs().Name+" via "+r.Gw.String())
	}
	slices.Sort(defaults)
	return defaults
}

// On a secondary interface nri-bridge adds net1 next to the pod's network (an eth0 with default
// routes stands in for CNI's): net1 gets the addresses and no default route, eth0 and its routes
// stay as they are, and stop removes net1 only.
func TestNetnsSecondaryInterface(t *testing.T) {
	requireRoot(t)
	doc, _ := freeNetworkDoc(t)
	p := configuredNetnsPlugin(t, strings.Replace(doc, "{", "{interface: net1, ", 1))
	podA, nsA := newNetns(t, "a")
	podB, _ := newNetns(t, "b")

	h := podNetlink(t, podA)
	// A veth pair within the netns: the kernel may lack the dummy interface type.
	if err := h.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "eth0"}, PeerName: "eth0peer"}); err != nil {
		t.Fatal(err)
	}
	var eth0 netlink.Link
	for _, name := range []string{"eth0peer", "eth0"} {
		link, err := h.LinkByName(name)
		if err == nil {
			err = h.LinkSetUp(link)
		}
		if err != nil {
			t.Fatal(err)
		}
		eth0 = link
	}
	for _, addr := range []string{"192.0.2.10/24", "2001:db8::10/64"} {
		if err := h.AddrAdd(eth0, wiring.NetlinkAddr(netip.MustParsePrefix(addr))); err != nil {
			t.Fatal(err)
		}
	}
	for _, gw := range []string{"192.0.2.1", "2001:db8::1"} {
		gateway := netip.MustParseAddr(gw)
		dst := netip.PrefixFrom(netip.IPv4Unspecified(), 0)
		if gateway.Is6() {
			dst = netip.PrefixFrom(netip.IPv6Unspecified(), 0)
		}
		if err := h.RouteAdd(&netlink.Route{LinkIndex: eth0.Attrs().Index, Dst: wiring.IPNet(dst), Gw: gateway.AsSlice()}); err != nil {
			t.Fatal(err)
		}
	}
	cniRoutes := defaultRoutes(t, podA)

	for _, pod := range []*api.PodSandbox{podA, podB} {
		if _, err := p.RunPodSandbox(ctx, pod); err != nil {
			t.Fatal(err)
		}
	}
	ipsA, ipsB := podIPsOK(t, p, podA), podIPsOK(t, p, podB)
	net1, err := h.LinkByName("net1")
	if err != nil {
		t.Fatalf("pod a has no net1: %v", err)
	}
	addrs, err := h.AddrList(net1, netlink.FAMILY_ALL)
	if err != nil {
		t.Fatal(err)
	}
	var global []string
	for _, a := range addrs {
		if a.IP.IsGlobalUnicast() {
			global = append(global, a.IP.String())
		}
	}
	if strings.Join(global, ",") != ipsA || net1.Type() != "veth" || net1.Attrs().Flags&unix.IFF_UP == 0 {
		t.Errorf("pod a: net1 is a %s (flags %v) with %v, want an up veth with %s", net1.Type(), net1.Attrs().Flags, global, ipsA)
	}
	if got := defaultRoutes(t, podA); !slices.Equal(got, cniRoutes) {
		t.Errorf("pod a's default routes %v, want eth0's alone %v", got, cniRoutes)
	}
	if got := defaultRoutes(t, podB); len(got) != 0 {
		t.Errorf("pod b (net1 only) has default routes %v, want none", got)
	}
	for target := range strings.SplitSeq(ipsB, ",") {
		if err := ping(t, nsA, target); err != nil {
			t.Error(err)
		}
	}

	if err := p.StopPodSandbox(ctx, podA); err != nil {
		t.Fatal(err)
	}
	p.waitReleases()
	if _, err := h.LinkByName("net1"); !errors.As(err, &netlink.LinkNotFoundError{}) {
		t.Errorf("net1 of pod a after stop: %v", err)
	}
	if _, err := h.LinkByName("eth0"); err != nil || !slices.Equal(defaultRoutes(t, podA), cniRoutes) {
		t.Errorf("stop changed eth0 of pod a (%v) or its routes %v, want %v", err, defaultRoutes(t, podA), cniRoutes)
	}
}
