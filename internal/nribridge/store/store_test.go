package store

import (
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/knext-dev/knext/internal/nribridge/config"
	"github.com/knext-dev/knext/internal/nribridge/hostport"
)

// testStore is a store with the pools of a configuration document.
type testStore struct {
	*Store
	pools []config.Pool
}

func (s *testStore) allocate(pod PodRef, netns, hostVeth string) (*Allocation, bool, error) {
	return s.Allocate(s.pools, pod, netns, hostVeth)
}

// poolsOf returns the pools of a configuration document.
func poolsOf(t *testing.T, doc string) []config.Pool {
	t.Helper()
	s, err := config.Load([]byte(doc), &config.Flags{})
	if err != nil {
		t.Fatal(err)
	}
	return s.Pools
}

func openTestStore(t *testing.T, dir, doc string) *testStore {
	t.Helper()
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return &testStore{Store: s, pools: poolsOf(t, doc)}
}

func vethOf(podID string) string { return "veth-" + podID }

func allocateOK(t *testing.T, s *testStore, podID string) *Allocation {
	t.Helper()
	alloc, _, err := s.allocate(PodRef{ID: podID}, "/run/netns/"+podID, vethOf(podID))
	if err != nil {
		t.Fatalf("allocate %s: %v", podID, err)
	}
	return alloc
}

func addrsOf(alloc *Allocation) string {
	return fmt.Sprint(alloc.Addrs)
}

func TestStoreAllocatesOnePerFamilyIPv4First(t *testing.T) {
	s := openTestStore(t, t.TempDir(), `{ipv6: {subnet: "fd00:1::/64"}, ipv4: {subnet: 10.1.0.0/24}}`)
	a := allocateOK(t, s, "pod-a")
	if got := addrsOf(a); got != "[10.1.0.2/24 fd00:1::2/64]" {
		t.Errorf("first pod got %s", got)
	}
	if a.NetNS != "/run/netns/pod-a" || a.HostVeth != vethOf("pod-a") || a.Pod.ID != "pod-a" {
		t.Errorf("allocation %+v", a)
	}
	if got := addrsOf(allocateOK(t, s, "pod-b")); got != "[10.1.0.3/24 fd00:1::3/64]" {
		t.Errorf("second pod got %s", got)
	}
	// Replaying an allocation returns it unchanged and consumes nothing.
	if got := addrsOf(allocateOK(t, s, "pod-a")); got != "[10.1.0.2/24 fd00:1::2/64]" {
		t.Errorf("replayed allocation got %s", got)
	}
	if got := addrsOf(allocateOK(t, s, "pod-c")); got != "[10.1.0.4/24 fd00:1::4/64]" {
		t.Errorf("third pod got %s", got)
	}
}

func TestStoreSkipsGateway(t *testing.T) {
	s := openTestStore(t, t.TempDir(), `ipv4: {subnet: 10.1.0.0/29, gateway: 10.1.0.3}`)
	var got []string
	for i := range 5 {
		got = append(got, addrsOf(allocateOK(t, s, fmt.Sprint("pod-", i))))
	}
	if want := "[[10.1.0.1/29] [10.1.0.2/29] [10.1.0.4/29] [10.1.0.5/29] [10.1.0.6/29]]"; fmt.Sprint(got) != want {
		t.Errorf("got %v, want %v", got, want)
	}
}

func TestStoreExhaustion(t *testing.T) {
	s := openTestStore(t, t.TempDir(), `ipv4: {subnet: 10.1.7.0/29}`) // .2 to .6
	for i := range 5 {
		allocateOK(t, s, fmt.Sprint("pod-", i))
	}
	_, _, err := s.allocate(PodRef{ID: "pod-6"}, "/run/netns/x", "v")
	if err == nil || err.Error() != "no free IPv4 address in 10.1.7.0/29" {
		t.Fatalf("allocation in a full pool: got %v", err)
	}
	if alloc, _ := s.Get("pod-6"); alloc != nil {
		t.Errorf("failed allocation stored: %+v", alloc)
	}
	// A released address is the one handed out next.
	if err := s.Release("pod-3"); err != nil {
		t.Fatal(err)
	}
	if got := addrsOf(allocateOK(t, s, "pod-6")); got != "[10.1.7.5/29]" {
		t.Errorf("after releasing pod-3 (10.1.7.5): got %s", got)
	}
}

func TestStoreExhaustionIsAllOrNothing(t *testing.T) {
	// IPv6 /126 has room for two pods; IPv4 /24 for many.
	s := openTestStore(t, t.TempDir(), `{ipv4: {subnet: 10.1.0.0/24}, ipv6: {subnet: "fd00:2::/126"}}`)
	allocateOK(t, s, "pod-0")
	allocateOK(t, s, "pod-1")
	_, _, err := s.allocate(PodRef{ID: "pod-2"}, "/run/netns/x", "v")
	if err == nil || err.Error() != "no free IPv6 address in fd00:2::/126" {
		t.Fatalf("got %v", err)
	}
	if err := s.Release("pod-0"); err != nil {
		t.Fatal(err)
	}
	// The failed attempt consumed no IPv4 address: the next pod gets 10.1.0.4, not .5.
	if got := addrsOf(allocateOK(t, s, "pod-3")); got != "[10.1.0.4/24 fd00:2::2/126]" {
		t.Errorf("got %s", got)
	}
}

func TestStoreRoundRobinDelaysReuse(t *testing.T) {
	s := openTestStore(t, t.TempDir(), `ipv4: {subnet: 10.1.0.0/24}`)
	allocateOK(t, s, "pod-a") // .2
	if err := s.Release("pod-a"); err != nil {
		t.Fatal(err)
	}
	if got := addrsOf(allocateOK(t, s, "pod-b")); got != "[10.1.0.3/24]" {
		t.Errorf("got %s, want the next address, not the one just released", got)
	}
}

func TestStoreReleaseIsIdempotent(t *testing.T) {
	s := openTestStore(t, t.TempDir(), `ipv4: {subnet: 10.1.0.0/24}`)
	allocateOK(t, s, "pod-a")
	for range 2 {
		if err := s.Release("pod-a"); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Release("never-seen"); err != nil {
		t.Fatal(err)
	}
	if allocs, err := s.List(); err != nil || len(allocs) != 0 {
		t.Errorf("list after release: %v, %v", allocs, err)
	}
}

func TestStorePersistsAcrossRestart(t *testing.T) {
	dir := t.TempDir()
	doc := `{ipv4: {subnet: 10.1.0.0/24}, ipv6: {subnet: "fd00:3::/64"}}`
	db, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	s := &testStore{Store: db, pools: poolsOf(t, doc)}
	before := allocateOK(t, s, "pod-a")
	allocateOK(t, s, "pod-b")
	if err := s.Release("pod-b"); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	s = openTestStore(t, dir, doc)
	after, err := s.Get("pod-a")
	if err != nil || after == nil {
		t.Fatalf("pod-a after restart: %v, %v", after, err)
	}
	if addrsOf(after) != addrsOf(before) || after.NetNS != before.NetNS || after.HostVeth != before.HostVeth {
		t.Errorf("after restart %+v, before %+v", after, before)
	}
	// The cursor survived too: pod-b's released .3 is not handed out again right away.
	if got := addrsOf(allocateOK(t, s, "pod-c")); got != "[10.1.0.4/24 fd00:3::4/64]" {
		t.Errorf("first allocation after restart: %s", got)
	}
}

func TestStoreIsLockedAgainstASecondInstance(t *testing.T) {
	dir := t.TempDir()
	openTestStore(t, dir, `ipv4: {subnet: 10.1.0.0/24}`)
	_, err := Open(dir)
	if err == nil || !strings.Contains(err.Error(), "is locked by another process") {
		t.Fatalf("second open: got %v", err)
	}
}

func TestStoreConcurrentAllocationsAreUnique(t *testing.T) {
	s := openTestStore(t, t.TempDir(), `{ipv4: {subnet: 10.1.0.0/25}, ipv6: {subnet: "fd00:4::/64"}}`)
	const pods = 100 // 125 addresses
	var wg sync.WaitGroup
	errs := make(chan error, pods)
	for i := range pods {
		wg.Go(func() {
			_, _, err := s.allocate(PodRef{ID: fmt.Sprint("pod-", i)}, "/run/netns/x", "v")
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	allocs, err := s.List()
	if err != nil || len(allocs) != pods {
		t.Fatalf("list: %d allocations, %v", len(allocs), err)
	}
	seen := map[netip.Addr]string{}
	for _, a := range allocs {
		if len(a.Addrs) != 2 {
			t.Fatalf("%s has %v", a.Pod.ID, a.Addrs)
		}
		for _, addr := range a.Addrs {
			if other, dup := seen[addr.Addr()]; dup {
				t.Errorf("%s given to %s and %s", addr, other, a.Pod.ID)
			}
			seen[addr.Addr()] = a.Pod.ID
		}
	}
}

func tcp(hostPort, containerPort int32, hostIP string) hostport.Mapping {
	return hostport.Mapping{Protocol: hostport.TCP, HostPort: hostPort, ContainerPort: containerPort, HostIP: hostIP}
}

func TestStoreHostPortClaims(t *testing.T) {
	dir, doc := t.TempDir(), `ipv4: {subnet: 10.1.0.0/24}`
	s := openTestStore(t, dir, doc)
	if held, err := s.HostPortsOf("a"); err != nil || held != nil {
		t.Fatalf("a store without any claim: %v, %v", held, err)
	}
	a := PodRef{ID: "a", Namespace: "ns", Name: "web"}
	b := PodRef{ID: "b", Namespace: "ns", Name: "other"}
	if created, err := s.ClaimHostPorts(a, []hostport.Mapping{tcp(80, 8080, "")}); err != nil || !created {
		t.Fatalf("first claim: created %v, %v", created, err)
	}
	if created, err := s.ClaimHostPorts(a, []hostport.Mapping{tcp(80, 8080, "")}); err != nil || created {
		t.Fatalf("replayed claim: created %v, %v", created, err)
	}
	_, err := s.ClaimHostPorts(b, []hostport.Mapping{tcp(81, 81, ""), tcp(80, 80, "10.0.0.1")})
	want := "hostPort 80/TCP on 10.0.0.1 (container port 80) is taken: pod ns/web (sandbox a) holds hostPort 80/TCP on every address (container port 8080)"
	if err == nil || err.Error() != want {
		t.Fatalf("conflicting claim: got %v\nwant %s", err, want)
	}
	if held, err := s.HostPortsOf("b"); err != nil || held != nil {
		t.Errorf("the refused claim was recorded: %v, %v", held, err)
	}
	// Other protocols and ports are free.
	if _, err := s.ClaimHostPorts(b, []hostport.Mapping{{Protocol: hostport.UDP, HostPort: 80, ContainerPort: 80}, tcp(81, 81, "")}); err != nil {
		t.Fatal(err)
	}
	s.Close()

	s = openTestStore(t, dir, doc)
	all, err := s.AllHostPorts()
	if err != nil || len(all) != 2 || all["a"].Pod != a || fmt.Sprint(all["a"].Ports) != "[hostPort 80/TCP on every address (container port 8080)]" {
		t.Fatalf("after reopening: %v, %v", all, err)
	}
	for range 2 {
		if err := s.ReleaseHostPorts("a"); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.ClaimHostPorts(PodRef{ID: "c"}, []hostport.Mapping{tcp(80, 80, "")}); err != nil {
		t.Errorf("claiming a released port: %v", err)
	}
}

func TestStoreClusterState(t *testing.T) {
	dir := t.TempDir()
	s := openTestStore(t, dir, `ipv4: {subnet: 10.1.0.0/24}`)
	if state, err := s.ClusterState(); err != nil || state != nil {
		t.Fatalf("a store that never ran in cluster mode: %v, %v", state, err)
	}
	want := &ClusterState{
		Node:     "n1",
		PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.1.0/24"), netip.MustParsePrefix("fd00:10:244:1::/64")},
		Nodes: []Node{{Name: "n2", PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.2.0/24")},
			InternalIPs: []netip.Addr{netip.MustParseAddr("192.0.2.2"), netip.MustParseAddr("2001:db8::2")}}},
		Routes:  []Route{{Node: "n2", Dst: netip.MustParsePrefix("10.244.2.0/24"), Gw: netip.MustParseAddr("192.0.2.2")}},
		Updated: time.Date(2026, 12, 1, 8, 0, 0, 0, time.UTC),
	}
	if err := s.PutClusterState(want); err != nil {
		t.Fatal(err)
	}
	s.Close()
	s = openTestStore(t, dir, `ipv4: {subnet: 10.1.0.0/24}`)
	got, err := s.ClusterState()
	if err != nil || fmt.Sprintf("%+v", got) != fmt.Sprintf("%+v", want) {
		t.Errorf("after reopening: %+v (%v)\nwant %+v", got, err, want)
	}
	if got := want.Routes[0].String(); got != "10.244.2.0/24 via 192.0.2.2 (node n2)" {
		t.Errorf("a route reads %q", got)
	}
}
