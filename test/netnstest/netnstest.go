// Package netnstest gives root tests network namespaces to probe a pod network from: running
// code inside a namespace, a namespace linked to the host by a veth (standing for another host,
// or for the world outside the node), and a line server and client.
package netnstest

import (
	"bufio"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Do runs fn on a thread in the network namespace at path (the host's for ""): sockets that
// fn creates stay in that namespace.
func Do(path string, fn func() error) error {
	if path == "" {
		return fn()
	}
	runtime.LockOSThread()
	orig, err := netns.Get()
	if err != nil {
		runtime.UnlockOSThread()
		return err
	}
	defer orig.Close()
	target, err := netns.GetFromPath(path)
	if err != nil {
		runtime.UnlockOSThread()
		return err
	}
	defer target.Close()
	if err := netns.Set(target); err != nil {
		runtime.UnlockOSThread()
		return err
	}
	fnErr := fn()
	if err := netns.Set(orig); err != nil {
		// The thread stays locked in the wrong namespace: it ends with the goroutine.
		return errors.Join(fnErr, fmt.Errorf("returning to the host network namespace: %w", err))
	}
	runtime.UnlockOSThread()
	return fnErr
}

// NewNetNS creates a named network namespace and returns its path; the test's cleanup deletes it.
func NewNetNS(t testing.TB) string {
	t.Helper()
	name := "nbt-" + RandomHex(t, 10)
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add %s: %v: %s", name, err, out)
	}
	t.Cleanup(func() { exec.Command("ip", "netns", "del", name).Run() })
	return "/run/netns/" + name
}

// Netlink returns a netlink handle in the network namespace at path; the test's cleanup closes it.
func Netlink(t testing.TB, path string) *netlink.Handle {
	t.Helper()
	ns, err := netns.GetFromPath(path)
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns, unix.NETLINK_ROUTE)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Close)
	return h
}

// Serve answers, in the network namespace at netnsPath (the host's for ""), every connection
// (tcp4, tcp6) or datagram (udp4, udp6) to port with the line "<name> saw <source address>",
// until the test ends.
func Serve(t testing.TB, netnsPath, network string, port int, name string) {
	t.Helper()
	answer := func(from net.Addr) []byte {
		host, _, _ := net.SplitHostPort(from.String())
		return []byte(name + " saw " + host + "\n")
	}
	err := Do(netnsPath, func() error {
		if strings.HasPrefix(network, "udp") {
			conn, err := net.ListenPacket(network, fmt.Sprintf(":%d", port))
			if err != nil {
				return err
			}
			t.Cleanup(func() { conn.Close() })
			go func() {
				buf := make([]byte, 1500)
				for {
					_, from, err := conn.ReadFrom(buf)
					if err != nil {
						return
					}
					conn.WriteTo(answer(from), from)
				}
			}()
			return nil
		}
		listener, err := net.Listen(network, fmt.Sprintf(":%d", port))
		if err != nil {
			return err
		}
		t.Cleanup(func() { listener.Close() })
		go func() {
			for {
				conn, err := listener.Accept()
				if err != nil {
					return
				}
				conn.Write(answer(conn.RemoteAddr()))
				conn.Close()
			}
		}()
		return nil
	})
	if err != nil {
		t.Fatalf("serving %s port %d in %q: %v", network, port, netnsPath, err)
	}
}

// Ask sends a line to addr over network from the network namespace at netnsPath (the host's
// for "") and returns the line it gets back, within 3 seconds.
func Ask(netnsPath, network, addr string) (string, error) {
	var conn net.Conn
	err := Do(netnsPath, func() error {
		var err error
		conn, err = net.DialTimeout(network, addr, 3*time.Second)
		return err
	})
	if err == nil {
		defer conn.Close()
		conn.SetDeadline(time.Now().Add(3 * time.Second))
		_, err = conn.Write([]byte("hello\n"))
	}
	var line string
	if err == nil {
		line, err = bufio.NewReader(conn).ReadString('\n')
	}
	if err != nil {
		return "", fmt.Errorf("%s %s from %q: %w", network, addr, netnsPath, err)
	}
	return strings.TrimSpace(line), nil
}

// Peer is a network namespace linked to the host by a veth, standing for another host or for
// the world outside the node: the host's end Link has Host4 and Host6, the peer's end (eth0)
// Peer4 and Peer6, on a /30 and a /64. The peer has no route beyond the link: it reaches a pod
// only through the host's NAT, and a pod reaches it only when masqueraded.
type Peer struct {
	NetNSPath    string
	Link         string
	Host4, Peer4 netip.Addr
	Host6, Peer6 netip.Addr
}

// NewPeer creates a Peer with random subnets that overlap no route of the host: a /30 of
// 198.18.0.0/15 (addresses for benchmarking, never routed) and a ULA /64. The test's cleanup
// removes it.
func NewPeer(t testing.TB) *Peer {
	t.Helper()
	net4, net6, err := freeSubnets()
	if err != nil {
		t.Fatal(err)
	}
	p := &Peer{Host4: net4.Addr().Next(), Host6: net6.Addr().Next()}
	p.Peer4, p.Peer6 = p.Host4.Next(), p.Host6.Next()
	p.NetNSPath = NewNetNS(t)
	p.Link = "nbp" + RandomHex(t, 12)
	if err := p.link(net4.Bits(), net6.Bits()); err != nil {
		t.Fatalf("linking network namespace %s to the host: %v", p.NetNSPath, err)
	}
	t.Cleanup(func() {
		if link, err := netlink.LinkByName(p.Link); err == nil {
			netlink.LinkDel(link)
		}
	})
	return p
}

func (p *Peer) link(bits4, bits6 int) error {
	ns, err := netns.GetFromPath(p.NetNSPath)
	if err != nil {
		return err
	}
	defer ns.Close()
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: p.Link}, PeerName: "eth0", PeerNamespace: netlink.NsFd(ns)}
	if err := netlink.LinkAdd(veth); err != nil {
		return err
	}
	peerNL, err := netlink.NewHandleAt(ns, unix.NETLINK_ROUTE)
	if err != nil {
		return err
	}
	defer peerNL.Close()
	hostNL, err := netlink.NewHandle()
	if err != nil {
		return err
	}
	defer hostNL.Close()
	for _, end := range []struct {
		nl           *netlink.Handle
		name         string
		addr4, addr6 netip.Addr
	}{{hostNL, p.Link, p.Host4, p.Host6}, {peerNL, "eth0", p.Peer4, p.Peer6}} {
		link, err := end.nl.LinkByName(end.name)
		if err != nil {
			return err
		}
		for _, prefix := range []netip.Prefix{netip.PrefixFrom(end.addr4, bits4), netip.PrefixFrom(end.addr6, bits6)} {
			// No duplicate address detection: the address is usable at once.
			addr := &netlink.Addr{IPNet: &net.IPNet{IP: prefix.Addr().AsSlice(), Mask: net.CIDRMask(prefix.Bits(), prefix.Addr().BitLen())}}
			if prefix.Addr().Is6() {
				addr.Flags = unix.IFA_F_NODAD
			}
			if err := end.nl.AddrAdd(link, addr); err != nil {
				return fmt.Errorf("address %s on %s: %w", prefix, end.name, err)
			}
		}
		if err := end.nl.LinkSetUp(link); err != nil {
			return err
		}
	}
	lo, err := peerNL.LinkByName("lo")
	if err != nil {
		return err
	}
	return peerNL.LinkSetUp(lo)
}

// freeSubnets picks a random /30 of 198.18.0.0/15 and a random ULA /64 that overlap no route of
// the host.
func freeSubnets() (netip.Prefix, netip.Prefix, error) {
	routes, err := netlink.RouteList(nil, netlink.FAMILY_ALL)
	if err != nil {
		return netip.Prefix{}, netip.Prefix{}, fmt.Errorf("listing host routes: %w", err)
	}
	for range 20 {
		b := make([]byte, 8)
		if _, err := rand.Read(b); err != nil {
			return netip.Prefix{}, netip.Prefix{}, err
		}
		net4 := netip.PrefixFrom(netip.AddrFrom4([4]byte{198, 18 + b[0]%2, b[1], b[2] & 0xfc}), 30)
		net6 := netip.PrefixFrom(netip.AddrFrom16([16]byte{0xfd, b[3], b[4], b[5], b[6], b[7]}), 64)
		free := true
		for _, r := range routes {
			if r.Dst == nil {
				continue
			}
			addr, _ := netip.AddrFromSlice(r.Dst.IP)
			ones, _ := r.Dst.Mask.Size()
			if dst := netip.PrefixFrom(addr.Unmap(), ones); ones > 0 && (dst.Overlaps(net4) || dst.Overlaps(net6)) {
				free = false
			}
		}
		if free {
			return net4, net6, nil
		}
	}
	return netip.Prefix{}, netip.Prefix{}, errors.New("no free random subnet for a peer network namespace")
}

// Port returns a random port in 20000-39999, for a hostPort: the host's ports are shared with
// every concurrent test.
func Port(t testing.TB) int32 {
	t.Helper()
	b := make([]byte, 2)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return 20000 + int32(binary.BigEndian.Uint16(b)%20000)
}

// RandomHex returns n random hex digits, for names (bridges, veths, netns) unique among tests.
func RandomHex(t testing.TB, n int) string {
	t.Helper()
	b := make([]byte, (n+1)/2)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)[:n]
}
