// Package cluster makes nri-bridge a cluster network, as kindnet is for kind: it watches the
// Nodes through the API server (client-go informers), learns its own node's pod CIDRs
// (spec.podCIDRs) and keeps a route to every other node's pod CIDRs through that node's
// InternalIP of the same family. What it learns and the routes it makes are kept in the store,
// so that the node keeps its network while the API server is unreachable: the API server is
// not on the pod path.
package cluster

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/knext-dev/knext/internal/nribridge/store"
)

// nodeOf reads what nri-bridge needs of a Node: its pod CIDRs and InternalIPs. Values that do
// not parse are left out and described in problems.
func nodeOf(n *corev1.Node) (node store.Node, problems []string) {
	node.Name = n.Name
	for _, text := range n.Spec.PodCIDRs {
		cidr, err := netip.ParsePrefix(text)
		if err != nil || cidr.Masked() != cidr {
			problems = append(problems, fmt.Sprintf("spec.podCIDRs %q is not a CIDR subnet", text))
			continue
		}
		node.PodCIDRs = append(node.PodCIDRs, cidr)
	}
	for _, address := range n.Status.Addresses {
		if address.Type != corev1.NodeInternalIP {
			continue
		}
		addr, err := netip.ParseAddr(address.Address)
		if err != nil {
			problems = append(problems, fmt.Sprintf("InternalIP %q is not an IP address", address.Address))
			continue
		}
		node.InternalIPs = append(node.InternalIPs, addr.Unmap())
	}
	return node, problems
}

// stripNode keeps of a Node what nodeOf reads, so that the informer's cache does not hold every
// node's images and conditions.
func stripNode(obj any) (any, error) {
	n, ok := obj.(*corev1.Node)
	if !ok {
		return obj, nil // a tombstone of a deleted Node
	}
	stripped := &corev1.Node{}
	stripped.Name, stripped.UID, stripped.ResourceVersion = n.Name, n.UID, n.ResourceVersion
	stripped.Spec.PodCIDRs = n.Spec.PodCIDRs
	stripped.Status.Addresses = n.Status.Addresses
	return stripped, nil
}

// wantedRoutes are the routes to the other nodes' pod CIDRs: each through the node's first
// InternalIP of the CIDR's family. A CIDR without such an address, one that overlaps this node's
// own pod CIDRs or that another node has already claimed gets no route, and is described in
// problems (by destination).
func wantedRoutes(state *store.ClusterState) (routes []store.Route, problems map[netip.Prefix]string) {
	problems = map[netip.Prefix]string{}
	claimed := map[netip.Prefix]string{}
	for _, node := range state.Nodes {
		for _, cidr := range node.PodCIDRs {
			if own := overlapping(state.PodCIDRs, cidr); own.IsValid() {
				problems[cidr] = fmt.Sprintf("node %s's pod CIDR %s overlaps this node's %s: no route", node.Name, cidr, own)
				continue
			}
			if other, taken := claimed[cidr]; taken {
				problems[cidr] = fmt.Sprintf("node %s's pod CIDR %s is node %s's too: routed to %s", node.Name, cidr, other, other)
				continue
			}
			i := slices.IndexFunc(node.InternalIPs, func(a netip.Addr) bool { return a.Is4() == cidr.Addr().Is4() })
			if i < 0 {
				problems[cidr] = fmt.Sprintf("node %s has no %s InternalIP: no route to its pod CIDR %s", node.Name, familyOf(cidr), cidr)
				continue
			}
			claimed[cidr] = node.Name
			routes = append(routes, store.Route{Node: node.Name, Dst: cidr, Gw: node.InternalIPs[i]})
		}
	}
	sortRoutes(routes)
	return routes, problems
}

// overlapping returns the prefix of prefixes that overlaps p, invalid for none.
func overlapping(prefixes []netip.Prefix, p netip.Prefix) netip.Prefix {
	for _, q := range prefixes {
		if q.Overlaps(p) {
			return q
		}
	}
	return netip.Prefix{}
}

func familyOf(p netip.Prefix) string {
	if p.Addr().Is4() {
		return "IPv4"
	}
	return "IPv6"
}

func sortRoutes(routes []store.Route) {
	slices.SortFunc(routes, func(a, b store.Route) int {
		if c := a.Dst.Addr().Compare(b.Dst.Addr()); c != 0 {
			return c
		}
		if c := a.Dst.Bits() - b.Dst.Bits(); c != 0 {
			return c
		}
		return strings.Compare(a.Gw.String(), b.Gw.String())
	})
}

// podCIDRsOf are the pod CIDRs of nodes.
func podCIDRsOf(nodes []store.Node) []netip.Prefix {
	var cidrs []netip.Prefix
	for _, n := range nodes {
		cidrs = append(cidrs, n.PodCIDRs...)
	}
	return cidrs
}
