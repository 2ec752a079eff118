package plugin

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containerd/nri/pkg/api"
	"github.com/vishvananda/netlink"

	"github.com/knext-dev/knext/internal/nribridge/cluster"
	"github.com/knext-dev/knext/internal/nribridge/config"
	"github.com/knext-dev/knext/internal/nribridge/firewall"
	"github.com/knext-dev/knext/internal/nribridge/store"
	"github.com/knext-dev/knext/internal/nribridge/wiring"
	"github.com/knext-dev/knext/test/netnstest"
)

func TestNetnsCleanup(t *testing.T) {
	requireRoot(t)
	doc, s := freeNetworkDoc(t)
	file := filepath.Join(t.TempDir(), "bridge.yaml")
	if err := os.WriteFile(file, []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	flags := &config.Flags{File: file}
	p, err := newPlugin(flags)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.configure([]byte(doc)); err != nil {
		t.Fatal(err)
	}
	pod, _ := newNetns(t, "a")
	pod.PortMappings = []*api.PortMapping{mapping(api.Protocol_TCP, netnstest.Port(t), 80, "")}
	if _, err := p.RunPodSandbox(ctx, pod); err != nil {
		t.Fatal(err)
	}
	wantTable(t, s.Bridge, true)

	// A route to another node, as cluster mode makes them (to a subnet that is free on the host).
	peer := netnstest.NewPeer(t)
	_, free := freeNetworkDoc(t)
	route := store.Route{Node: "n2", Dst: free.Pools[0].Subnet, Gw: peer.Peer4}
	if err := cluster.NewNetlinkRoutes(&netlink.Handle{}).Replace(route); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cluster.NewNetlinkRoutes(&netlink.Handle{}).Delete(route) })
	if err := p.db.PutClusterState(&store.ClusterState{Node: "n1", Routes: []store.Route{route}}); err != nil {
		t.Fatal(err)
	}

	if err := Cleanup(flags, io.Discard); err == nil || !strings.Contains(err.Error(), "is locked by another process") {
		t.Errorf("cleanup while nri-bridge runs: got %v, want a refusal", err)
	}
	p.close()
	var out bytes.Buffer
	if err := Cleanup(flags, &out); err != nil {
		t.Fatal(err)
	}
	db := filepath.Join(s.StateDir, store.File)
	want := fmt.Sprintf("nri-bridge: removed %s of %s\nnri-bridge: removed route %s\nnri-bridge: removed nftables table inet %s\nnri-bridge: removed bridge %s\nnri-bridge: removed %s\nnri-bridge: removed %s\n",
		wiring.HostVethName(pod.Id), refOf(pod), route, firewall.TableName(s.Bridge), s.Bridge, db, s.StateDir)
	if out.String() != want {
		t.Errorf("cleanup said:\n%s\nwant:\n%s", out.String(), want)
	}
	wantTable(t, s.Bridge, false)
	if routes, err := netlink.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Dst: wiring.IPNet(route.Dst)}, netlink.RT_FILTER_DST); err != nil || len(routes) != 0 {
		t.Errorf("routes to %s after cleanup: %v (%v)", route.Dst, routes, err)
	}
	for _, name := range []string{s.Bridge, wiring.HostVethName(pod.Id)} {
		if _, err := netlink.LinkByName(name); !errors.As(err, &netlink.LinkNotFoundError{}) {
			t.Errorf("interface %s after cleanup: %v", name, err)
		}
	}
	if _, err := os.Stat(s.StateDir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("state directory %s after cleanup: %v", s.StateDir, err)
	}
	if got := podState(t, pod); got != "lo up=true; no eth0" {
		t.Errorf("pod after cleanup: %s", got)
	}

	// Nothing left: nothing to do, no error.
	out.Reset()
	if err := Cleanup(flags, &out); err != nil || out.Len() != 0 {
		t.Errorf("second cleanup: %v, said %q", err, out.String())
	}

	// A configuration of cluster mode (no subnets) names what to remove as well.
	clusterDoc := filepath.Join(t.TempDir(), "cluster.yaml")
	if err := os.WriteFile(clusterDoc, []byte(fmt.Sprintf("{bridge: %s, stateDir: %q}", s.Bridge, s.StateDir)), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := Cleanup(&config.Flags{File: clusterDoc}, &out); err != nil || out.Len() != 0 {
		t.Errorf("cleanup with a cluster mode configuration: %v, said %q", err, out.String())
	}
}
