package plugin

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	logrustest "github.com/sirupsen/logrus/hooks/test"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/knext-dev/knext/internal/nribridge/cluster/clustertest"
	"github.com/knext-dev/knext/internal/nribridge/config"
	"github.com/knext-dev/knext/internal/nribridge/store"
)

// noRoutes is a routing table that takes every route and holds none: these tests are about the
// plugin, the cluster package's tests are about the routes.
type noRoutes struct{}

func (noRoutes) List() ([]store.Route, error) { return nil, nil }
func (noRoutes) Replace(store.Route) error    { return nil }
func (noRoutes) Delete(store.Route) error     { return nil }

func testNode(name string, internalIP string, podCIDRs ...string) *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.NodeSpec{PodCIDRs: podCIDRs},
		Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: internalIP}}}}
}

// clusterRun is runCluster of Node n1 in the background.
type clusterRun struct {
	p      *plugin
	client *fake.Clientset
	cancel context.CancelFunc
	done   chan error
}

func startCluster(t *testing.T, doc, socket string, client *fake.Clientset, apiWait time.Duration) *clusterRun {
	t.Helper()
	p, _ := unconfiguredTestPlugin(t, doc)
	ctx, cancel := context.WithCancel(context.Background())
	r := &clusterRun{p: p, client: client, cancel: cancel, done: make(chan error, 1)}
	opts := Options{Flags: p.flags, Socket: socket, Name: "bridge", Idx: "10", NodeName: "n1", APIWait: apiWait}
	go func() { r.done <- runCluster(ctx, p, clustertest.Nodes(client), noRoutes{}, opts) }()
	t.Cleanup(func() { r.stop(t) })
	return r
}

// stop ends the run and closes the plugin's store, for the next run on the same state.
func (r *clusterRun) stop(t *testing.T) error {
	t.Helper()
	r.cancel()
	select {
	case err := <-r.done:
		r.done <- err // for a later stop
		r.p.close()
		return err
	case <-time.After(10 * time.Second):
		t.Fatal("runCluster did not return 10 s after its context ended")
		return nil
	}
}

// silent checks that the fake runtime says nothing (no plugin synchronized) for d.
func (rt *fakeRuntime) silent(t *testing.T, d time.Duration) {
	t.Helper()
	select {
	case line := <-rt.nextLine():
		rt.pending = nil
		t.Fatalf("fake runtime said %q, want nothing yet", line)
	case <-time.After(d):
	}
}

// mustPools returns the pools of a configuration document.
func mustPools(t *testing.T, doc string) []config.Pool {
	t.Helper()
	s, err := config.Load([]byte(doc), &config.Flags{})
	if err != nil {
		t.Fatal(err)
	}
	return s.Pools
}

// logged waits up to 10 s for a log entry that contains every one of parts.
func logged(t *testing.T, hook *logrustest.Hook, parts ...string) string {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		for _, e := range hook.AllEntries() {
			found := true
			for _, part := range parts {
				found = found && strings.Contains(e.Message, part)
			}
			if found {
				return e.Message
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no log entry with %q within 10 s", parts)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Cluster mode, as the DaemonSet runs it: nri-bridge connects to the runtime only once its Node
// has pod CIDRs (before, the runtime reports NetworkReady false), wires pods from them, and
// masquerades nothing bound for any node's pod CIDRs. Restarted while the API server is
// unreachable, it runs on the last known cluster state. A Node whose pod CIDRs changed while
// pods still hold addresses of the old ones is an error naming both, and nri-bridge does not
// connect until those pods are gone; a change while it runs stops it.
func TestClusterMode(t *testing.T) {
	hook := logrustest.NewGlobal()
	t.Cleanup(func() { logrus.StandardLogger().ReplaceHooks(logrus.LevelHooks{}) })
	doc := fmt.Sprintf(`{stateDir: %q, masquerade: true}`, t.TempDir())
	socket := filepath.Join(t.TempDir(), "nri.sock")
	rt := startFakeRuntime(t, socket, "")

	client := fake.NewClientset(testNode("n1", "192.0.2.1"), testNode("n2", "192.0.2.2", "10.244.2.0/24", "fd00:10:244:2::/64"))
	run := startCluster(t, doc, socket, client, time.Second)
	logged(t, hook, "waiting for the pod CIDRs of Node n1", "Node n1 has no spec.podCIDRs yet", "NetworkReady stays false")
	rt.silent(t, 1500*time.Millisecond)

	n1 := testNode("n1", "192.0.2.1", "10.244.1.0/24", "fd00:10:244:1::/64")
	if _, err := client.CoreV1().Nodes().Update(context.Background(), n1, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	rt.expect(t, "synced")
	rt.ask(t, "runips a", "ip=10.244.1.2 additional=[fd00:10:244:1::2] owners=[10.244.1.2@10-bridge fd00:10:244:1::2@10-bridge]")
	fw := firewallOf(t, run.p)
	if rules := fw.appliedRules(); !strings.Contains(rules, "elements = { 10.244.1.0-10.244.2.255 }") || !strings.Contains(rules, "elements = { fd00:10:244:1::-fd00:10:244:2:ffff:ffff:ffff:ffff }") {
		t.Errorf("the masquerade exempts not every node's pod CIDRs:\n%s", rules)
	}
	// A node joins: its pod CIDRs are exempt too.
	if _, err := client.CoreV1().Nodes().Create(context.Background(), testNode("n3", "192.0.2.3", "10.244.3.0/24"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "true", func() string {
		return fmt.Sprint(strings.Contains(fw.appliedRules(), "elements = { 10.244.1.0-10.244.3.255 }"))
	})
	if err := run.stop(t); err != nil {
		t.Fatalf("runCluster: %v", err)
	}

	// Restarted without the API server: the last known pod CIDRs after the wait.
	down := fake.NewClientset()
	down.PrependReactor("list", "nodes", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, errors.New("dial tcp 10.96.0.1:443: connect: connection refused")
	})
	run = startCluster(t, doc, socket, down, 300*time.Millisecond)
	rt.expect(t, "synced")
	logged(t, hook, "running on the last known cluster state", "pod CIDRs [10.244.1.0/24 fd00:10:244:1::/64]", "2 other nodes")
	netns := filepath.Join(t.TempDir(), "netns-c") // a pod whose network namespace exists
	if err := os.WriteFile(netns, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	rt.ask(t, "runips c "+netns, "ip=10.244.1.3 additional=[fd00:10:244:1::3] owners=[10.244.1.3@10-bridge fd00:10:244:1::3@10-bridge]")
	if rules := firewallOf(t, run.p).appliedRules(); !strings.Contains(rules, "10.244.1.0-10.244.3.255") {
		t.Errorf("the last known nodes' pod CIDRs are not exempt from the masquerade:\n%s", rules)
	}
	if err := run.stop(t); err != nil {
		t.Fatalf("runCluster: %v", err)
	}

	// The Node was created again with other pod CIDRs while pod c still runs.
	renumbered := fake.NewClientset(testNode("n1", "192.0.2.1", "10.244.7.0/24"))
	run = startCluster(t, doc, socket, renumbered, time.Second)
	msg := logged(t, hook, "Node n1's spec.podCIDRs [10.244.7.0/24] differ from the pod CIDRs [10.244.1.0/24 fd00:10:244:1::/64]",
		"pod ns/name-c (sandbox c) holds 10.244.1.3, fd00:10:244:1::3)")
	rt.silent(t, time.Second)
	// Pod c is gone: nri-bridge takes the new pod CIDR, and connects.
	if err := os.Remove(netns); err != nil {
		t.Fatal(err)
	}
	rt.expect(t, "synced")
	rt.ask(t, "runips d", "ip=10.244.7.2 additional=[] owners=[10.244.7.2@10-bridge]")
	t.Logf("logged: %s", msg)

	// And once more, while it runs: nri-bridge stops.
	if _, err := renumbered.CoreV1().Nodes().Update(context.Background(), testNode("n1", "192.0.2.1", "10.244.8.0/24"), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-run.done:
		run.done <- err
		if err == nil || !strings.Contains(err.Error(), "Node n1's spec.podCIDRs changed from [10.244.7.0/24] to [10.244.8.0/24]") {
			t.Errorf("runCluster after the Node's pod CIDRs changed: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("runCluster still runs 10 s after the Node's pod CIDRs changed")
	}
}

// Cluster mode needs the Node's name, and a configuration without subnets of its own.
func TestClusterModeRefuses(t *testing.T) {
	for _, tc := range []struct{ doc, node, want string }{
		{fmt.Sprintf(`{stateDir: %q}`, t.TempDir()), "", "cluster mode needs the name of this node's Node: -node-name or $NODE_NAME"},
		{fmt.Sprintf(`{stateDir: %q, ipv4: {subnet: 10.88.0.0/16}}`, t.TempDir()), "n1", "invalid configuration: ipv4/ipv6 subnets configured in cluster mode"},
		{fmt.Sprintf(`{stateDir: %q, interface: net1}`, t.TempDir()), "n1", "invalid configuration: interface net1 in cluster mode"},
	} {
		p, _ := unconfiguredTestPlugin(t, tc.doc)
		err := runCluster(context.Background(), p, clustertest.Nodes(fake.NewClientset()), noRoutes{}, Options{Flags: p.flags, NodeName: tc.node})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s on node %q: got %v, want %q", tc.doc, tc.node, err, tc.want)
		}
	}
}

func TestCheckNotRenumbering(t *testing.T) {
	st, err := store.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	old := mustPools(t, `{ipv4: {subnet: 10.244.1.0/24}, ipv6: {subnet: "fd00:10:244:1::/64"}}`)
	live := filepath.Join(t.TempDir(), "netns")
	if err := os.WriteFile(live, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for i, netns := range []string{live, live, live, live, "/run/netns/nbt-gone"} {
		if _, _, err := st.Allocate(old, store.PodRef{ID: fmt.Sprint("p", i), Namespace: "ns", Name: fmt.Sprint("p", i)}, netns, "v"); err != nil {
			t.Fatal(err)
		}
	}
	same := []netip.Prefix{netip.MustParsePrefix("10.244.1.0/24"), netip.MustParsePrefix("fd00:10:244:1::/64")}
	if err := checkNotRenumbering(st, "n1", same); err != nil {
		t.Errorf("the same pod CIDRs: %v", err)
	}
	err = checkNotRenumbering(st, "n1", []netip.Prefix{netip.MustParsePrefix("10.244.1.0/24"), netip.MustParsePrefix("fd00:10:244:7::/64")})
	want := "Node n1's spec.podCIDRs [10.244.1.0/24 fd00:10:244:7::/64] differ from the pod CIDRs [fd00:10:244:1::/64] of the allocations in " + st.Dir() +
		", which running pods still hold (pod ns/p0 (sandbox p0) holds fd00:10:244:1::2; pod ns/p1 (sandbox p1) holds fd00:10:244:1::3; pod ns/p2 (sandbox p2) holds fd00:10:244:1::4; and 1 more)"
	if err == nil || !strings.HasPrefix(err.Error(), want) {
		t.Errorf("a changed IPv6 pod CIDR:\n got %v\nwant %s...", err, want)
	}
	// Pods whose network namespace is gone do not count.
	if err := os.Remove(live); err != nil {
		t.Fatal(err)
	}
	if err := checkNotRenumbering(st, "n1", []netip.Prefix{netip.MustParsePrefix("10.244.9.0/24")}); err != nil {
		t.Errorf("allocations of pods that are gone: %v", err)
	}
}
