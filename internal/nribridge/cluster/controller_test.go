package cluster

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/knext-dev/knext/internal/nribridge/cluster/clustertest"
	"github.com/knext-dev/knext/internal/nribridge/store"
)

// fakeRoutes is a routing table: nri-bridge's routes, and routes of others (foreign) that it
// must leave alone.
type fakeRoutes struct {
	mu      sync.Mutex
	ours    map[netip.Prefix]netip.Addr // destination -> gateway
	foreign map[netip.Prefix]string
	failFor map[netip.Prefix]error // Replace fails for these destinations
}

func newFakeRoutes() *fakeRoutes {
	return &fakeRoutes{ours: map[netip.Prefix]netip.Addr{}, foreign: map[netip.Prefix]string{}, failFor: map[netip.Prefix]error{}}
}

func (f *fakeRoutes) List() ([]store.Route, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var routes []store.Route
	for dst, gw := range f.ours {
		routes = append(routes, store.Route{Dst: dst, Gw: gw})
	}
	return routes, nil
}

func (f *fakeRoutes) Replace(r store.Route) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if existing, ok := f.foreign[r.Dst]; ok {
		return &ForeignRouteError{Route: r, Existing: existing}
	}
	if err := f.failFor[r.Dst]; err != nil {
		return err
	}
	f.ours[r.Dst] = r.Gw
	return nil
}

func (f *fakeRoutes) Delete(r store.Route) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.ours[r.Dst] == r.Gw { // the kernel matches the gateway too
		delete(f.ours, r.Dst)
	}
	return nil
}

// String lists nri-bridge's routes, sorted, and the foreign ones.
func (f *fakeRoutes) String() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var lines []string
	for dst, gw := range f.ours {
		lines = append(lines, fmt.Sprintf("%s via %s", dst, gw))
	}
	slices.Sort(lines)
	for dst, what := range f.foreign {
		lines = append(lines, fmt.Sprintf("foreign %s %s", dst, what))
	}
	return strings.Join(lines, "; ")
}

func node(name string, podCIDRs []string, internalIPs ...string) *corev1.Node {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.NodeSpec{PodCIDRs: podCIDRs}}
	for _, ip := range internalIPs {
		n.Status.Addresses = append(n.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: ip})
	}
	n.Status.Addresses = append(n.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeHostName, Address: name})
	return n
}

func openStore(t *testing.T, dir string) *store.Store {
	t.Helper()
	st, err := store.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

// started is a running controller of node n1.
type started struct {
	ctrl         *Controller
	client       *fake.Clientset
	routes       *fakeRoutes
	store        *store.Store
	nodesChanges atomic.Int32
	stop         context.CancelFunc
	done         chan struct{}
}

func start(t *testing.T, st *store.Store, routes *fakeRoutes, client *fake.Clientset) *started {
	t.Helper()
	s := &started{client: client, routes: routes, store: st, done: make(chan struct{})}
	ctrl, err := New(clustertest.Nodes(client), "n1", st, routes, func() { s.nodesChanges.Add(1) })
	if err != nil {
		t.Fatal(err)
	}
	s.ctrl = ctrl
	ctx, cancel := context.WithCancel(context.Background())
	s.stop = func() {
		cancel()
		<-s.done
	}
	go func() {
		defer close(s.done)
		ctrl.Run(ctx)
	}()
	t.Cleanup(s.stop)
	return s
}

// eventually polls get for up to 10 s until it returns want.
func eventually(t *testing.T, what, want string, get func() string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		got := get()
		if got == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: after 10 s got\n  %s\nwant\n  %s", what, got, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// storedState renders the store's cluster state.
func storedState(t *testing.T, st *store.Store) string {
	t.Helper()
	state, err := st.ClusterState()
	if err != nil {
		t.Fatal(err)
	}
	if state == nil {
		return "none"
	}
	var nodes []string
	for _, n := range state.Nodes {
		nodes = append(nodes, fmt.Sprintf("%s %v %v", n.Name, n.PodCIDRs, n.InternalIPs))
	}
	return fmt.Sprintf("node %s %v; nodes [%s]; routes %v", state.Node, state.PodCIDRs, strings.Join(nodes, ", "), state.Routes)
}

func updateNode(t *testing.T, client *fake.Clientset, n *corev1.Node) {
	t.Helper()
	if _, err := client.CoreV1().Nodes().Update(context.Background(), n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// The node's pod CIDRs come from its Node once the controller-manager has allocated them: until
// then PodCIDRs waits, afterwards the store has them.
func TestPodCIDRsArrive(t *testing.T) {
	st := openStore(t, t.TempDir())
	client := fake.NewClientset(node("n1", nil, "192.0.2.1"))
	s := start(t, st, newFakeRoutes(), client)

	type result struct {
		cidrs   []netip.Prefix
		fromAPI bool
		err     error
	}
	got := make(chan result, 1)
	go func() {
		cidrs, fromAPI, err := s.ctrl.PodCIDRs(context.Background(), time.Millisecond)
		got <- result{cidrs, fromAPI, err}
	}()
	select {
	case r := <-got:
		t.Fatalf("PodCIDRs returned %v (%v) before Node n1 had any", r.cidrs, r.err)
	case <-time.After(300 * time.Millisecond):
	}
	updateNode(t, client, node("n1", []string{"10.244.1.0/24", "fd00:10:244:1::/64"}, "192.0.2.1"))
	select {
	case r := <-got:
		if r.err != nil || !r.fromAPI || fmt.Sprint(r.cidrs) != "[10.244.1.0/24 fd00:10:244:1::/64]" {
			t.Errorf("PodCIDRs: %v from the API %v (%v), want [10.244.1.0/24 fd00:10:244:1::/64] from the API", r.cidrs, r.fromAPI, r.err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("PodCIDRs still waits 10 s after Node n1 got its pod CIDRs")
	}
	eventually(t, "the store", "node n1 [10.244.1.0/24 fd00:10:244:1::/64]; nodes []; routes []", func() string { return storedState(t, st) })

	// A context that is done ends the wait.
	fresh := start(t, openStore(t, t.TempDir()), newFakeRoutes(), fake.NewClientset())
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if _, _, err := fresh.ctrl.PodCIDRs(ctx, time.Millisecond); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("PodCIDRs without a Node and an ending context: %v", err)
	}
}

// Every other node's pod CIDR is routed through its InternalIP of the same family, and the routes
// follow the Nodes as they come, change and go. Routes nri-bridge did not make are left alone.
func TestRoutesFollowTheNodes(t *testing.T) {
	st := openStore(t, t.TempDir())
	routes := newFakeRoutes()
	routes.foreign[netip.MustParsePrefix("10.244.4.0/24")] = "via 198.51.100.1 dev eth1 proto static"
	client := fake.NewClientset(
		node("n1", []string{"10.244.1.0/24", "fd00:10:244:1::/64"}, "192.0.2.1", "2001:db8::1"),
		node("n2", []string{"10.244.2.0/24", "fd00:10:244:2::/64"}, "192.0.2.2", "2001:db8::2"),
	)
	s := start(t, st, routes, client)
	eventually(t, "routes", "10.244.2.0/24 via 192.0.2.2; fd00:10:244:2::/64 via 2001:db8::2; foreign 10.244.4.0/24 via 198.51.100.1 dev eth1 proto static", routes.String)
	eventually(t, "the store",
		"node n1 [10.244.1.0/24 fd00:10:244:1::/64]; nodes [n2 [10.244.2.0/24 fd00:10:244:2::/64] [192.0.2.2 2001:db8::2]]; "+
			"routes [10.244.2.0/24 via 192.0.2.2 (node n2) fd00:10:244:2::/64 via 2001:db8::2 (node n2)]",
		func() string { return storedState(t, st) })

	// n3 has no IPv6 InternalIP: only its IPv4 CIDR is routed. n4's IPv4 CIDR is routed by
	// someone else already; n5 claims this node's own CIDR.
	for _, n := range []*corev1.Node{
		node("n3", []string{"10.244.3.0/24", "fd00:10:244:3::/64"}, "192.0.2.3"),
		node("n4", []string{"10.244.4.0/24"}, "192.0.2.4"),
		node("n5", []string{"10.244.1.0/25"}, "192.0.2.5"),
	} {
		if _, err := client.CoreV1().Nodes().Create(context.Background(), n, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, "routes with n3, n4 and n5",
		"10.244.2.0/24 via 192.0.2.2; 10.244.3.0/24 via 192.0.2.3; fd00:10:244:2::/64 via 2001:db8::2; foreign 10.244.4.0/24 via 198.51.100.1 dev eth1 proto static",
		routes.String)
	eventually(t, "the other nodes' pod CIDRs", "[10.244.2.0/24 fd00:10:244:2::/64 10.244.3.0/24 fd00:10:244:3::/64 10.244.4.0/24 10.244.1.0/25]",
		func() string { return fmt.Sprint(s.ctrl.NodesPodCIDRs()) })
	if s.nodesChanges.Load() < 2 {
		t.Errorf("onNodesChange called %d times for two changes of the other nodes' pod CIDRs", s.nodesChanges.Load())
	}

	// n2 moves to another address; n3 and n4 go.
	updateNode(t, client, node("n2", []string{"10.244.2.0/24", "fd00:10:244:2::/64"}, "192.0.2.22", "2001:db8::22"))
	for _, name := range []string{"n3", "n4"} {
		if err := client.CoreV1().Nodes().Delete(context.Background(), name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, "routes after n2 moved and n3, n4 went",
		"10.244.2.0/24 via 192.0.2.22; fd00:10:244:2::/64 via 2001:db8::22; foreign 10.244.4.0/24 via 198.51.100.1 dev eth1 proto static",
		routes.String)
	eventually(t, "the store's routes", "routes [10.244.2.0/24 via 192.0.2.22 (node n2) fd00:10:244:2::/64 via 2001:db8::22 (node n2)]",
		func() string {
			state := storedState(t, st)
			return state[strings.Index(state, "routes"):]
		})

	// A route someone deleted is made again at the next reconciliation.
	routes.Delete(store.Route{Dst: netip.MustParsePrefix("10.244.2.0/24"), Gw: netip.MustParseAddr("192.0.2.22")})
	s.ctrl.wake()
	eventually(t, "the deleted route", "10.244.2.0/24 via 192.0.2.22; fd00:10:244:2::/64 via 2001:db8::22; foreign 10.244.4.0/24 via 198.51.100.1 dev eth1 proto static",
		routes.String)
}

// A restart while the API server is unreachable runs on the last known cluster state: its routes
// are made again at once, and PodCIDRs gives the stored pod CIDRs after the wait. Once the API
// server answers, the state follows it.
func TestRestartWithoutTheAPIServer(t *testing.T) {
	st := openStore(t, t.TempDir())
	stored := &store.ClusterState{
		Node:     "n1",
		PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.1.0/24")},
		Nodes: []store.Node{
			{Name: "n2", PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.2.0/24")}, InternalIPs: []netip.Addr{netip.MustParseAddr("192.0.2.2")}},
			{Name: "n3", PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.3.0/24")}, InternalIPs: []netip.Addr{netip.MustParseAddr("192.0.2.3")}},
		},
		Routes: []store.Route{
			{Node: "n2", Dst: netip.MustParsePrefix("10.244.2.0/24"), Gw: netip.MustParseAddr("192.0.2.2")},
			{Node: "n3", Dst: netip.MustParsePrefix("10.244.3.0/24"), Gw: netip.MustParseAddr("192.0.2.3")},
		},
		Updated: time.Now(),
	}
	if err := st.PutClusterState(stored); err != nil {
		t.Fatal(err)
	}
	client := fake.NewClientset(
		node("n1", []string{"10.244.1.0/24"}, "192.0.2.1"),
		node("n2", []string{"10.244.2.0/24"}, "192.0.2.2"),
	)
	var apiDown atomic.Bool
	apiDown.Store(true)
	client.PrependReactor("list", "nodes", func(k8stesting.Action) (bool, runtime.Object, error) {
		if apiDown.Load() {
			return true, nil, errors.New("dial tcp 10.96.0.1:443: connect: connection refused")
		}
		return false, nil, nil
	})
	routes := newFakeRoutes()
	s := start(t, st, routes, client)

	// The node is routed to the other nodes before the API server answers.
	eventually(t, "the last known routes", "10.244.2.0/24 via 192.0.2.2; 10.244.3.0/24 via 192.0.2.3", routes.String)
	began := time.Now()
	cidrs, fromAPI, err := s.ctrl.PodCIDRs(context.Background(), 200*time.Millisecond)
	if err != nil || fromAPI || fmt.Sprint(cidrs) != "[10.244.1.0/24]" {
		t.Fatalf("PodCIDRs without the API server: %v from the API %v (%v), want the stored [10.244.1.0/24]", cidrs, fromAPI, err)
	}
	if waited := time.Since(began); waited < 200*time.Millisecond {
		t.Errorf("PodCIDRs gave the last known pod CIDRs after %s, before the wait of 200ms", waited)
	}
	if got := fmt.Sprint(s.ctrl.NodesPodCIDRs()); got != "[10.244.2.0/24 10.244.3.0/24]" {
		t.Errorf("the other nodes' pod CIDRs without the API server: %s", got)
	}

	// The API server answers: n3 is gone, and so is its route.
	apiDown.Store(false)
	eventually(t, "routes once the API server answers", "10.244.2.0/24 via 192.0.2.2", routes.String)
	eventually(t, "the store", "node n1 [10.244.1.0/24]; nodes [n2 [10.244.2.0/24] [192.0.2.2]]; routes [10.244.2.0/24 via 192.0.2.2 (node n2)]",
		func() string { return storedState(t, st) })
	if apiCIDRs, _ := s.ctrl.APIPodCIDRs(); fmt.Sprint(apiCIDRs) != "[10.244.1.0/24]" {
		t.Errorf("APIPodCIDRs once the API server answers: %v", apiCIDRs)
	}
}

// A route whose gateway the kernel refuses (not on a connected network) is not made; the next
// reconciliation tries again, and the route is made once it can be.
func TestFailedRouteIsRetried(t *testing.T) {
	st := openStore(t, t.TempDir())
	routes := newFakeRoutes()
	dst := netip.MustParsePrefix("10.244.2.0/24")
	routes.failFor[dst] = errors.New("network is unreachable")
	client := fake.NewClientset(node("n1", []string{"10.244.1.0/24"}, "192.0.2.1"), node("n2", []string{"10.244.2.0/24"}, "203.0.113.2"))
	s := start(t, st, routes, client)
	eventually(t, "the store", "node n1 [10.244.1.0/24]; nodes [n2 [10.244.2.0/24] [203.0.113.2]]; routes [10.244.2.0/24 via 203.0.113.2 (node n2)]",
		func() string { return storedState(t, st) })
	if got := routes.String(); got != "" {
		t.Fatalf("routes with an unreachable gateway: %s", got)
	}
	routes.mu.Lock()
	delete(routes.failFor, dst)
	routes.mu.Unlock()
	s.ctrl.wake()
	eventually(t, "the route once it can be made", "10.244.2.0/24 via 203.0.113.2", routes.String)
}

// The state of another node's store (the node was renamed, or the state directory copied) gives
// no pod CIDRs, but its routes are still nri-bridge's to remove.
func TestStateOfAnotherNode(t *testing.T) {
	st := openStore(t, t.TempDir())
	err := st.PutClusterState(&store.ClusterState{Node: "old-name", PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.9.0/24")},
		Routes: []store.Route{{Node: "n2", Dst: netip.MustParsePrefix("10.244.2.0/24"), Gw: netip.MustParseAddr("192.0.2.2")}}})
	if err != nil {
		t.Fatal(err)
	}
	routes := newFakeRoutes()
	routes.ours[netip.MustParsePrefix("10.244.2.0/24")] = netip.MustParseAddr("192.0.2.2")
	start(t, st, routes, fake.NewClientset(node("n1", []string{"10.244.1.0/24"}, "192.0.2.1")))
	eventually(t, "the store", "node n1 [10.244.1.0/24]; nodes []; routes []", func() string { return storedState(t, st) })
	if got := routes.String(); got != "" {
		t.Errorf("the other node's route was not removed: %s", got)
	}
}
