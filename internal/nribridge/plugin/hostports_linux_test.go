package plugin

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/containerd/nri/pkg/api"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/knext-dev/knext/internal/nribridge/config"
	"github.com/knext-dev/knext/internal/nribridge/firewall"
	"github.com/knext-dev/knext/internal/nribridge/wiring"
	"github.com/knext-dev/knext/test/netnstest"
)

// These tests change the host like network_linux_test.go: network namespaces, veths, a bridge
// and the plugin's nftables table, all with random names, all removed again. They turn on IPv4
// and IPv6 forwarding, as the plugin does for hostPorts.

func mapping(proto api.Protocol, hostPort, containerPort int32, hostIP string) *api.PortMapping {
	return &api.PortMapping{Protocol: proto, HostPort: hostPort, ContainerPort: containerPort, HostIp: hostIP}
}

// reach asks addr:port over network from netnsPath (the host for "") and fails the test unless
// want answers.
func reach(t *testing.T, netnsPath, network string, addr netip.Addr, port int32, want string) {
	t.Helper()
	got, err := netnstest.Ask(netnsPath, network, net.JoinHostPort(addr.String(), strconv.Itoa(int(port))))
	if err != nil || got != want {
		t.Errorf("%s %s port %d from %q: got %q (%v), want %q", network, addr, port, netnsPath, got, err, want)
	}
}

// refused checks that nothing answers addr:port from the host: the connection is refused
// at once (no DNAT into a black hole).
func refused(t *testing.T, network string, addr netip.Addr, port int32) {
	t.Helper()
	got, err := netnstest.Ask("", network, net.JoinHostPort(addr.String(), strconv.Itoa(int(port))))
	if err == nil || !strings.Contains(err.Error(), "connection refused") {
		t.Errorf("%s %s port %d from the host: got %q (%v), want the connection refused", network, addr, port, got, err)
	}
}

// unreachable checks that nothing answers addr:port from netnsPath.
func unreachable(t *testing.T, netnsPath, network string, addr netip.Addr, port int32) {
	t.Helper()
	if got, err := netnstest.Ask(netnsPath, network, net.JoinHostPort(addr.String(), strconv.Itoa(int(port)))); err == nil {
		t.Errorf("%s %s port %d from %q: answered %q, want no answer", network, addr, port, netnsPath, got)
	}
}

func sysctlValue(t *testing.T, name string) string {
	t.Helper()
	data, err := os.ReadFile("/proc/sys/" + name)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(data))
}

func wantTable(t *testing.T, bridge string, want bool) {
	t.Helper()
	if exists, err := firewall.TableExists(bridge); err != nil || exists != want {
		t.Errorf("nftables table inet %s exists: %v (%v), want %v", firewall.TableName(bridge), exists, err, want)
	}
}

func TestNetnsHostPorts(t *testing.T) {
	requireRoot(t)
	p, s := newNetnsPlugin(t)
	peer := netnstest.NewPeer(t) // another host, linked to the node
	gw4, gw6 := s.Pools[0].Gateway, s.Pools[1].Gateway
	anyPort, onPeer4, only6, udp := netnstest.Port(t), netnstest.Port(t), netnstest.Port(t), netnstest.Port(t)

	web, _ := newNetns(t, "web")
	web.PortMappings = []*api.PortMapping{
		mapping(api.Protocol_TCP, anyPort, 80, ""),
		mapping(api.Protocol_TCP, onPeer4, 81, peer.Host4.String()),
		mapping(api.Protocol_TCP, only6, 82, "::"),
		mapping(api.Protocol_UDP, udp, 53, "0.0.0.0"),
		mapping(api.Protocol_TCP, 0, 8080, ""), // a container port without hostPort: nothing
	}
	if _, err := p.RunPodSandbox(ctx, web); err != nil {
		t.Fatal(err)
	}
	webNS := podNetNS(web)
	for _, serve := range []struct {
		network string
		port    int
	}{{"tcp4", 80}, {"tcp6", 80}, {"tcp4", 81}, {"tcp6", 82}, {"tcp4", 82}, {"udp4", 53}, {"udp6", 53}, {"tcp4", 8080}} {
		netnstest.Serve(t, webNS, serve.network, serve.port, "web")
	}

	// Other hosts reach every family, and the pod sees their own address.
	reach(t, peer.NetNSPath, "tcp4", peer.Host4, anyPort, "web saw "+peer.Peer4.String())
	reach(t, peer.NetNSPath, "tcp6", peer.Host6, anyPort, "web saw "+peer.Peer6.String())
	reach(t, peer.NetNSPath, "udp4", peer.Host4, udp, "web saw "+peer.Peer4.String())
	unreachable(t, peer.NetNSPath, "udp6", peer.Host6, udp) // 0.0.0.0: IPv4 only
	unreachable(t, peer.NetNSPath, "tcp4", peer.Host4, 8080)
	// The node itself: its addresses, and IPv4 localhost (masqueraded to the gateway).
	reach(t, "", "tcp4", peer.Host4, anyPort, "web saw "+peer.Host4.String())
	reach(t, "", "tcp6", peer.Host6, anyPort, "web saw "+peer.Host6.String())
	reach(t, "", "tcp4", netip.MustParseAddr("127.0.0.1"), anyPort, "web saw "+gw4.String())
	reach(t, "", "udp4", netip.MustParseAddr("127.0.0.1"), udp, "web saw "+gw4.String())
	refused(t, "tcp6", netip.IPv6Loopback(), anyPort) // IPv6 localhost is not forwarded
	// hostIP: only that address; "::" only IPv6.
	reach(t, peer.NetNSPath, "tcp4", peer.Host4, onPeer4, "web saw "+peer.Peer4.String())
	refused(t, "tcp4", netip.MustParseAddr("127.0.0.1"), onPeer4)
	reach(t, peer.NetNSPath, "tcp6", peer.Host6, only6, "web saw "+peer.Peer6.String())
	refused(t, "tcp4", peer.Host4, only6)

	// Hairpin: the pod reaches itself through its hostPort, on any node address.
	reach(t, webNS, "tcp4", peer.Host4, anyPort, "web saw "+gw4.String())
	reach(t, webNS, "tcp6", peer.Host6, anyPort, "web saw "+gw6.String())
	reach(t, webNS, "tcp4", gw4, anyPort, "web saw "+gw4.String())
	hostVeth, err := netlink.LinkByName(wiring.HostVethName(web.Id))
	if err != nil {
		t.Fatal(err)
	}
	if info, err := netlink.LinkGetProtinfo(hostVeth); err != nil || !info.Hairpin {
		t.Errorf("bridge port %s of a pod with hostPorts: hairpin %v (%v), want on", hostVeth.Attrs().Name, info.Hairpin, err)
	}
	// Another pod reaches it too.
	client, _ := newNetns(t, "client")
	if _, err := p.RunPodSandbox(ctx, client); err != nil {
		t.Fatal(err)
	}
	reach(t, podNetNS(client), "tcp4", peer.Host4, anyPort, "web saw "+gw4.String())
	reach(t, podNetNS(client), "tcp6", gw6, anyPort, "web saw "+gw6.String())

	// What the rules need of the host.
	for name, want := range map[string]string{
		"net/ipv4/ip_forward":                           "1",
		"net/ipv6/conf/all/forwarding":                  "1",
		"net/ipv4/conf/" + s.Bridge + "/route_localnet": "1",
	} {
		if got := sysctlValue(t, name); got != want {
			t.Errorf("%s = %s, want %s", name, got, want)
		}
	}

	// A port another pod holds is a clear error, and the refused pod leaves nothing behind (but
	// lo up: the port is claimed once the pod is wired).
	taken, _ := newNetns(t, "taken")
	taken.PortMappings = []*api.PortMapping{mapping(api.Protocol_TCP, anyPort, 80, peer.Host4.String())}
	_, err = p.RunPodSandbox(ctx, taken)
	want := fmt.Sprintf("nri-bridge: %s: hostPort %d/TCP on %s (container port 80) is taken: %s holds hostPort %d/TCP on every address (container port 80)",
		refOf(taken), anyPort, peer.Host4, refOf(web), anyPort)
	if err == nil || err.Error() != want {
		t.Errorf("conflicting pod: got %v\nwant %s", err, want)
	}
	if got := podState(t, taken); got != "lo up=true; no eth0" || podIPsOK(t, p, taken) != "" {
		t.Errorf("refused pod: %s, IPs %q", got, podIPsOK(t, p, taken))
	}

	// Stop removes the rules, the table with the last of them, and route_localnet.
	if err := p.StopPodSandbox(ctx, web); err != nil {
		t.Fatal(err)
	}
	unreachable(t, peer.NetNSPath, "tcp4", peer.Host4, anyPort)
	refused(t, "tcp4", netip.MustParseAddr("127.0.0.1"), anyPort)
	wantTable(t, s.Bridge, false)
	if got := sysctlValue(t, "net/ipv4/conf/"+s.Bridge+"/route_localnet"); got != "0" {
		t.Errorf("route_localnet of bridge %s after the last hostPort went: %s", s.Bridge, got)
	}
	// The port is free again.
	if _, err := p.RunPodSandbox(ctx, taken); err != nil {
		t.Fatalf("pod taking the released port: %v", err)
	}
	netnstest.Serve(t, podNetNS(taken), "tcp4", 80, "taken")
	reach(t, peer.NetNSPath, "tcp4", peer.Host4, anyPort, "taken saw "+peer.Peer4.String())
}

func TestNetnsHostPortsRebuiltOnSynchronize(t *testing.T) {
	requireRoot(t)
	doc, s := freeNetworkDoc(t)
	newPlugin := func() *plugin {
		p := hostPlugin(t)
		if err := p.configure([]byte(doc)); err != nil {
			t.Fatal(err)
		}
		return p
	}
	p := newPlugin()
	peer := netnstest.NewPeer(t)
	port, gonePort := netnstest.Port(t), netnstest.Port(t)
	pod, _ := newNetns(t, "kept")
	pod.PortMappings = []*api.PortMapping{mapping(api.Protocol_TCP, port, 80, "")}
	gone, goneNetns := newNetns(t, "gone")
	gone.PortMappings = []*api.PortMapping{mapping(api.Protocol_TCP, gonePort, 80, "")}
	for _, pd := range []*api.PodSandbox{pod, gone} {
		if _, err := p.RunPodSandbox(ctx, pd); err != nil {
			t.Fatal(err)
		}
		netnstest.Serve(t, podNetNS(pd), "tcp4", 80, pd.Name)
	}
	reach(t, peer.NetNSPath, "tcp4", peer.Host4, port, pod.Name+" saw "+peer.Peer4.String())

	// The plugin goes (as in a crash); the rules stay in the kernel meanwhile. Then the table is
	// lost (flushed by someone, node rebooted with pods restored...) and one pod goes.
	p.close()
	reach(t, peer.NetNSPath, "tcp4", peer.Host4, port, pod.Name+" saw "+peer.Peer4.String())
	if err := firewall.DeleteTable(s.Bridge); err != nil {
		t.Fatal(err)
	}
	unreachable(t, peer.NetNSPath, "tcp4", peer.Host4, port)
	if out, err := exec.Command("ip", "netns", "del", goneNetns).CombinedOutput(); err != nil {
		t.Fatalf("ip netns del: %v: %s", err, out)
	}

	// The next plugin rebuilds the table on Synchronize, without the pod that is gone.
	p = newPlugin()
	defer p.close()
	if _, err := p.Synchronize(ctx, []*api.PodSandbox{pod}, nil); err != nil {
		t.Fatal(err)
	}
	reach(t, peer.NetNSPath, "tcp4", peer.Host4, port, pod.Name+" saw "+peer.Peer4.String())
	refused(t, "tcp4", peer.Host4, gonePort)
	a, _ := p.current()
	if held, err := a.store.HostPortsOf(gone.Id); err != nil || held != nil {
		t.Errorf("the ports of the pod that is gone are still held: %v (%v)", held, err)
	}

	// A pod started by an nri-bridge without hostPort support gets its ports on Synchronize.
	if err := a.store.ReleaseHostPorts(pod.Id); err != nil {
		t.Fatal(err)
	}
	if err := firewall.DeleteTable(s.Bridge); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Synchronize(ctx, []*api.PodSandbox{pod}, nil); err != nil {
		t.Fatal(err)
	}
	reach(t, peer.NetNSPath, "tcp4", peer.Host4, port, pod.Name+" saw "+peer.Peer4.String())
}

func TestNetnsMasquerade(t *testing.T) {
	requireRoot(t)
	outside := netnstest.NewPeer(t) // a network beyond the node, with no route to the pods
	netnstest.Serve(t, outside.NetNSPath, "tcp4", 80, "outside")
	netnstest.Serve(t, outside.NetNSPath, "tcp6", 80, "outside")
	for _, masq := range []bool{false, true} {
		t.Run(fmt.Sprintf("masquerade=%v", masq), func(t *testing.T) {
			doc, s := freeNetworkDoc(t)
			doc = strings.Replace(doc, "{", fmt.Sprintf("{masquerade: %v, ", masq), 1)
			p := hostPlugin(t)
			if err := p.configure([]byte(doc)); err != nil {
				t.Fatal(err)
			}
			defer p.close()
			if _, err := p.Synchronize(ctx, nil, nil); err != nil {
				t.Fatal(err)
			}
			pod, _ := newNetns(t, "egress")
			if _, err := p.RunPodSandbox(ctx, pod); err != nil {
				t.Fatal(err)
			}
			wantTable(t, s.Bridge, masq)
			if !masq {
				unreachable(t, podNetNS(pod), "tcp4", outside.Peer4, 80)
				unreachable(t, podNetNS(pod), "tcp6", outside.Peer6, 80)
				return
			}
			reach(t, podNetNS(pod), "tcp4", outside.Peer4, 80, "outside saw "+outside.Host4.String())
			reach(t, podNetNS(pod), "tcp6", outside.Peer6, 80, "outside saw "+outside.Host6.String())
			// Pods still see each other's own addresses.
			other, _ := newNetns(t, "other")
			if _, err := p.RunPodSandbox(ctx, other); err != nil {
				t.Fatal(err)
			}
			netnstest.Serve(t, podNetNS(other), "tcp4", 80, "other")
			ip := netip.MustParseAddr(strings.Split(podIPsOK(t, p, other), ",")[0])
			reach(t, podNetNS(pod), "tcp4", ip, 80, "other saw "+strings.Split(podIPsOK(t, p, pod), ",")[0])
		})
	}
}

// In cluster mode, masquerade spares traffic to every node's pod CIDRs: a pod of another node
// sees the pod's own address, a host beyond the cluster sees the node's. The other node is a
// network namespace whose link's subnets stand for its pod CIDRs, with a route back to this
// node's, as nri-bridge makes on every node.
func TestNetnsMasqueradeSparesTheClusterPodCIDRs(t *testing.T) {
	requireRoot(t)
	_, s := freeNetworkDoc(t)
	otherNode, outside := netnstest.NewPeer(t), netnstest.NewPeer(t)
	h := netnstest.Netlink(t, otherNode.NetNSPath)
	var podCIDRs []netip.Prefix
	for _, pool := range s.Pools {
		gw := otherNode.Host4
		if pool.Subnet.Addr().Is6() {
			gw = otherNode.Host6
		}
		if err := h.RouteAdd(&netlink.Route{Dst: wiring.IPNet(pool.Subnet), Gw: gw.AsSlice()}); err != nil {
			t.Fatal(err)
		}
		podCIDRs = append(podCIDRs, pool.Subnet)
	}
	otherPodCIDRs := []netip.Prefix{netip.PrefixFrom(otherNode.Peer4, 30).Masked(), netip.PrefixFrom(otherNode.Peer6, 64).Masked()}

	p := hostPlugin(t)
	p.cluster = &clusterNode{name: "n1", podCIDRs: podCIDRs, nodesPodCIDRs: func() []netip.Prefix { return otherPodCIDRs }}
	if err := p.configure([]byte(fmt.Sprintf(`{bridge: %s, mtu: 1400, stateDir: %q, masquerade: true}`, s.Bridge, t.TempDir()))); err != nil {
		t.Fatal(err)
	}
	defer p.close()
	if _, err := p.Synchronize(ctx, nil, nil); err != nil {
		t.Fatal(err)
	}
	pod, _ := newNetns(t, "pod")
	if _, err := p.RunPodSandbox(ctx, pod); err != nil {
		t.Fatal(err)
	}
	ips := strings.Split(podIPsOK(t, p, pod), ",")
	for _, peer := range []struct {
		name string
		*netnstest.Peer
	}{{"other-node", otherNode}, {"outside", outside}} {
		netnstest.Serve(t, peer.NetNSPath, "tcp4", 80, peer.name)
		netnstest.Serve(t, peer.NetNSPath, "tcp6", 80, peer.name)
	}
	reach(t, podNetNS(pod), "tcp4", otherNode.Peer4, 80, "other-node saw "+ips[0])
	reach(t, podNetNS(pod), "tcp6", otherNode.Peer6, 80, "other-node saw "+ips[1])
	reach(t, podNetNS(pod), "tcp4", outside.Peer4, 80, "outside saw "+outside.Host4.String())
	reach(t, podNetNS(pod), "tcp6", outside.Peer6, 80, "outside saw "+outside.Host6.String())
}

// The localhost DNAT of IPv4 hostPorts needs route_localnet on the bridge, which would let a pod
// send to the node's 127.0.0.1 services (route 127.0.0.0/8 to the gateway, as a pod with
// NET_ADMIN can): the guard drops such packets.
func TestNetnsLocalnetGuard(t *testing.T) {
	requireRoot(t)
	p, s := newNetnsPlugin(t)
	pod, _ := newNetns(t, "intruder")
	pod.PortMappings = []*api.PortMapping{mapping(api.Protocol_TCP, netnstest.Port(t), 80, "")}
	if _, err := p.RunPodSandbox(ctx, pod); err != nil {
		t.Fatal(err)
	}
	if got := sysctlValue(t, "net/ipv4/conf/"+s.Bridge+"/route_localnet"); got != "1" {
		t.Fatalf("route_localnet of bridge %s: %s, want 1", s.Bridge, got)
	}
	h := podNetlink(t, pod)
	routes, err := h.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Table: unix.RT_TABLE_LOCAL}, netlink.RT_FILTER_TABLE)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range routes {
		if r.Dst != nil && r.Dst.IP.IsLoopback() {
			if err := h.RouteDel(&r); err != nil {
				t.Fatal(err)
			}
		}
	}
	eth0, err := h.LinkByName(config.DefaultInterface)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.RouteAdd(&netlink.Route{LinkIndex: eth0.Attrs().Index, Dst: wiring.IPNet(netip.MustParsePrefix("127.0.0.0/8")), Gw: s.Pools[0].Gateway.AsSlice()}); err != nil {
		t.Fatal(err)
	}

	service, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer service.Close()
	err = netnstest.Do(podNetNS(pod), func() error {
		conn, err := net.Dial("udp4", service.LocalAddr().String())
		if err != nil {
			return err
		}
		defer conn.Close()
		_, err = conn.Write([]byte("intrusion"))
		return err
	})
	if err != nil {
		t.Fatalf("sending from the pod to the node's %s: %v", service.LocalAddr(), err)
	}
	service.SetReadDeadline(time.Now().Add(time.Second))
	buf := make([]byte, 64)
	if n, from, err := service.ReadFrom(buf); err == nil {
		t.Errorf("the node's %s got %q from %s, a pod", service.LocalAddr(), buf[:n], from)
	}
}

// SCTP cannot be spoken here (the kernel lacks SCTP sockets), but conntrack and NAT handle it:
// a raw SCTP INIT sent to the hostPort arrives at the pod's address and container port.
func TestNetnsSCTPHostPort(t *testing.T) {
	requireRoot(t)
	p, _ := newNetnsPlugin(t)
	peer := netnstest.NewPeer(t)
	port := netnstest.Port(t)
	pod, _ := newNetns(t, "sctp")
	pod.PortMappings = []*api.PortMapping{mapping(api.Protocol_SCTP, port, 3868, "")}
	if _, err := p.RunPodSandbox(ctx, pod); err != nil {
		t.Fatal(err)
	}
	ips := strings.Split(podIPsOK(t, p, pod), ",")
	for i, hostAddr := range []netip.Addr{peer.Host4, peer.Host6} {
		family := unix.AF_INET6
		if hostAddr.Is4() {
			family = unix.AF_INET
		}
		var received []byte
		var recvErr error
		done := make(chan struct{})
		rawSocket(t, podNetNS(pod), family, func(fd int) {
			go func() {
				defer close(done)
				buf := make([]byte, 1500)
				n, _, err := unix.Recvfrom(fd, buf, 0)
				received, recvErr = buf[:max(n, 0)], err
			}()
		})
		rawSocket(t, peer.NetNSPath, family, func(fd int) {
			if err := unix.Sendto(fd, sctpInit(4242, uint16(port)), 0, sockaddr(hostAddr)); err != nil {
				t.Fatalf("sending an SCTP INIT to %s port %d: %v", hostAddr, port, err)
			}
		})
		select {
		case <-done:
		case <-time.After(3 * time.Second):
			t.Fatalf("no SCTP packet reached pod %s through %s port %d", ips[i], hostAddr, port)
		}
		if recvErr != nil {
			t.Fatal(recvErr)
		}
		sctp := received
		if hostAddr.Is4() { // IPv4 raw sockets get the IP header
			if dst, _ := netip.AddrFromSlice(received[16:20]); dst.String() != ips[i] {
				t.Errorf("SCTP INIT to %s arrived for %s, want the pod's %s", hostAddr, dst, ips[i])
			}
			sctp = received[4*(received[0]&0x0f):]
		}
		if got := binary.BigEndian.Uint16(sctp[2:4]); got != 3868 {
			t.Errorf("SCTP INIT to %s port %d arrived on port %d, want the container port 3868", hostAddr, port, got)
		}
	}
}

// rawSocket opens a raw SCTP socket of family in the network namespace at netnsPath, hands it
// to use, and closes it when the test ends.
func rawSocket(t *testing.T, netnsPath string, family int, use func(fd int)) {
	t.Helper()
	var fd int
	err := netnstest.Do(netnsPath, func() error {
		var err error
		fd, err = unix.Socket(family, unix.SOCK_RAW, unix.IPPROTO_SCTP)
		return err
	})
	if err == nil {
		// Bounded, so that a receiver never outlives the test.
		err = unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Sec: 5})
	}
	if err != nil {
		t.Fatalf("raw SCTP socket in %s: %v", netnsPath, err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	use(fd)
}

func sockaddr(addr netip.Addr) unix.Sockaddr {
	if addr.Is4() {
		return &unix.SockaddrInet4{Addr: addr.As4()}
	}
	return &unix.SockaddrInet6{Addr: addr.As16()}
}

// sctpInit is an SCTP packet with an INIT chunk (RFC 9260), with its CRC32c checksum: conntrack
// ignores packets with a wrong one.
func sctpInit(srcPort, dstPort uint16) []byte {
	pkt := make([]byte, 12+20)
	binary.BigEndian.PutUint16(pkt[0:], srcPort)
	binary.BigEndian.PutUint16(pkt[2:], dstPort)
	// Verification tag 0 (pkt[4:8]), checksum (pkt[8:12]) below.
	chunk := pkt[12:]
	chunk[0] = 1                                   // INIT
	binary.BigEndian.PutUint16(chunk[2:], 20)      // chunk length
	binary.BigEndian.PutUint32(chunk[4:], 0x1234)  // initiate tag
	binary.BigEndian.PutUint32(chunk[8:], 65536)   // advertised receiver window
	binary.BigEndian.PutUint16(chunk[12:], 1)      // outbound streams
	binary.BigEndian.PutUint16(chunk[14:], 1)      // inbound streams
	binary.BigEndian.PutUint32(chunk[16:], 0x5678) // initial TSN
	binary.LittleEndian.PutUint32(pkt[8:], crc32.Checksum(pkt, crc32.MakeTable(crc32.Castagnoli)))
	return pkt
}
