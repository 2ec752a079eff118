package firewall

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/knext-dev/knext/internal/nribridge/config"
	"github.com/knext-dev/knext/internal/nribridge/hostport"
	"github.com/knext-dev/knext/internal/nribridge/store"
)

func mustValidate(t *testing.T, doc string) *config.Settings {
	t.Helper()
	s, err := config.Load([]byte(doc), &config.Flags{})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func tcp(hostPort, containerPort int32, hostIP string) hostport.Mapping {
	return hostport.Mapping{Protocol: hostport.TCP, HostPort: hostPort, ContainerPort: containerPort, HostIP: hostIP}
}

func TestBuildRuleset(t *testing.T) {
	s := mustValidate(t, `{bridge: nribr0, ipv4: {subnet: 10.88.0.0/16}, ipv6: {subnet: "fd00:88::/64"}}`)
	dualStack := func(last string) []netip.Prefix {
		return []netip.Prefix{netip.MustParsePrefix("10.88.0." + last + "/16"), netip.MustParsePrefix("fd00:88::" + last + "/64")}
	}
	pods := []PublishedPod{ // rules come in pod ID order, whatever the order here
		{Pod: store.PodRef{ID: "bbb", Namespace: "ns", Name: "db"}, Addrs: dualStack("3"), Ports: []hostport.Mapping{
			{Protocol: hostport.SCTP, HostPort: 9000, ContainerPort: 9000, HostIP: "fd00:99::1"}, tcp(8443, 443, "127.0.0.1")}},
		{Pod: store.PodRef{ID: "aaa", Namespace: "ns", Name: "web"}, Addrs: dualStack("2"), Ports: []hostport.Mapping{
			tcp(8080, 80, ""), {Protocol: hostport.UDP, HostPort: 53, ContainerPort: 5353, HostIP: "0.0.0.0"}}},
	}
	rs := Build(s, pods, nil)
	want := `table inet nri-bridge-nribr0 {
	chain hostports {
		meta nfproto ipv4 tcp dport 8080 dnat ip to 10.88.0.2:80 comment "ns/web aaa"
		meta nfproto ipv6 tcp dport 8080 dnat ip6 to [fd00:88::2]:80 comment "ns/web aaa"
		meta nfproto ipv4 udp dport 53 dnat ip to 10.88.0.2:5353 comment "ns/web aaa"
		meta nfproto ipv6 ip6 daddr fd00:99::1 sctp dport 9000 dnat ip6 to [fd00:88::3]:9000 comment "ns/db bbb"
		meta nfproto ipv4 ip daddr 127.0.0.1 tcp dport 8443 dnat ip to 10.88.0.3:443 comment "ns/db bbb"
	}
	chain prerouting {
		type nat hook prerouting priority -100; policy accept;
		fib daddr type local jump hostports
	}
	chain output {
		type nat hook output priority -100; policy accept;
		meta nfproto ipv6 ip6 daddr ::1 return
		fib daddr type local jump hostports
	}
	chain postrouting {
		type nat hook postrouting priority 100; policy accept;
		meta nfproto ipv4 oifname "nribr0" ip saddr 10.88.0.0/16 ip daddr 10.88.0.2 tcp dport 80 ct status dnat masquerade comment "ns/web aaa"
		meta nfproto ipv6 oifname "nribr0" ip6 saddr fd00:88::/64 ip6 daddr fd00:88::2 tcp dport 80 ct status dnat masquerade comment "ns/web aaa"
		meta nfproto ipv4 oifname "nribr0" ip saddr 10.88.0.0/16 ip daddr 10.88.0.2 udp dport 5353 ct status dnat masquerade comment "ns/web aaa"
		meta nfproto ipv6 oifname "nribr0" ip6 saddr fd00:88::/64 ip6 daddr fd00:88::3 sctp dport 9000 ct status dnat masquerade comment "ns/db bbb"
		meta nfproto ipv4 oifname "nribr0" ip saddr 10.88.0.0/16 ip daddr 10.88.0.3 tcp dport 443 ct status dnat masquerade comment "ns/db bbb"
		meta nfproto ipv4 oifname "nribr0" ip saddr 127.0.0.0/8 masquerade comment "localhost to hostPorts"
	}
	chain localnet-guard {
		type filter hook prerouting priority -300; policy accept;
		meta nfproto ipv4 iifname "nribr0" ip daddr 127.0.0.0/8 drop comment "pods must not reach the node's localhost (route_localnet)"
	}
}
`
	if got := rs.String(); got != want {
		t.Errorf("ruleset:\n%s\nwant:\n%s", got, want)
	}
	if !rs.forward4 || !rs.forward6 || !rs.routeLocalnet {
		t.Errorf("forward4 %v, forward6 %v, routeLocalnet %v: want all", rs.forward4, rs.forward6, rs.routeLocalnet)
	}

	// IPv6 ports only: no IPv4 forwarding, no route_localnet, hence no guard either.
	v6only := []PublishedPod{{Pod: store.PodRef{ID: "ccc"}, Addrs: dualStack("4"), Ports: []hostport.Mapping{tcp(80, 80, "::")}}}
	rs = Build(s, v6only, nil)
	if rs.forward4 || !rs.forward6 || rs.routeLocalnet || strings.Contains(rs.String(), "ip daddr 127.0.0.0/8") {
		t.Errorf("IPv6-only hostPort: forward4 %v, forward6 %v, routeLocalnet %v:\n%s", rs.forward4, rs.forward6, rs.routeLocalnet, rs)
	}

	s.Masquerade = true
	rs = Build(s, nil, nil)
	want = `table inet nri-bridge-nribr0 {
	set cluster-v4 {
		type ipv4_addr
		flags interval
		elements = { 10.88.0.0/16 }
	}
	set cluster-v6 {
		type ipv6_addr
		flags interval
		elements = { fd00:88::/64 }
	}
	chain postrouting {
		type nat hook postrouting priority 100; policy accept;
		meta nfproto ipv4 ip saddr 10.88.0.0/16 ip daddr != @cluster-v4 masquerade comment "pods to outside the cluster's pod CIDRs"
		meta nfproto ipv6 ip6 saddr fd00:88::/64 ip6 daddr != @cluster-v6 masquerade comment "pods to outside the cluster's pod CIDRs"
	}
}
`
	if got := rs.String(); got != want || !rs.forward4 || !rs.forward6 || rs.routeLocalnet {
		t.Errorf("masquerade: forward4 %v, forward6 %v, routeLocalnet %v, ruleset:\n%s\nwant:\n%s", rs.forward4, rs.forward6, rs.routeLocalnet, got, want)
	}

	s.Masquerade = false
	if rs = Build(s, nil, nil); len(rs.chains) != 0 || rs.forward4 || rs.forward6 || rs.routeLocalnet {
		t.Errorf("nothing published, no masquerade: want no table, got\n%s", rs)
	}
}

// With masquerade, pod traffic to any pod CIDR of the cluster keeps its source: the node's own
// pod subnets, the configured clusterCIDRs and the other nodes' pod CIDRs are one set per family,
// in the fewest ranges (the kernel refuses overlapping intervals).
func TestBuildRulesetClusterCIDRs(t *testing.T) {
	s := mustValidate(t, `{bridge: nribr0, masquerade: true, clusterCIDRs: ["10.96.0.0/12", "fd00:96::/108"], ipv4: {subnet: 10.244.1.0/24}, ipv6: {subnet: "fd00:10:244:1::/64"}}`)
	nodes := []netip.Prefix{
		netip.MustParsePrefix("10.244.0.0/24"),        // adjacent to the node's own: merged
		netip.MustParsePrefix("10.244.2.0/24"),        // adjacent on the other side
		netip.MustParsePrefix("10.244.1.0/24"),        // the node's own again (a duplicate)
		netip.MustParsePrefix("10.97.0.0/16"),         // inside a clusterCIDR
		netip.MustParsePrefix("10.250.3.0/24"),        // apart
		netip.MustParsePrefix("fd00:10:244::/64"),     // adjacent to the own IPv6 subnet: a /63
		netip.MustParsePrefix("fd00:10:244:100::/64"), // apart
	}
	rs := Build(s, nil, nodes)
	want := `table inet nri-bridge-nribr0 {
	set cluster-v4 {
		type ipv4_addr
		flags interval
		elements = { 10.96.0.0/12, 10.244.0.0-10.244.2.255, 10.250.3.0/24 }
	}
	set cluster-v6 {
		type ipv6_addr
		flags interval
		elements = { fd00:10:244::/63, fd00:10:244:100::/64, fd00:96::/108 }
	}
	chain postrouting {
		type nat hook postrouting priority 100; policy accept;
		meta nfproto ipv4 ip saddr 10.244.1.0/24 ip daddr != @cluster-v4 masquerade comment "pods to outside the cluster's pod CIDRs"
		meta nfproto ipv6 ip6 saddr fd00:10:244:1::/64 ip6 daddr != @cluster-v6 masquerade comment "pods to outside the cluster's pod CIDRs"
	}
}
`
	if got := rs.String(); got != want {
		t.Errorf("ruleset:\n%s\nwant:\n%s", got, want)
	}
	// The interval set's elements: each range's first address, then the one after its last.
	var elements []string
	for _, e := range rs.sets[0].elements() {
		addr, _ := netip.AddrFromSlice(e.Key)
		elements = append(elements, fmt.Sprintf("%s end=%v", addr, e.IntervalEnd))
	}
	if got, want := strings.Join(elements, ", "), "10.96.0.0 end=false, 10.112.0.0 end=true, 10.244.0.0 end=false, 10.244.3.0 end=true, 10.250.3.0 end=false, 10.250.4.0 end=true"; got != want {
		t.Errorf("cluster-v4 elements %s, want %s", got, want)
	}

	// In cluster mode the pods' traffic is routed to the other nodes: forwarding is on even
	// without masquerade, and without masquerade there is no table.
	s = mustValidate(t, `{bridge: nribr0, ipv4: {subnet: 10.244.1.0/24}}`)
	s.Cluster = true
	if rs := Build(s, nil, nodes); len(rs.chains) != 0 || len(rs.sets) != 0 || !rs.forward4 || rs.forward6 {
		t.Errorf("cluster mode without masquerade: forward4 %v, forward6 %v, ruleset:\n%s", rs.forward4, rs.forward6, rs)
	}
}
