package cluster

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/knext-dev/knext/internal/nribridge/cluster/clustertest"
	"github.com/knext-dev/knext/internal/nribridge/store"
	"github.com/knext-dev/knext/internal/nribridge/wiring"
	"github.com/knext-dev/knext/test/netnstest"
)

// underlayNetNS creates a network namespace standing for a node on an underlay network: an
// interface with 192.0.2.1/24 and 2001:db8::1/64, up. It returns a netlink handle in it; the
// test's cleanup removes it.
func underlayNetNS(t *testing.T) *netlink.Handle {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (creates a network namespace)")
	}
	h := netnstest.Netlink(t, netnstest.NewNetNS(t))
	// A veth pair within the namespace: the kernel may lack the dummy interface type.
	if err := h.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "underlay"}, PeerName: "underlay-peer"}); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"underlay-peer", "underlay"} {
		link, err := h.LinkByName(name)
		if err == nil {
			err = h.LinkSetUp(link)
		}
		if err != nil {
			t.Fatal(err)
		}
		if name == "underlay" {
			for _, addr := range []string{"192.0.2.1/24", "2001:db8::1/64"} {
				if err := h.AddrAdd(link, wiring.NetlinkAddr(netip.MustParsePrefix(addr))); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	return h
}

// kernelRoutes lists the main table's routes to 10.244.0.0/16 and fd00:10:244::/48 as
// "<dst> via <gw> proto <n>", sorted.
func kernelRoutes(t *testing.T, h *netlink.Handle) string {
	t.Helper()
	routes, err := h.RouteList(nil, netlink.FAMILY_ALL)
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	for _, r := range routes {
		if r.Dst == nil {
			continue
		}
		dst, _ := wiring.PrefixOf(r.Dst)
		if !netip.MustParsePrefix("10.244.0.0/16").Overlaps(dst) && !netip.MustParsePrefix("fd00:10:244::/48").Overlaps(dst) {
			continue
		}
		lines = append(lines, fmt.Sprintf("%s via %s proto %d", dst, r.Gw, r.Protocol))
	}
	slices.Sort(lines)
	return strings.Join(lines, "; ")
}

func route(dst, gw string) store.Route {
	return store.Route{Node: "n2", Dst: netip.MustParsePrefix(dst), Gw: netip.MustParseAddr(gw)}
}

// The routes nri-bridge makes carry its protocol; it changes and removes only those, and refuses
// to touch a route to the same destination that someone else made.
func TestNetnsRoutes(t *testing.T) {
	h := underlayNetNS(t)
	table := NewNetlinkRoutes(h)
	for _, r := range []store.Route{route("10.244.2.0/24", "192.0.2.2"), route("fd00:10:244:2::/64", "2001:db8::2")} {
		if err := table.Replace(r); err != nil {
			t.Fatal(err)
		}
	}
	if got, want := kernelRoutes(t, h), "10.244.2.0/24 via 192.0.2.2 proto 78; fd00:10:244:2::/64 via 2001:db8::2 proto 78"; got != want {
		t.Fatalf("routes: %s, want %s", got, want)
	}
	// Another gateway for the same destination changes the route, not adds one.
	if err := table.Replace(route("10.244.2.0/24", "192.0.2.3")); err != nil {
		t.Fatal(err)
	}
	listed, err := table.List()
	if err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(listed); got != "[10.244.2.0/24 via 192.0.2.3 (node ) fd00:10:244:2::/64 via 2001:db8::2 (node )]" {
		t.Errorf("List after a changed gateway: %s", got)
	}

	// A route of someone else's (proto static) to a destination nri-bridge would route.
	foreign := &netlink.Route{Dst: wiring.IPNet(netip.MustParsePrefix("10.244.9.0/24")), Gw: netip.MustParseAddr("192.0.2.9").AsSlice(), Protocol: unix.RTPROT_STATIC}
	if err := h.RouteAdd(foreign); err != nil {
		t.Fatal(err)
	}
	err = table.Replace(route("10.244.9.0/24", "192.0.2.10"))
	if fe := (*ForeignRouteError)(nil); !errors.As(err, &fe) || !strings.Contains(err.Error(), "the host already routes 10.244.9.0/24") {
		t.Errorf("Replace over a foreign route: %v, want a ForeignRouteError", err)
	}
	// Its exact twin with nri-bridge's protocol is not there to delete: the kernel keeps it.
	if err := table.Delete(route("10.244.9.0/24", "192.0.2.9")); err != nil {
		t.Fatal(err)
	}
	if got := kernelRoutes(t, h); !strings.Contains(got, "10.244.9.0/24 via 192.0.2.9 proto 4") {
		t.Errorf("the foreign route was changed or removed: %s", got)
	}

	// A gateway that is not on a connected network is refused, naming the route.
	if err := table.Replace(route("10.244.5.0/24", "203.0.113.5")); err == nil || !strings.Contains(err.Error(), "route 10.244.5.0/24 via 203.0.113.5 (node n2)") {
		t.Errorf("a gateway off the underlay: %v", err)
	}

	for range 2 { // deleting twice is no error
		for _, r := range []store.Route{route("10.244.2.0/24", "192.0.2.3"), route("fd00:10:244:2::/64", "2001:db8::2")} {
			if err := table.Delete(r); err != nil {
				t.Fatal(err)
			}
		}
	}
	if got := kernelRoutes(t, h); got != "10.244.9.0/24 via 192.0.2.9 proto 4" {
		t.Errorf("routes after the deletions: %s, want the foreign one alone", got)
	}
}

// The controller programs a real routing table as the Nodes come and go.
func TestNetnsControllerRoutes(t *testing.T) {
	h := underlayNetNS(t)
	client := fake.NewClientset(
		node("n1", []string{"10.244.1.0/24", "fd00:10:244:1::/64"}, "192.0.2.1", "2001:db8::1"),
		node("n2", []string{"10.244.2.0/24", "fd00:10:244:2::/64"}, "192.0.2.2", "2001:db8::2"),
	)
	ctrl, err := New(clustertest.Nodes(client), "n1", openStore(t, t.TempDir()), NewNetlinkRoutes(h), nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		ctrl.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	eventually(t, "routes", "10.244.2.0/24 via 192.0.2.2 proto 78; fd00:10:244:2::/64 via 2001:db8::2 proto 78",
		func() string { return kernelRoutes(t, h) })
	if err := client.CoreV1().Nodes().Delete(context.Background(), "n2", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "routes after n2 went", "", func() string { return kernelRoutes(t, h) })
}
