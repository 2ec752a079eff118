package cluster

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"strings"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/knext-dev/knext/internal/stack"
)

// The addresses of every cluster. Pod and Service networks exist only inside the nodes' network
// namespaces, so every cluster can use the same ones; only the underlay is routed on the host.
var (
	podCIDRs     = []string{"10.244.0.0/16", "fd00:10:244::/56"}
	serviceCIDRs = []string{"10.96.0.0/16", "fd00:10:96::/112"}
	// dnsServiceIPs are the kube-dns Service's ClusterIPs, the kubelets' clusterDNS.
	dnsServiceIPs = []string{"10.96.0.10", "fd00:10:96::a"}
	// nodeCIDRMasks are the sizes of each node's pod CIDRs (the controller-manager allocates them).
	nodeCIDRMasks = []int{24, 64}
)

// underlayPool is where clusters' underlays get their IPv4 /24s; the IPv6 /64 follows from it.
var underlayPool = netip.MustParsePrefix("10.200.0.0/16")

// registryDir holds one file per cluster on this host naming its underlay, so that clusters (a
// `make cluster`, a test suite's, another checkout's) never pick the same subnet or names.
const registryDir = "/run/knext-cluster"

// registration is a cluster's entry in registryDir.
type registration struct {
	ID     string `json:"id"`
	Dir    string `json:"dir"`
	Subnet string `json:"subnet"`
}

// claim picks an ID and an underlay /24 that no registered cluster, host route or host address
// uses, and registers them for dir.
func claim(dir string) (id string, subnet netip.Prefix, err error) {
	if err := os.MkdirAll(registryDir, 0o755); err != nil {
		return "", netip.Prefix{}, err
	}
	unlock, err := stack.LockFile(filepath.Join(registryDir, ".lock"))
	if err != nil {
		return "", netip.Prefix{}, err
	}
	defer unlock()
	used, err := hostPrefixes()
	if err != nil {
		return "", netip.Prefix{}, err
	}
	entries, err := filepath.Glob(filepath.Join(registryDir, "*.json"))
	if err != nil {
		return "", netip.Prefix{}, err
	}
	for _, name := range entries {
		var r registration
		data, err := os.ReadFile(name)
		if err == nil {
			err = json.Unmarshal(data, &r)
		}
		p, perr := netip.ParsePrefix(r.Subnet)
		if err != nil || perr != nil {
			return "", netip.Prefix{}, fmt.Errorf("cluster registry entry %s is unreadable (remove it once its cluster is down): %v", name, errors.Join(err, perr))
		}
		used = append(used, p)
	}
	b := make([]byte, 3)
	if _, err := rand.Read(b); err != nil {
		return "", netip.Prefix{}, err
	}
	id = hex.EncodeToString(b)
	count := 1 << (24 - underlayPool.Bits())
	start, err := rand.Int(rand.Reader, big.NewInt(int64(count)))
	if err != nil {
		return "", netip.Prefix{}, err
	}
	base := underlayPool.Addr().As4()
	for i := range count {
		n := (int(start.Int64()) + i) % count
		candidate := netip.PrefixFrom(netip.AddrFrom4([4]byte{base[0], base[1] + byte(n>>8), byte(n), 0}), 24)
		if !overlapsAny(candidate, used) {
			data, err := json.Marshal(registration{ID: id, Dir: dir, Subnet: candidate.String()})
			if err != nil {
				return "", netip.Prefix{}, err
			}
			return id, candidate, os.WriteFile(filepath.Join(registryDir, id+".json"), data, 0o644)
		}
	}
	return "", netip.Prefix{}, fmt.Errorf("no free /24 in %s for a cluster underlay: every one is used by a host route, a host address or a registered cluster (%s)", underlayPool, registryDir)
}

// unregister removes the cluster's registry entry.
func unregister(id string) error {
	if err := os.Remove(filepath.Join(registryDir, id+".json")); err != nil && !os.IsNotExist(err) {
		return err
	}
	return nil
}

func overlapsAny(p netip.Prefix, others []netip.Prefix) bool {
	for _, o := range others {
		if o.Overlaps(p) {
			return true
		}
	}
	return false
}

// hostPrefixes lists the IPv4 networks of the host's routes (default routes excluded) and
// interface addresses.
func hostPrefixes() ([]netip.Prefix, error) {
	routes, err := netlink.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Table: unix.RT_TABLE_UNSPEC}, netlink.RT_FILTER_TABLE)
	if err != nil && !errors.Is(err, netlink.ErrDumpInterrupted) {
		return nil, fmt.Errorf("list host routes: %w", err)
	}
	var prefixes []netip.Prefix
	for _, r := range routes {
		if p, ok := toPrefix(r.Dst); ok && p.Bits() > 0 {
			prefixes = append(prefixes, p)
		}
	}
	addrs, err := netlink.AddrList(nil, netlink.FAMILY_V4)
	if err != nil && !errors.Is(err, netlink.ErrDumpInterrupted) {
		return nil, fmt.Errorf("list host addresses: %w", err)
	}
	for _, a := range addrs {
		if p, ok := toPrefix(a.IPNet); ok {
			prefixes = append(prefixes, p.Masked())
		}
	}
	return prefixes, nil
}

func toPrefix(n *net.IPNet) (netip.Prefix, bool) {
	if n == nil {
		return netip.Prefix{}, false
	}
	addr, ok := netip.AddrFromSlice(n.IP)
	if !ok {
		return netip.Prefix{}, false
	}
	ones, _ := n.Mask.Size()
	return netip.PrefixFrom(addr.Unmap(), ones), true
}

// underlay6 returns the IPv6 /64 of the underlay whose IPv4 /24 is subnet: fd6b:6e63:ffff
// ("knc") and the /24's second and third bytes.
func underlay6(subnet netip.Prefix) netip.Prefix {
	v4 := subnet.Addr().As4()
	return netip.PrefixFrom(netip.AddrFrom16([16]byte{0xfd, 0x6b, 0x6e, 0x63, 0xff, 0xff, v4[1], v4[2]}), 64)
}

// hostAddr returns the address number n of prefix (n < 256).
func hostAddr(prefix netip.Prefix, n int) netip.Addr {
	if prefix.Addr().Is4() {
		a := prefix.Addr().As4()
		a[3] = byte(n)
		return netip.AddrFrom4(a)
	}
	a := prefix.Addr().As16()
	a[15] = byte(n)
	return netip.AddrFrom16(a)
}

// netnsPath is where `ip netns` keeps the network namespace name.
func netnsPath(name string) string {
	return filepath.Join("/run/netns", name)
}

// createBridge creates the underlay bridge on the host with the host's addresses on it.
func createBridge(name string, addrs ...netip.Prefix) error {
	br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: name}}
	if err := netlink.LinkAdd(br); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("create underlay bridge %s: %w", name, err)
	}
	link, err := netlink.LinkByName(name)
	if err != nil {
		return err
	}
	if err := addAddrs(link, addrs); err != nil {
		return fmt.Errorf("underlay bridge %s: %w", name, err)
	}
	return netlink.LinkSetUp(link)
}

// addAddrs adds addrs to link, without duplicate address detection (nothing else is on the
// underlay: waiting for DAD would only delay the nodes).
func addAddrs(link netlink.Link, addrs []netip.Prefix) error {
	for _, p := range addrs {
		addr := &netlink.Addr{IPNet: &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}}
		if p.Addr().Is6() {
			addr.Flags = unix.IFA_F_NODAD
		}
		if err := netlink.AddrReplace(link, addr); err != nil {
			return fmt.Errorf("add address %s: %w", p, err)
		}
	}
	return nil
}

// createNetns creates the network namespace name (like `ip netns add`), with loopback up.
func createNetns(name string) error {
	if _, err := os.Stat(netnsPath(name)); err == nil {
		return nil
	}
	if _, err := runInput(context.Background(), nil, "ip", "netns", "add", name); err != nil {
		return err
	}
	return inNetns(name, func() error {
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return err
		}
		return netlink.LinkSetUp(lo)
	})
}

// deleteNetns deletes the network namespace name; the interfaces in it go with it.
func deleteNetns(name string) error {
	if _, err := os.Stat(netnsPath(name)); os.IsNotExist(err) {
		return nil
	}
	_, err := runInput(context.Background(), nil, "ip", "netns", "delete", name)
	return err
}

// inNetns runs fn on a thread in the network namespace name.
func inNetns(name string, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		// The thread never returns to the pool: it ends with the goroutine, in whatever namespace.
		runtime.LockOSThread()
		ns, err := netns.GetFromName(name)
		if err != nil {
			errc <- fmt.Errorf("network namespace %s: %w", name, err)
			return
		}
		defer ns.Close()
		if err := netns.Set(ns); err != nil {
			errc <- fmt.Errorf("enter network namespace %s: %w", name, err)
			return
		}
		errc <- fn()
	}()
	return <-errc
}

// plugInto connects the network namespace netns to the underlay bridge with a veth pair: hostEnd
// on the bridge, eth0 with addrs in netns.
func plugInto(bridge, hostEnd, netnsName string, addrs []netip.Prefix) error {
	br, err := netlink.LinkByName(bridge)
	if err != nil {
		return fmt.Errorf("underlay bridge %s: %w", bridge, err)
	}
	ns, err := netns.GetFromName(netnsName)
	if err != nil {
		return fmt.Errorf("network namespace %s: %w", netnsName, err)
	}
	defer ns.Close()
	if old, err := netlink.LinkByName(hostEnd); err == nil {
		if err := netlink.LinkDel(old); err != nil {
			return fmt.Errorf("remove stale veth %s: %w", hostEnd, err)
		}
	}
	veth := &netlink.Veth{
		LinkAttrs: netlink.LinkAttrs{Name: hostEnd, MasterIndex: br.Attrs().Index},
		PeerName:  "eth0",
		// Created in the node's namespace directly: no second interface named eth0 on the host.
		PeerNamespace: netlink.NsFd(int(ns)),
	}
	if err := netlink.LinkAdd(veth); err != nil {
		return fmt.Errorf("create veth %s to %s: %w", hostEnd, netnsName, err)
	}
	host, err := netlink.LinkByName(hostEnd)
	if err != nil {
		return err
	}
	if err := netlink.LinkSetUp(host); err != nil {
		return err
	}
	return inNetns(netnsName, func() error {
		eth0, err := netlink.LinkByName("eth0")
		if err != nil {
			return err
		}
		if err := addAddrs(eth0, addrs); err != nil {
			return fmt.Errorf("%s eth0: %w", netnsName, err)
		}
		return netlink.LinkSetUp(eth0)
	})
}

// addOnLinkRoutes routes dsts out of eth0 in the network namespace name without a gateway: the
// Service networks, whose addresses kube-proxy's rules rewrite before the packet leaves (a
// connection to a ClusterIP needs a route to start with). The node has no default route: nothing
// leaves the cluster's own addresses.
func addOnLinkRoutes(netnsName string, dsts []string) error {
	return inNetns(netnsName, func() error {
		eth0, err := netlink.LinkByName("eth0")
		if err != nil {
			return err
		}
		for _, dst := range dsts {
			_, ipnet, err := net.ParseCIDR(dst)
			if err != nil {
				return err
			}
			route := &netlink.Route{LinkIndex: eth0.Attrs().Index, Dst: ipnet, Scope: netlink.SCOPE_LINK}
			if err := netlink.RouteReplace(route); err != nil {
				return fmt.Errorf("%s: route %s dev eth0: %w", netnsName, dst, err)
			}
		}
		return nil
	})
}

// replaceRoute routes dst via gw in the network namespace name.
func replaceRoute(netnsName string, dst netip.Prefix, gw netip.Addr) error {
	return inNetns(netnsName, func() error {
		route := &netlink.Route{
			Dst: &net.IPNet{IP: dst.Addr().AsSlice(), Mask: net.CIDRMask(dst.Bits(), dst.Addr().BitLen())},
			Gw:  gw.AsSlice(),
		}
		if err := netlink.RouteReplace(route); err != nil {
			return fmt.Errorf("%s: route %s via %s: %w", netnsName, dst, gw, err)
		}
		return nil
	})
}

// setSysctls writes sysctls (name with dots → value) in the network namespace name: the
// per-namespace ones a node's network needs.
func setSysctls(netnsName string, sysctls map[string]string) error {
	return inNetns(netnsName, func() error {
		for name, value := range sysctls {
			path := filepath.Join("/proc/sys", strings.ReplaceAll(name, ".", "/"))
			if err := os.WriteFile(path, []byte(value), 0o644); err != nil {
				return fmt.Errorf("%s: sysctl %s=%s: %w", netnsName, name, value, err)
			}
		}
		return nil
	})
}
