package main

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// bridgeNetwork wires pods to a Linux bridge with veth pairs through netlink.
type bridgeNetwork struct {
	settings *settings
	bridgeMu sync.Mutex // pods started concurrently must not race creating the bridge
}

// newHostNetwork refuses settings whose subnets the host already routes elsewhere.
func newHostNetwork(s *settings) (podNetwork, error) {
	routes, err := hostRoutes()
	if err != nil {
		return nil, err
	}
	if err := s.checkHostOverlap(routes); err != nil {
		return nil, err
	}
	return &bridgeNetwork{settings: s}, nil
}

// hostRoutes lists the host's routes in the main table, for checkHostOverlap.
func hostRoutes() ([]hostRoute, error) {
	routes, err := netlink.RouteList(nil, netlink.FAMILY_ALL)
	if err != nil {
		return nil, fmt.Errorf("listing host routes: %w", err)
	}
	names := map[int]string{}
	var result []hostRoute
	for _, r := range routes {
		if r.Dst == nil {
			continue
		}
		dst, ok := prefixFromIPNet(r.Dst)
		if !ok {
			continue
		}
		if _, known := names[r.LinkIndex]; !known {
			names[r.LinkIndex] = fmt.Sprintf("index %d", r.LinkIndex)
			if link, err := netlink.LinkByIndex(r.LinkIndex); err == nil {
				names[r.LinkIndex] = link.Attrs().Name
			}
		}
		result = append(result, hostRoute{dst: dst, dev: names[r.LinkIndex]})
	}
	return result, nil
}

func prefixFromIPNet(n *net.IPNet) (netip.Prefix, bool) {
	addr, ok := netip.AddrFromSlice(n.IP)
	if !ok {
		return netip.Prefix{}, false
	}
	ones, _ := n.Mask.Size()
	return netip.PrefixFrom(addr.Unmap(), ones), true
}

func ipNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

// netlinkAddr is an address to set; IPv6 skips duplicate address detection because the store
// guarantees uniqueness and DAD would keep the address unusable ("tentative") for a second or two.
func netlinkAddr(p netip.Prefix) *netlink.Addr {
	addr := &netlink.Addr{IPNet: ipNet(p)}
	if p.Addr().Is6() {
		addr.Flags = unix.IFA_F_NODAD
	}
	return addr
}

// ensureBridge creates the bridge if missing, puts the gateway addresses on it and brings it up.
func (n *bridgeNetwork) ensureBridge() (netlink.Link, error) {
	n.bridgeMu.Lock()
	defer n.bridgeMu.Unlock()
	name := n.settings.bridge
	link, err := netlink.LinkByName(name)
	if errors.As(err, &netlink.LinkNotFoundError{}) {
		br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: name, MTU: n.settings.mtu}}
		if err := netlink.LinkAdd(br); err != nil && !errors.Is(err, unix.EEXIST) {
			return nil, fmt.Errorf("creating bridge %s: %w", name, err)
		}
		link, err = netlink.LinkByName(name)
	}
	if err != nil {
		return nil, fmt.Errorf("bridge %s: %w", name, err)
	}
	if link.Type() != "bridge" {
		return nil, fmt.Errorf("bridge %s: the existing interface is a %s, not a bridge", name, link.Type())
	}
	for _, p := range n.settings.pools {
		if err := netlink.AddrReplace(link, netlinkAddr(p.gatewayPrefix())); err != nil {
			return nil, fmt.Errorf("bridge %s: setting gateway address %s: %w", name, p.gatewayPrefix(), err)
		}
	}
	if err := netlink.LinkSetUp(link); err != nil {
		return nil, fmt.Errorf("bridge %s: setting it up: %w", name, err)
	}
	return link, nil
}

// setup gives the pod its network: lo up, the pod interface (the peer of alloc.HostVeth, attached
// to the bridge) with the allocated addresses and, unless it is a secondary interface, default
// routes through the gateways. Replaying it for a pod that is already set up changes nothing.
func (n *bridgeNetwork) setup(alloc *allocation) error {
	podIfName := n.settings.podInterface
	bridge, err := n.ensureBridge()
	if err != nil {
		return err
	}
	ns, err := netns.GetFromPath(alloc.NetNS)
	if err != nil {
		return fmt.Errorf("opening network namespace %s: %w", alloc.NetNS, err)
	}
	defer ns.Close()
	podNL, err := netlink.NewHandleAt(ns, unix.NETLINK_ROUTE)
	if err != nil {
		return fmt.Errorf("netlink in network namespace %s: %w", alloc.NetNS, err)
	}
	defer podNL.Close()

	lo, err := podNL.LinkByName("lo")
	if err == nil {
		err = podNL.LinkSetUp(lo)
	}
	if err != nil {
		return fmt.Errorf("bringing up lo in %s: %w", alloc.NetNS, err)
	}

	hostVeth, podVeth, err := n.ensureVeth(podNL, ns, bridge, alloc)
	if err != nil {
		return err
	}
	if err := netlink.LinkSetMaster(hostVeth, bridge); err != nil {
		return fmt.Errorf("attaching %s to bridge %s: %w", alloc.HostVeth, bridge.Attrs().Name, err)
	}
	if err := netlink.LinkSetUp(hostVeth); err != nil {
		return fmt.Errorf("setting %s up: %w", alloc.HostVeth, err)
	}
	for _, addr := range alloc.Addrs {
		if err := podNL.AddrReplace(podVeth, netlinkAddr(addr)); err != nil {
			return fmt.Errorf("setting address %s on %s in %s: %w", addr, podIfName, alloc.NetNS, err)
		}
	}
	if err := podNL.LinkSetUp(podVeth); err != nil {
		return fmt.Errorf("setting %s up in %s: %w", podIfName, alloc.NetNS, err)
	}
	for _, p := range n.settings.defaultRoutePools() {
		if !hasAddrIn(alloc.Addrs, p.subnet) {
			continue
		}
		route := &netlink.Route{
			LinkIndex: podVeth.Attrs().Index,
			Dst:       ipNet(netip.PrefixFrom(netip.IPv6Unspecified(), 0)),
			Gw:        p.gateway.AsSlice(),
		}
		if p.gateway.Is4() {
			route.Dst = ipNet(netip.PrefixFrom(netip.IPv4Unspecified(), 0))
		}
		if err := podNL.RouteReplace(route); err != nil {
			return fmt.Errorf("setting default route via %s in %s: %w", p.gateway, alloc.NetNS, err)
		}
	}
	return nil
}

func hasAddrIn(addrs []netip.Prefix, subnet netip.Prefix) bool {
	for _, a := range addrs {
		if subnet.Contains(a.Addr()) {
			return true
		}
	}
	return false
}

// ensureVeth returns the pod's veth pair, creating it (the pod interface directly inside the pod
// netns) when the pod has no such interface yet.
func (n *bridgeNetwork) ensureVeth(podNL *netlink.Handle, ns netns.NsHandle, bridge netlink.Link,
	alloc *allocation) (host, pod netlink.Link, err error) {
	podIfName := n.settings.podInterface
	pod, err = podNL.LinkByName(podIfName)
	if err == nil {
		host, err = netlink.LinkByName(alloc.HostVeth)
		if err != nil || host.Attrs().Index != pod.Attrs().ParentIndex {
			return nil, nil, fmt.Errorf("network namespace %s already has an %s that is not the peer of %s",
				alloc.NetNS, podIfName, alloc.HostVeth)
		}
		return host, pod, nil
	}
	if !errors.As(err, &netlink.LinkNotFoundError{}) {
		return nil, nil, fmt.Errorf("looking up %s in %s: %w", podIfName, alloc.NetNS, err)
	}
	// A host end without its peer is left over from an interrupted setup: replace it.
	if err := n.deleteHostVeth(alloc.HostVeth); err != nil {
		return nil, nil, err
	}
	veth := &netlink.Veth{
		LinkAttrs: netlink.LinkAttrs{
			Name:        alloc.HostVeth,
			MTU:         n.settings.mtu,
			MasterIndex: bridge.Attrs().Index,
		},
		PeerName:      podIfName,
		PeerNamespace: netlink.NsFd(ns),
	}
	if err := netlink.LinkAdd(veth); err != nil {
		return nil, nil, fmt.Errorf("creating veth %s with peer %s in %s: %w", alloc.HostVeth, podIfName, alloc.NetNS, err)
	}
	if host, err = netlink.LinkByName(alloc.HostVeth); err != nil {
		return nil, nil, fmt.Errorf("veth %s: %w", alloc.HostVeth, err)
	}
	if pod, err = podNL.LinkByName(podIfName); err != nil {
		return nil, nil, fmt.Errorf("%s in %s: %w", podIfName, alloc.NetNS, err)
	}
	return host, pod, nil
}

// teardown removes the pod's veth pair (deleting the host end deletes the pod interface too).
// Nothing to do when the pair is already gone, e.g. because the pod's netns was destroyed.
func (n *bridgeNetwork) teardown(alloc *allocation) error {
	return n.deleteHostVeth(alloc.HostVeth)
}

func (n *bridgeNetwork) deleteHostVeth(name string) error {
	link, err := netlink.LinkByName(name)
	if errors.As(err, &netlink.LinkNotFoundError{}) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("looking up %s: %w", name, err)
	}
	if link.Type() != "veth" {
		return fmt.Errorf("refusing to delete %s: it is a %s, not a veth", name, link.Type())
	}
	if err := netlink.LinkDel(link); err != nil && !errors.As(err, &netlink.LinkNotFoundError{}) && !errors.Is(err, unix.ENODEV) {
		return fmt.Errorf("deleting %s: %w", name, err)
	}
	return nil
}
