// Package wiring connects pods to the node: a Linux bridge with the pools' gateways, and for
// each pod a veth pair between its network namespace and the bridge, with its addresses and
// default routes, all through netlink.
package wiring

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"sync"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/knext-dev/knext/internal/nribridge/config"
	"github.com/knext-dev/knext/internal/nribridge/store"
)

// HostVethPrefix starts the host-side name of every pod veth.
const HostVethPrefix = "nbr"

// HostVethName derives a stable interface name from the sandbox ID (sandbox IDs are too long
// for IFNAMSIZ).
func HostVethName(sandboxID string) string {
	sum := sha256.Sum256([]byte(sandboxID))
	return HostVethPrefix + hex.EncodeToString(sum[:])[:config.MaxIfNameLen-len(HostVethPrefix)]
}

// Network wires pods to a Linux bridge with veth pairs through netlink.
type Network struct {
	settings *config.Settings
	bridgeMu sync.Mutex // pods started concurrently must not race creating the bridge
	// bridge is the bridge as ensureBridge last left it (gateways set, up), nil until then and
	// after a pod's wiring failed: the bridge is set up once, not for every pod.
	bridge netlink.Link
}

// New refuses settings whose subnets the host already routes elsewhere.
func New(s *config.Settings) (*Network, error) {
	routes, err := hostRoutes()
	if err != nil {
		return nil, err
	}
	if err := s.CheckHostOverlap(routes); err != nil {
		return nil, err
	}
	return &Network{settings: s}, nil
}

// hostRoutes lists the host's routes in the main table, for Settings.CheckHostOverlap.
func hostRoutes() ([]config.HostRoute, error) {
	routes, err := netlink.RouteList(nil, netlink.FAMILY_ALL)
	if err != nil {
		return nil, fmt.Errorf("listing host routes: %w", err)
	}
	names := map[int]string{}
	var result []config.HostRoute
	for _, r := range routes {
		if r.Dst == nil {
			continue
		}
		dst, ok := PrefixOf(r.Dst)
		if !ok {
			continue
		}
		if _, known := names[r.LinkIndex]; !known {
			names[r.LinkIndex] = fmt.Sprintf("index %d", r.LinkIndex)
			if link, err := netlink.LinkByIndex(r.LinkIndex); err == nil {
				names[r.LinkIndex] = link.Attrs().Name
			}
		}
		result = append(result, config.HostRoute{Dst: dst, Dev: names[r.LinkIndex]})
	}
	return result, nil
}

// PrefixOf is the prefix of a netlink address or route destination.
func PrefixOf(n *net.IPNet) (netip.Prefix, bool) {
	addr, ok := netip.AddrFromSlice(n.IP)
	if !ok {
		return netip.Prefix{}, false
	}
	ones, _ := n.Mask.Size()
	return netip.PrefixFrom(addr.Unmap(), ones), true
}

// IPNet is a prefix as netlink takes it.
func IPNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

// NetlinkAddr is an address to set; IPv6 skips duplicate address detection because the store
// guarantees uniqueness and DAD would keep the address unusable ("tentative") for a second or two.
func NetlinkAddr(p netip.Prefix) *netlink.Addr {
	addr := &netlink.Addr{IPNet: IPNet(p)}
	if p.Addr().Is6() {
		addr.Flags = unix.IFA_F_NODAD
	}
	return addr
}

// ensuredBridge returns the bridge, ensuring it the first time and after forgetBridge.
func (n *Network) ensuredBridge() (netlink.Link, error) {
	n.bridgeMu.Lock()
	defer n.bridgeMu.Unlock()
	if n.bridge == nil {
		link, err := n.ensureBridge()
		if err != nil {
			return nil, err
		}
		n.bridge = link
	}
	return n.bridge, nil
}

// EnsureBridge sets the bridge up as Setup does before wiring its first pod, its MAC address
// pinned: for the pods an earlier nri-bridge wired on a bridge it did not pin.
func (n *Network) EnsureBridge() error {
	_, err := n.ensuredBridge()
	return err
}

// forgetBridge makes the next ensuredBridge check and repair the bridge again.
func (n *Network) forgetBridge() {
	n.bridgeMu.Lock()
	defer n.bridgeMu.Unlock()
	n.bridge = nil
}

// ensureBridge creates the bridge if missing, pins its MAC address, puts the gateway addresses on
// it and brings it up.
func (n *Network) ensureBridge() (netlink.Link, error) {
	name := n.settings.Bridge
	link, err := netlink.LinkByName(name)
	if errors.As(err, &netlink.LinkNotFoundError{}) {
		br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: name, MTU: n.settings.MTU}}
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
	// A bridge whose address was never set takes its lowest port's and changes it as pods come and
	// go, stranding the pods that resolved the gateway until their neighbour entry expires. Setting
	// the current one pins it; a bridge emptied of ports has all zeros, which cannot be set, and no
	// pod that resolved it.
	mac := link.Attrs().HardwareAddr
	if len(mac) == 0 || slices.Max(mac) == 0 {
		mac = make(net.HardwareAddr, 6)
		rand.Read(mac)
		mac[0] = mac[0]&0xfe | 0x02 // unicast, locally administered
	}
	if err := netlink.LinkSetHardwareAddr(link, mac); err != nil {
		return nil, fmt.Errorf("bridge %s: pinning its MAC address %s: %w", name, mac, err)
	}
	for _, p := range n.settings.Pools {
		if err := netlink.AddrReplace(link, NetlinkAddr(p.GatewayPrefix())); err != nil {
			return nil, fmt.Errorf("bridge %s: setting gateway address %s: %w", name, p.GatewayPrefix(), err)
		}
	}
	if err := netlink.LinkSetUp(link); err != nil {
		return nil, fmt.Errorf("bridge %s: setting it up: %w", name, err)
	}
	return link, nil
}

// Setup gives the pod its network: lo up, the pod interface (the peer of alloc.HostVeth, attached
// to the bridge) with the allocated addresses and, unless it is a secondary interface, default
// routes through the gateways. Replaying it for a pod that is already set up changes nothing. The
// bridge is checked and repaired only when it was never ensured, or when wiring fails (it may have
// been deleted or changed meanwhile): then once more after repairing it.
func (n *Network) Setup(alloc *store.Allocation) error {
	bridge, err := n.ensuredBridge()
	if err != nil {
		return err
	}
	if err = n.wire(alloc, bridge); err == nil {
		return nil
	}
	n.forgetBridge()
	if bridge, ensureErr := n.ensuredBridge(); ensureErr == nil {
		return n.wire(alloc, bridge)
	}
	return err
}

// wire connects the pod's netns to bridge.
func (n *Network) wire(alloc *store.Allocation, bridge netlink.Link) error {
	podIfName := n.settings.PodInterface
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

	// Every network namespace's lo has the ifindex LOOPBACK_IFINDEX: no lookup needed.
	if err := podNL.LinkSetUp(&netlink.Device{LinkAttrs: netlink.LinkAttrs{Name: "lo", Index: loopbackIfIndex}}); err != nil {
		return fmt.Errorf("bringing up lo in %s: %w", alloc.NetNS, err)
	}
	podVeth, err := n.ensureVeth(podNL, ns, bridge, alloc)
	if err != nil {
		return err
	}
	for _, addr := range alloc.Addrs {
		if err := podNL.AddrReplace(podVeth, NetlinkAddr(addr)); err != nil {
			return fmt.Errorf("setting address %s on %s in %s: %w", addr, podIfName, alloc.NetNS, err)
		}
	}
	if err := podNL.LinkSetUp(podVeth); err != nil {
		return fmt.Errorf("setting %s up in %s: %w", podIfName, alloc.NetNS, err)
	}
	for _, p := range n.settings.DefaultRoutePools() {
		if !hasAddrIn(alloc.Addrs, p.Subnet) {
			continue
		}
		route := &netlink.Route{
			LinkIndex: podVeth.Attrs().Index,
			Dst:       IPNet(netip.PrefixFrom(netip.IPv6Unspecified(), 0)),
			Gw:        p.Gateway.AsSlice(),
		}
		if p.Gateway.Is4() {
			route.Dst = IPNet(netip.PrefixFrom(netip.IPv4Unspecified(), 0))
		}
		if err := podNL.RouteReplace(route); err != nil {
			return fmt.Errorf("setting default route via %s in %s: %w", p.Gateway, alloc.NetNS, err)
		}
	}
	return nil
}

// loopbackIfIndex is the kernel's LOOPBACK_IFINDEX, lo's ifindex in every network namespace.
const loopbackIfIndex = 1

func hasAddrIn(addrs []netip.Prefix, subnet netip.Prefix) bool {
	for _, a := range addrs {
		if subnet.Contains(a.Addr()) {
			return true
		}
	}
	return false
}

// ensureVeth returns the pod end of the pod's veth pair, whose host end is up, attached to
// bridge and in hairpin mode, creating the pair (the pod interface directly inside the pod netns)
// when the pod has no such interface yet.
func (n *Network) ensureVeth(podNL *netlink.Handle, ns netns.NsHandle, bridge netlink.Link, alloc *store.Allocation) (netlink.Link, error) {
	podIfName := n.settings.PodInterface
	pod, err := podNL.LinkByName(podIfName)
	if err == nil { // a replay: check the pair, attach and bring up its host end again
		host, err := netlink.LinkByName(alloc.HostVeth)
		if err != nil || host.Attrs().Index != pod.Attrs().ParentIndex {
			return nil, fmt.Errorf("network namespace %s already has an %s that is not the peer of %s",
				alloc.NetNS, podIfName, alloc.HostVeth)
		}
		if err := netlink.LinkSetMaster(host, bridge); err != nil {
			return nil, fmt.Errorf("attaching %s to bridge %s: %w", alloc.HostVeth, bridge.Attrs().Name, err)
		}
		if err := netlink.LinkSetUp(host); err != nil {
			return nil, fmt.Errorf("setting %s up: %w", alloc.HostVeth, err)
		}
		return pod, setHairpin(host)
	}
	if !errors.As(err, &netlink.LinkNotFoundError{}) {
		return nil, fmt.Errorf("looking up %s in %s: %w", podIfName, alloc.NetNS, err)
	}
	// The host end is created up and attached to the bridge by LinkAdd itself.
	veth := func() *netlink.Veth {
		return &netlink.Veth{
			LinkAttrs: netlink.LinkAttrs{
				Name:        alloc.HostVeth,
				MTU:         n.settings.MTU,
				MasterIndex: bridge.Attrs().Index,
				Flags:       net.FlagUp,
			},
			PeerName:      podIfName,
			PeerNamespace: netlink.NsFd(ns),
		}
	}
	err = netlink.LinkAdd(veth())
	if errors.Is(err, unix.EEXIST) {
		// A host end without its peer is left over from an interrupted setup: replace it.
		if err = DeleteHostVeth(alloc.HostVeth); err == nil {
			err = netlink.LinkAdd(veth())
		}
	}
	if err != nil {
		return nil, fmt.Errorf("creating veth %s with peer %s in %s: %w", alloc.HostVeth, podIfName, alloc.NetNS, err)
	}
	if pod, err = podNL.LinkByName(podIfName); err != nil {
		return nil, fmt.Errorf("%s in %s: %w", podIfName, alloc.NetNS, err)
	}
	// The pod end's link is the host end: no lookup of the host end needed.
	host := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: alloc.HostVeth, Index: pod.Attrs().ParentIndex}}
	return pod, setHairpin(host)
}

// setHairpin lets the bridge send a pod's frames back out of the pod's own port. A pod that
// reaches itself through a Service or a hostPort needs it when br_netfilter is loaded: the DNAT
// then happens while the bridge forwards the frame, which turns back to the port it came in on.
func setHairpin(host netlink.Link) error {
	if err := netlink.LinkSetHairpin(host, true); err != nil {
		return fmt.Errorf("setting hairpin mode on %s: %w", host.Attrs().Name, err)
	}
	return nil
}

// SetHairpin puts the bridge port of a pod that is already wired in hairpin mode (Setup does it
// for the pods it wires): for pods wired by an nri-bridge that set it only with hostPorts.
// Nothing to do when the pod's veth is gone.
func (n *Network) SetHairpin(alloc *store.Allocation) error {
	link, err := hostVeth(alloc.HostVeth, "set hairpin mode on")
	if link == nil || err != nil {
		return err
	}
	if err := setHairpin(link); err != nil && !gone(err) {
		return err
	}
	return nil
}

// Detach takes the pod's host veth off the bridge: one request, unlike its deletion. Nothing to
// do when the veth is already gone, e.g. because the pod's netns was destroyed.
func (n *Network) Detach(alloc *store.Allocation) error {
	link, err := hostVeth(alloc.HostVeth, "detach")
	if link == nil || err != nil {
		return err
	}
	if err := netlink.LinkSetNoMaster(link); err != nil && !gone(err) {
		return fmt.Errorf("detaching %s from bridge %s: %w", alloc.HostVeth, n.settings.Bridge, err)
	}
	return nil
}

// Teardown removes the pod's veth pair (deleting the host end deletes the pod interface too).
// Nothing to do when the pair is already gone.
func (n *Network) Teardown(alloc *store.Allocation) error {
	return DeleteHostVeth(alloc.HostVeth)
}

// DeleteHostVeth deletes the host end of a pod's veth pair, which deletes the pod's end too.
// Nothing to do when it is already gone.
func DeleteHostVeth(name string) error {
	link, err := hostVeth(name, "delete")
	if link == nil || err != nil {
		return err
	}
	if err := netlink.LinkDel(link); err != nil && !gone(err) {
		return fmt.Errorf("deleting %s: %w", name, err)
	}
	return nil
}

// hostVeth looks up the host end of a pod's veth, nil if there is none, and refuses to act
// (what) on an interface of that name that is not a veth.
func hostVeth(name, what string) (netlink.Link, error) {
	link, err := netlink.LinkByName(name)
	if errors.As(err, &netlink.LinkNotFoundError{}) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("looking up %s: %w", name, err)
	}
	if link.Type() != "veth" {
		return nil, fmt.Errorf("refusing to %s %s: it is a %s, not a veth", what, name, link.Type())
	}
	return link, nil
}

// gone tells whether a netlink error says that the interface no longer exists.
func gone(err error) bool {
	return errors.As(err, &netlink.LinkNotFoundError{}) || errors.Is(err, unix.ENODEV)
}

// DeleteBridge deletes the bridge (which detaches what is still attached to it) and tells
// whether there was one. An interface of that name that is not a bridge is left alone.
func DeleteBridge(name string) (bool, error) {
	link, err := netlink.LinkByName(name)
	switch {
	case errors.As(err, &netlink.LinkNotFoundError{}):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("bridge %s: %w", name, err)
	case link.Type() != "bridge":
		return false, fmt.Errorf("bridge %s: the existing interface is a %s, not a bridge: left alone", name, link.Type())
	}
	if err := netlink.LinkDel(link); err != nil {
		return false, fmt.Errorf("deleting bridge %s: %w", name, err)
	}
	return true, nil
}
