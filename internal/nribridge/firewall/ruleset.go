// Package firewall is nri-bridge's packet filter: one nftables table of its own for the pods'
// hostPorts and their masquerade, built from the store and the configuration.
package firewall

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/google/nftables/expr"

	"github.com/knext-dev/knext/internal/nribridge/config"
	"github.com/knext-dev/knext/internal/nribridge/hostport"
	"github.com/knext-dev/knext/internal/nribridge/store"
)

// The host side of hostPorts and egress is one nftables table of the inet family that belongs
// to nri-bridge alone: every change replaces its whole content (in one atomic transaction), so
// the table always says exactly what the store says, whatever happened to it in between.
//
// This file builds the table's content from the configuration and the pods (pure, unit-tested);
// nftables_linux.go turns it into netlink messages and applies it.

// TableName is the nftables table of the nri-bridge instance that owns bridge: one per bridge,
// so instances on different bridges never touch each other's rules.
func TableName(bridge string) string {
	return "nri-bridge-" + bridge
}

// PublishedPod is what the rules need of a pod: its addresses and the ports it publishes.
type PublishedPod struct {
	Pod   store.PodRef
	Addrs []netip.Prefix
	Ports []hostport.Mapping
}

// Ruleset is the content of the table, and the host settings it needs.
type Ruleset struct {
	table  string
	sets   []*addrSet
	chains []*chain // in creation order: a chain comes before the chains that jump to it
	// forward4 and forward6 tell that traffic of the family is forwarded (DNAT to pods, egress
	// of pods): the family's forwarding must be on.
	forward4, forward6 bool
	// routeLocalnet tells that 127.0.0.0/8 is DNATed to pods: the bridge needs route_localnet.
	routeLocalnet bool
}

// addrSet is a named set of address ranges of one family, as rules look them up.
type addrSet struct {
	name   string
	is4    bool
	ranges []addrRange // sorted, neither overlapping nor adjacent
}

// addrRange is the addresses from first to last, both included.
type addrRange struct{ first, last netip.Addr }

// newAddrSet returns the set of the addresses of prefixes, all of one family, as the fewest
// ranges: the kernel refuses overlapping intervals.
func newAddrSet(name string, is4 bool, prefixes []netip.Prefix) *addrSet {
	set := &addrSet{name: name, is4: is4}
	for _, p := range prefixes {
		set.ranges = append(set.ranges, addrRange{p.Masked().Addr(), config.LastAddr(p)})
	}
	slices.SortFunc(set.ranges, func(a, b addrRange) int { return a.first.Compare(b.first) })
	merged := set.ranges[:0]
	for _, r := range set.ranges {
		if n := len(merged); n > 0 {
			if prev := &merged[n-1]; !prev.last.Next().IsValid() || r.first.Compare(prev.last.Next()) <= 0 {
				if r.last.Compare(prev.last) > 0 {
					prev.last = r.last
				}
				continue
			}
		}
		merged = append(merged, r)
	}
	set.ranges = merged
	return set
}

// String renders the range as nft shows it: as a prefix when it is one.
func (r addrRange) String() string {
	for bits := 0; bits <= r.first.BitLen(); bits++ {
		if p := netip.PrefixFrom(r.first, bits); p.Masked().Addr() == r.first && config.LastAddr(p) == r.last {
			if p.IsSingleIP() {
				return r.first.String()
			}
			return p.String()
		}
	}
	return r.first.String() + "-" + r.last.String()
}

// chain is a chain of the table; hook is nil for a chain that is only jumped to.
type chain struct {
	name  string
	hook  *chainHook
	rules []rule
}

type chainHook struct {
	kind     string // "nat" or "filter"
	hook     string // "prerouting", "output" or "postrouting"
	priority int32
}

// Chain priorities, as nft names them.
const (
	priorityRaw    = -300
	priorityDstNAT = -100
	prioritySrcNAT = 100
)

type rule struct {
	matches []match
	verdict verdict
	comment string
}

// match is one condition of a rule; verdict is what a rule does with a matching packet.
// Both render as nft prints them and translate to nftables expressions (nftables_linux.go).
type match interface {
	String() string
	exprs() []expr.Any
}

type verdict interface {
	String() string
	exprs() []expr.Any
}

// nfproto matches the packets of one family (the table is of the inet family).
type nfproto struct{ is4 bool }

func (m nfproto) String() string {
	if m.is4 {
		return "meta nfproto ipv4"
	}
	return "meta nfproto ipv6"
}

// addrMatch matches the packet's source or destination address against a prefix.
type addrMatch struct {
	source bool
	not    bool
	prefix netip.Prefix
}

func (m addrMatch) String() string {
	family, dir, op := "ip6", "daddr", ""
	if m.prefix.Addr().Is4() {
		family = "ip"
	}
	if m.source {
		dir = "saddr"
	}
	if m.not {
		op = "!= "
	}
	value := m.prefix.String()
	if m.prefix.IsSingleIP() {
		value = m.prefix.Addr().String()
	}
	return fmt.Sprintf("%s %s %s%s", family, dir, op, value)
}

// inSet matches the packet's destination address against a set, or its absence from it.
type inSet struct {
	set *addrSet
	not bool
}

func (m inSet) String() string {
	family, op := "ip6", ""
	if m.set.is4 {
		family = "ip"
	}
	if m.not {
		op = "!= "
	}
	return fmt.Sprintf("%s daddr %s@%s", family, op, m.set.name)
}

// portMatch matches the transport protocol and the destination port.
type portMatch struct {
	proto hostport.Protocol
	port  uint16
}

func (m portMatch) String() string {
	return fmt.Sprintf("%s dport %d", strings.ToLower(string(m.proto)), m.port)
}

// ifMatch matches the input or output interface by name.
type ifMatch struct {
	output bool
	name   string
}

func (m ifMatch) String() string {
	if m.output {
		return fmt.Sprintf("oifname %q", m.name)
	}
	return fmt.Sprintf("iifname %q", m.name)
}

// localDst matches packets to an address of the node (any interface, loopback included).
type localDst struct{}

func (localDst) String() string { return "fib daddr type local" }

// ctDNAT matches packets of connections whose destination was translated.
type ctDNAT struct{}

func (ctDNAT) String() string { return "ct status dnat" }

type jump struct{ chain string }

func (v jump) String() string { return "jump " + v.chain }

type dnat struct{ to netip.AddrPort }

func (v dnat) String() string {
	family := "ip6"
	if v.to.Addr().Is4() {
		family = "ip"
	}
	return fmt.Sprintf("dnat %s to %s", family, v.to)
}

type ret struct{}

func (ret) String() string { return "return" }

type masquerade struct{}

func (masquerade) String() string { return "masquerade" }

type drop struct{}

func (drop) String() string { return "drop" }

// loopback4 is where IPv4 localhost traffic comes from and goes to.
var loopback4 = netip.MustParsePrefix("127.0.0.0/8")

// loopback6 is IPv6 localhost: IPv6 has no route_localnet, a packet from ::1 never leaves the
// node, so ::1 is not DNATed (the node's own answer beats a black hole).
var loopback6 = netip.MustParsePrefix("::1/128")

// Chains of the table.
const (
	chainHostPorts   = "hostports"   // DNAT of each published port to its pod
	chainPrerouting  = "prerouting"  // traffic arriving for a node address (other hosts, pods)
	chainOutput      = "output"      // traffic of the node itself to its own addresses
	chainPostrouting = "postrouting" // masquerading
	chainGuard       = "localnet-guard"
)

// Build returns the table content for the configuration, the pods and the cluster's pod CIDRs
// beyond the node's own pod subnets (cluster mode: the other nodes' spec.podCIDRs):
//
//   - hostports: for each published port and each family of the pod, DNAT of the port on the
//     host addresses the mapping names to the pod's address and container port. prerouting
//     (other hosts, pods) and output (the node itself, but not to ::1) jump there for packets to
//     a node address.
//   - postrouting: masquerade of the DNATed connections that would otherwise fail: those from a
//     pod of the bridge (hairpin: a pod reaching itself or another pod through a hostPort; the
//     reply would bypass the host's NAT), and IPv4 localhost (127.0.0.1 cannot leave the host),
//     with the egress masquerade when configured: of pod traffic to outside the cluster's pod
//     CIDRs (the sets cluster-v4 and cluster-v6 of the node's pod subnets, the configured
//     clusterCIDRs and clusterPodCIDRs), so that traffic between pods, on this node or
//     another, keeps its source address.
//   - localnet-guard: localhost DNAT needs route_localnet on the bridge, which would also let
//     pods reach the node's 127.0.0.0/8 services; packets from the bridge to 127.0.0.0/8 are
//     dropped before conntrack (replies to a localhost client arrive with the gateway address).
//
// An empty ruleset (no published port, no masquerade) means no table at all. In cluster mode the
// pods' traffic of each family is forwarded to the other nodes, table or not.
func Build(s *config.Settings, pods []PublishedPod, clusterPodCIDRs []netip.Prefix) *Ruleset {
	rs := &Ruleset{table: TableName(s.Bridge)}
	subnetOf := func(addr netip.Addr) netip.Prefix {
		for _, p := range s.Pools {
			if p.Subnet.Contains(addr) {
				return p.Subnet
			}
		}
		return netip.PrefixFrom(addr, addr.BitLen())
	}
	bridgeOut := ifMatch{output: true, name: s.Bridge}

	var dnats, hairpins []rule
	var dnat4, dnat6 bool
	pods = slices.Clone(pods)
	slices.SortFunc(pods, func(a, b PublishedPod) int { return strings.Compare(a.Pod.ID, b.Pod.ID) })
	for _, pod := range pods {
		comment := ruleComment(pod.Pod)
		for _, m := range pod.Ports {
			for _, addr := range pod.Addrs {
				podAddr := addr.Addr()
				if !m.PublishesFamily(podAddr.Is4()) {
					continue
				}
				family := nfproto{is4: podAddr.Is4()}
				matches := []match{family}
				if host := m.HostAddr(); host.IsValid() {
					matches = append(matches, addrMatch{prefix: netip.PrefixFrom(host, host.BitLen())})
				}
				matches = append(matches, portMatch{m.Protocol, uint16(m.HostPort)})
				to := netip.AddrPortFrom(podAddr, uint16(m.ContainerPort))
				dnats = append(dnats, rule{matches: matches, verdict: dnat{to}, comment: comment})
				hairpins = append(hairpins, rule{matches: []match{family, bridgeOut,
					addrMatch{source: true, prefix: subnetOf(podAddr)},
					addrMatch{prefix: netip.PrefixFrom(podAddr, podAddr.BitLen())},
					portMatch{m.Protocol, uint16(m.ContainerPort)}, ctDNAT{},
				}, verdict: masquerade{}, comment: comment})
				if podAddr.Is4() {
					dnat4 = true
				} else {
					dnat6 = true
				}
			}
		}
	}

	rs.forward4, rs.forward6, rs.routeLocalnet = dnat4, dnat6, dnat4
	postrouting := hairpins
	if dnat4 {
		postrouting = append(postrouting, rule{matches: []match{nfproto{is4: true}, bridgeOut,
			addrMatch{source: true, prefix: loopback4}}, verdict: masquerade{}, comment: "localhost to hostPorts"})
	}
	if s.Masquerade {
		cluster := slices.Concat(clusterPodCIDRs, s.ClusterCIDRs)
		for _, p := range s.Pools {
			is4 := p.Subnet.Addr().Is4()
			family := []netip.Prefix{p.Subnet}
			for _, cidr := range cluster {
				if cidr.Addr().Is4() == is4 {
					family = append(family, cidr)
				}
			}
			set := newAddrSet(clusterSetName(is4), is4, family)
			rs.sets = append(rs.sets, set)
			postrouting = append(postrouting, rule{matches: []match{nfproto{is4: is4},
				addrMatch{source: true, prefix: p.Subnet}, inSet{set: set, not: true}},
				verdict: masquerade{}, comment: "pods to outside the cluster's pod CIDRs"})
		}
	}
	for _, p := range s.Pools {
		if s.Masquerade || s.Cluster {
			if p.Subnet.Addr().Is4() {
				rs.forward4 = true
			} else {
				rs.forward6 = true
			}
		}
	}

	if len(dnats) > 0 {
		toHostPorts := rule{matches: []match{localDst{}}, verdict: jump{chainHostPorts}}
		output := []rule{toHostPorts}
		if dnat6 {
			output = []rule{{matches: []match{nfproto{is4: false}, addrMatch{prefix: loopback6}}, verdict: ret{}}, toHostPorts}
		}
		rs.chains = append(rs.chains,
			&chain{name: chainHostPorts, rules: dnats},
			&chain{name: chainPrerouting, hook: &chainHook{"nat", "prerouting", priorityDstNAT}, rules: []rule{toHostPorts}},
			&chain{name: chainOutput, hook: &chainHook{"nat", "output", priorityDstNAT}, rules: output})
	}
	if len(postrouting) > 0 {
		rs.chains = append(rs.chains, &chain{name: chainPostrouting, hook: &chainHook{"nat", "postrouting", prioritySrcNAT}, rules: postrouting})
	}
	if dnat4 {
		rs.chains = append(rs.chains, &chain{name: chainGuard, hook: &chainHook{"filter", "prerouting", priorityRaw},
			rules: []rule{{matches: []match{nfproto{is4: true}, ifMatch{name: s.Bridge}, addrMatch{prefix: loopback4}},
				verdict: drop{}, comment: "pods must not reach the node's localhost (route_localnet)"}}})
	}
	return rs
}

// clusterSetName names the set of the cluster's pod CIDRs of a family.
func clusterSetName(is4 bool) string {
	if is4 {
		return "cluster-v4"
	}
	return "cluster-v6"
}

// maxCommentLen is nft's limit on rule comments.
const maxCommentLen = 128

// ruleComment names the pod a rule is for, for whoever lists the table.
func ruleComment(pod store.PodRef) string {
	comment := fmt.Sprintf("%s/%s %s", pod.Namespace, pod.Name, pod.ID)
	if len(comment) > maxCommentLen {
		comment = comment[:maxCommentLen]
	}
	return comment
}

// String renders the ruleset the way `nft list table` shows it (with the family of each
// rule spelled out).
func (rs *Ruleset) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "table inet %s {\n", rs.table)
	for _, set := range rs.sets {
		kind := "ipv6_addr"
		if set.is4 {
			kind = "ipv4_addr"
		}
		elements := make([]string, len(set.ranges))
		for i, r := range set.ranges {
			elements[i] = r.String()
		}
		fmt.Fprintf(&b, "\tset %s {\n\t\ttype %s\n\t\tflags interval\n\t\telements = { %s }\n\t}\n",
			set.name, kind, strings.Join(elements, ", "))
	}
	for _, c := range rs.chains {
		fmt.Fprintf(&b, "\tchain %s {\n", c.name)
		if c.hook != nil {
			fmt.Fprintf(&b, "\t\ttype %s hook %s priority %d; policy accept;\n", c.hook.kind, c.hook.hook, c.hook.priority)
		}
		for _, r := range c.rules {
			fmt.Fprintf(&b, "\t\t%s\n", r)
		}
		b.WriteString("\t}\n")
	}
	b.WriteString("}\n")
	return b.String()
}

func (r rule) String() string {
	parts := make([]string, 0, len(r.matches)+2)
	for _, m := range r.matches {
		parts = append(parts, m.String())
	}
	parts = append(parts, r.verdict.String())
	if r.comment != "" {
		parts = append(parts, fmt.Sprintf("comment %q", r.comment))
	}
	return strings.Join(parts, " ")
}
