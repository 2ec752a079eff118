package plugin

import (
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/knext-dev/knext/internal/nribridge/wiring"
	"github.com/knext-dev/knext/test/netnstest"
)

// kubeProxyTable stands for kube-proxy's rules of a Service with one endpoint, as its nftables
// mode writes them in tables of its own: traffic to the Service's address and port is DNATed to
// the endpoint, and the endpoint's own traffic to the Service (hairpin) is marked in prerouting
// and masqueraded in postrouting, so that the endpoint sees the connection come from the node
// rather than from its own address. It is applied with nft, kube-proxy's own tool, and deleted
// when the test ends.
func kubeProxyTable(t *testing.T, service, endpoint netip.AddrPort, clients netip.Prefix) {
	t.Helper()
	if _, err := exec.LookPath("nft"); err != nil {
		t.Fatal("nft is missing (apt-get install nftables, as script/ci/install-deps.sh does): the test applies kube-proxy-like rules with it")
	}
	family := "ip"
	if service.Addr().Is6() {
		family = "ip6"
	}
	name := "nbt-kube-proxy-" + netnstest.RandomHex(t, 8)
	rules := fmt.Sprintf(`table %[1]s %[2]s {
	chain services {
		type nat hook prerouting priority dstnat; policy accept;
		%[1]s saddr %[5]s %[1]s daddr %[3]s tcp dport %[6]d %[1]s saddr %[4]s meta mark set 0x4000
		%[1]s saddr %[5]s %[1]s daddr %[3]s tcp dport %[6]d dnat to %[7]s
	}
	chain masquerading {
		type nat hook postrouting priority srcnat; policy accept;
		meta mark 0x4000 masquerade
	}
}
`, family, name, service.Addr(), endpoint.Addr(), clients, service.Port(), endpoint)
	cmd := exec.Command("nft", "-f", "-")
	cmd.Stdin = strings.NewReader(rules)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("nft -f:\n%s\n%v: %s", rules, err, out)
	}
	t.Cleanup(func() { exec.Command("nft", "delete", "table", family, name).Run() })
}

// A pod reaches itself through a Service (kube-proxy's DNAT to its own address): the bridge
// port of every pod, not only of those with hostPorts, is in hairpin mode. With br_netfilter
// (bridge-nf-call-iptables = 1, as here and on most Kubernetes nodes) the DNAT happens while the
// bridge forwards the frame, which must go back out of the port it came in on: without hairpin
// mode the connection fails, which the test checks too. nri-bridge's own table and kube-proxy's
// are separate tables: neither touches the other's rules.
func TestNetnsServiceHairpin(t *testing.T) {
	requireRoot(t)
	p, s := newNetnsPlugin(t)
	pod, _ := newNetns(t, "endpoint")
	if _, err := p.RunPodSandbox(ctx, pod); err != nil {
		t.Fatal(err)
	}
	ips := strings.Split(podIPsOK(t, p, pod), ",")
	port := int(netnstest.Port(t))
	netnstest.Serve(t, podNetNS(pod), "tcp4", port, "endpoint")
	netnstest.Serve(t, podNetNS(pod), "tcp6", port, "endpoint")
	services := []netip.AddrPort{ // never routed: 198.18.0.0/15, and a ULA
		netip.AddrPortFrom(netip.MustParseAddr("198.19.0."+fmt.Sprint(2+port%250)), 80),
		netip.AddrPortFrom(netip.MustParseAddr(fmt.Sprintf("fd%s::%x", netnstest.RandomHex(t, 2), port)), 80),
	}
	for i, service := range services {
		endpoint := netip.AddrPortFrom(netip.MustParseAddr(ips[i]), uint16(port))
		kubeProxyTable(t, service, endpoint, s.Pools[i].Subnet)
	}

	hostVeth, err := netlink.LinkByName(wiring.HostVethName(pod.Id))
	if err != nil {
		t.Fatal(err)
	}
	if info, err := netlink.LinkGetProtinfo(hostVeth); err != nil || !info.Hairpin {
		t.Fatalf("bridge port %s of a pod without hostPorts: hairpin %v (%v), want on", hostVeth.Attrs().Name, info.Hairpin, err)
	}
	for i, network := range []string{"tcp4", "tcp6"} {
		got, err := netnstest.Ask(podNetNS(pod), network, services[i].String())
		if want := "endpoint saw " + s.Pools[i].Gateway.String(); err != nil || got != want {
			t.Errorf("the pod through its own Service %s: got %q (%v), want %q", services[i], got, err, want)
		}
	}

	for _, sysctl := range []string{"bridge-nf-call-iptables", "bridge-nf-call-ip6tables"} {
		if value, err := os.ReadFile("/proc/sys/net/bridge/" + sysctl); err != nil || strings.TrimSpace(string(value)) != "1" {
			t.Logf("net.bridge.%s is %q (%v): without br_netfilter the DNAT is routed, and hairpin mode is not needed; not checking the connection without it",
				sysctl, strings.TrimSpace(string(value)), err)
			return
		}
	}
	if err := netlink.LinkSetHairpin(hostVeth, false); err != nil {
		t.Fatal(err)
	}
	for i, network := range []string{"tcp4", "tcp6"} {
		if got, err := netnstest.Ask(podNetNS(pod), network, services[i].String()); err == nil {
			t.Errorf("without hairpin mode the pod reached itself through %s (%q): the test does not test hairpin mode", services[i], got)
		}
	}
}
