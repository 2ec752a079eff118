package plugin

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containerd/nri/pkg/api"

	"github.com/knext-dev/knext/internal/nribridge/config"
	"github.com/knext-dev/knext/internal/nribridge/store"
	"github.com/knext-dev/knext/internal/nribridge/wiring"
)

// fakeNetwork records what the plugin asks of the host.
type fakeNetwork struct {
	mu          sync.Mutex
	wired       map[string]*store.Allocation // host veth -> allocation
	detached    map[string]bool              // host veth -> off the bridge
	hairpins    map[string]bool              // host veths SetHairpin put in hairpin mode
	bridgeSetUp bool                         // EnsureBridge was called
	setupErr    error
	detachErr   error
	teardownErr error
	// teardownGate, when set, holds every teardown until it is closed.
	teardownGate chan struct{}
}

func (f *fakeNetwork) Setup(a *store.Allocation) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.setupErr != nil {
		return f.setupErr
	}
	f.wired[a.HostVeth] = a
	return nil
}

func (f *fakeNetwork) Detach(a *store.Allocation) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.detachErr != nil {
		return f.detachErr
	}
	if f.wired[a.HostVeth] != nil {
		f.detached[a.HostVeth] = true
	}
	return nil
}

func (f *fakeNetwork) Teardown(a *store.Allocation) error {
	f.mu.Lock()
	gate := f.teardownGate
	f.mu.Unlock()
	if gate != nil {
		<-gate
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.teardownErr != nil {
		return f.teardownErr
	}
	delete(f.wired, a.HostVeth)
	delete(f.detached, a.HostVeth)
	return nil
}

func (f *fakeNetwork) SetHairpin(a *store.Allocation) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.hairpins[a.HostVeth] = true
	return nil
}

func (f *fakeNetwork) EnsureBridge() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.bridgeSetUp = true
	return nil
}

func (f *fakeNetwork) hasHairpin(podID string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.hairpins[wiring.HostVethName(podID)]
}

func (f *fakeNetwork) isDetached(podID string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.detached[wiring.HostVethName(podID)]
}

func (f *fakeNetwork) isWired(podID string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.wired[wiring.HostVethName(podID)] != nil
}

func newTestPlugin(t *testing.T, doc string) (*plugin, *fakeNetwork) {
	t.Helper()
	p, fake := unconfiguredTestPlugin(t, doc)
	if _, err := p.Configure(context.Background(), "", "test-runtime", "v0"); err != nil {
		t.Fatal(err)
	}
	return p, fake
}

// unconfiguredTestPlugin returns a plugin with the -config document doc on a fake network and
// firewall, not configured yet.
func unconfiguredTestPlugin(t *testing.T, doc string) (*plugin, *fakeNetwork) {
	t.Helper()
	fake := &fakeNetwork{wired: map[string]*store.Allocation{}, detached: map[string]bool{}, hairpins: map[string]bool{}}
	p := &plugin{
		flags:       &config.Flags{},
		startupYAML: []byte(doc),
		newNetwork:  func(*config.Settings) (podNetwork, error) { return fake, nil },
		newFirewall: func(*config.Settings) packetFilter { return &fakeFirewall{} },
	}
	t.Cleanup(func() { p.close() })
	return p, fake
}

func testPodDoc(t *testing.T, subnets string) string {
	return fmt.Sprintf(`{stateDir: %q, %s}`, t.TempDir(), subnets)
}

func testPod(id string) *api.PodSandbox {
	return &api.PodSandbox{
		Id: id, Name: "name-" + id, Namespace: "ns", Uid: "uid-" + id,
		Linux: &api.LinuxPodSandbox{Namespaces: []*api.LinuxNamespace{
			{Type: "ipc"}, {Type: "network", Path: "/run/netns/" + id},
		}},
	}
}

func hostNetworkPod(id string) *api.PodSandbox {
	return &api.PodSandbox{Id: id, Linux: &api.LinuxPodSandbox{Namespaces: []*api.LinuxNamespace{{Type: "ipc"}}}}
}

// podIPs are the addresses the store holds for the pod, primary (IPv4 when both families are configured) first.
func (p *plugin) podIPs(pod *api.PodSandbox) ([]string, error) {
	a, err := p.current()
	if err != nil {
		return nil, err
	}
	alloc, err := a.store.Get(pod.GetId())
	if err != nil {
		return nil, fmt.Errorf("nri-bridge: %s: %w", refOf(pod), err)
	}
	if alloc == nil {
		return nil, nil
	}
	return addrsOf(alloc), nil
}

func podIPsOK(t *testing.T, p *plugin, pod *api.PodSandbox) string {
	t.Helper()
	ips, err := p.podIPs(pod)
	if err != nil {
		t.Fatal(err)
	}
	return strings.Join(ips, ",")
}

var ctx = context.Background()

func TestRunPodSandboxWiresAndReports(t *testing.T) {
	p, fake := newTestPlugin(t, testPodDoc(t, `ipv6: {subnet: "fd00:5::/64"}, ipv4: {subnet: 10.5.0.0/24}`))
	pod := testPod("a")
	if _, err := p.RunPodSandbox(ctx, pod); err != nil {
		t.Fatal(err)
	}
	if !fake.isWired("a") || fake.wired[wiring.HostVethName("a")].NetNS != "/run/netns/a" {
		t.Fatalf("pod not wired with its netns: %v", fake.wired)
	}
	if got := podIPsOK(t, p, pod); got != "10.5.0.2,fd00:5::2" {
		t.Errorf("pod IPs %q", got)
	}
	// Replay: same addresses, nothing new allocated.
	if _, err := p.RunPodSandbox(ctx, pod); err != nil {
		t.Fatal(err)
	}
	if got := podIPsOK(t, p, pod); got != "10.5.0.2,fd00:5::2" {
		t.Errorf("pod IPs after replay %q", got)
	}
	if _, err := p.RunPodSandbox(ctx, testPod("b")); err != nil {
		t.Fatal(err)
	}
	if got := podIPsOK(t, p, testPod("b")); got != "10.5.0.3,fd00:5::3" {
		t.Errorf("second pod IPs %q", got)
	}
	if got := podIPsOK(t, p, testPod("unknown")); got != "" {
		t.Errorf("unknown pod IPs %q", got)
	}
}

func TestHostNetworkPodIsLeftAlone(t *testing.T) {
	p, fake := newTestPlugin(t, testPodDoc(t, `ipv4: {subnet: 10.5.0.0/24}`))
	pod := hostNetworkPod("h")
	if _, err := p.RunPodSandbox(ctx, pod); err != nil {
		t.Fatal(err)
	}
	if len(fake.wired) != 0 || podIPsOK(t, p, pod) != "" {
		t.Errorf("host-network pod got wired %v / IPs", fake.wired)
	}
}

func TestRunPodSandboxFailureLeaksNothing(t *testing.T) {
	p, fake := newTestPlugin(t, testPodDoc(t, `ipv4: {subnet: 10.5.0.0/30}`)) // one pod address
	fake.setupErr = errors.New("netlink says no")
	_, err := p.RunPodSandbox(ctx, testPod("a"))
	if err == nil || err.Error() != "nri-bridge: pod ns/name-a (sandbox a): netlink says no" {
		t.Fatalf("got %v", err)
	}
	if podIPsOK(t, p, testPod("a")) != "" {
		t.Error("failed pod kept its allocation")
	}
	// The single address was released: the next pod gets it.
	fake.setupErr = nil
	if _, err := p.RunPodSandbox(ctx, testPod("b")); err != nil {
		t.Fatal(err)
	}
	_, err = p.RunPodSandbox(ctx, testPod("c"))
	if err == nil || err.Error() != "nri-bridge: pod ns/name-c (sandbox c): no free IPv4 address in 10.5.0.0/30" {
		t.Fatalf("exhausted pool: got %v", err)
	}
	if fake.isWired("c") || podIPsOK(t, p, testPod("c")) != "" {
		t.Error("pod that got no address was wired or reported")
	}
}

func TestFailedReplayKeepsTheWiredPod(t *testing.T) {
	p, fake := newTestPlugin(t, testPodDoc(t, `ipv4: {subnet: 10.5.0.0/24}`))
	pod := testPod("a")
	if _, err := p.RunPodSandbox(ctx, pod); err != nil {
		t.Fatal(err)
	}
	fake.setupErr = errors.New("transient netlink error")
	if _, err := p.RunPodSandbox(ctx, pod); err == nil {
		t.Fatal("replay with a failing setup succeeded")
	}
	if got := podIPsOK(t, p, pod); got != "10.5.0.2" || !fake.isWired("a") {
		t.Errorf("after a failed replay: IPs %q, wired %v; want the pod left as it was", got, fake.isWired("a"))
	}
}

func TestStopAndRemoveReleaseIdempotently(t *testing.T) {
	p, fake := newTestPlugin(t, testPodDoc(t, `ipv4: {subnet: 10.5.0.0/30}`))
	pod := testPod("a")
	if _, err := p.RunPodSandbox(ctx, pod); err != nil {
		t.Fatal(err)
	}
	fake.detachErr = errors.New("device busy")
	err := p.StopPodSandbox(ctx, pod)
	if err == nil || err.Error() != "nri-bridge: pod ns/name-a (sandbox a): device busy" {
		t.Fatalf("stop with failing detach: got %v", err)
	}
	fake.detachErr = nil

	// The veth is deleted in the background; when that fails, the allocation stays.
	fake.teardownErr = errors.New("device busy")
	if err := p.StopPodSandbox(ctx, pod); err != nil {
		t.Fatalf("stop: %v", err)
	}
	if !fake.isDetached("a") {
		t.Error("stop returned before the pod was off the bridge")
	}
	p.waitReleases()
	if podIPsOK(t, p, pod) != "10.5.0.2" {
		t.Fatal("allocation dropped although its veth could not be removed")
	}
	fake.teardownErr = nil
	for _, step := range []func(context.Context, *api.PodSandbox) error{p.StopPodSandbox, p.StopPodSandbox, p.RemovePodSandbox} {
		if err := step(ctx, pod); err != nil {
			t.Fatal(err)
		}
	}
	p.waitReleases()
	if fake.isWired("a") || podIPsOK(t, p, pod) != "" {
		t.Error("pod still wired or reported after stop")
	}
	// Remove without a stop (and without netns) releases too.
	if _, err := p.RunPodSandbox(ctx, testPod("b")); err != nil {
		t.Fatal(err)
	}
	if err := p.RemovePodSandbox(ctx, hostNetworkPod("b")); err != nil {
		t.Fatal(err)
	}
	p.waitReleases()
	if fake.isWired("b") || podIPsOK(t, p, testPod("b")) != "" {
		t.Error("pod still wired or reported after remove")
	}
}

func TestReleaseInFlightKeepsTheAddressUntilDone(t *testing.T) {
	// A /30 holds one pod address.
	p, fake := newTestPlugin(t, testPodDoc(t, `ipv4: {subnet: 10.5.0.0/30}`))
	if _, err := p.RunPodSandbox(ctx, testPod("a")); err != nil {
		t.Fatal(err)
	}
	gate := make(chan struct{})
	fake.mu.Lock()
	fake.teardownGate = gate
	fake.mu.Unlock()
	if err := p.StopPodSandbox(ctx, testPod("a")); err != nil {
		t.Fatal(err)
	}
	// Stop and remove do not wait for the veth's deletion, and the address is still a's.
	if err := p.RemovePodSandbox(ctx, testPod("a")); err != nil {
		t.Fatal(err)
	}
	if got := podIPsOK(t, p, testPod("a")); got != "10.5.0.2" || !fake.isDetached("a") {
		t.Fatalf("during the release: a has %q, detached %v; want 10.5.0.2, detached", got, fake.isDetached("a"))
	}
	// A pod that finds the pool exhausted waits for the release, then gets the address.
	started := make(chan error, 1)
	go func() {
		_, err := p.RunPodSandbox(ctx, testPod("b"))
		started <- err
	}()
	select {
	case err := <-started:
		t.Fatalf("pod b started (%v) while the only address was still a's", err)
	case <-time.After(50 * time.Millisecond):
	}
	close(gate)
	if err := <-started; err != nil {
		t.Fatalf("pod b after the release: %v", err)
	}
	if got := podIPsOK(t, p, testPod("b")); got != "10.5.0.2" || fake.isWired("a") {
		t.Errorf("b has %q, a wired %v; want b on the released address", got, fake.isWired("a"))
	}
}

func TestSynchronizeReconciles(t *testing.T) {
	doc := testPodDoc(t, `ipv4: {subnet: 10.5.0.0/24}`)
	p, fake := newTestPlugin(t, doc)
	for _, id := range []string{"live", "gone", "netns-gone", "stuck"} {
		if _, err := p.RunPodSandbox(ctx, testPod(id)); err != nil {
			t.Fatal(err)
		}
	}
	stuck := fake.wired[wiring.HostVethName("stuck")]
	// The runtime still has "live" (with netns), "netns-gone" (stopped: no netns any more),
	// a host-network pod and a pod the plugin never saw; "gone" and "stuck" are gone.
	pods := []*api.PodSandbox{testPod("live"), hostNetworkPod("netns-gone"), hostNetworkPod("host"), testPod("unseen")}
	failing := &failingTeardown{fakeNetwork: fake, failFor: stuck.HostVeth}
	p.active.Load().net = failing
	if _, err := p.Synchronize(ctx, pods, nil); err != nil {
		t.Fatal(err)
	}
	for id, want := range map[string]string{"live": "10.5.0.2", "gone": "", "netns-gone": "", "stuck": "10.5.0.5", "unseen": "", "host": ""} {
		if got := podIPsOK(t, p, testPod(id)); got != want {
			t.Errorf("%s after synchronize: IPs %q, want %q", id, got, want)
		}
	}
	if !fake.isWired("live") || fake.isWired("gone") || fake.isWired("netns-gone") {
		t.Errorf("wired after synchronize: %v", fake.wired)
	}
	if !fake.bridgeSetUp {
		t.Error("Synchronize kept a pod but did not set the bridge up")
	}
	// The next Synchronize retries the release that failed.
	p.active.Load().net = fake
	if _, err := p.Synchronize(ctx, pods, nil); err != nil {
		t.Fatal(err)
	}
	if got := podIPsOK(t, p, testPod("stuck")); got != "" {
		t.Errorf("stuck pod still has %q", got)
	}
	if got := podIPsOK(t, p, testPod("live")); got != "10.5.0.2" {
		t.Errorf("live pod lost its address: %q", got)
	}
}

func TestSynchronizeKeepsUnlistedPodWithNetNS(t *testing.T) {
	p, fake := newTestPlugin(t, testPodDoc(t, `ipv4: {subnet: 10.5.0.0/24}`))
	netns := filepath.Join(t.TempDir(), "unknown-state")
	if err := os.WriteFile(netns, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	pod := testPod("unknown-state")
	pod.Linux.Namespaces = []*api.LinuxNamespace{{Type: "network", Path: netns}}
	if _, err := p.RunPodSandbox(ctx, pod); err != nil {
		t.Fatal(err)
	}

	// Not listed (containerd could not restore its state), but its netns is there: kept.
	if _, err := p.Synchronize(ctx, nil, nil); err != nil {
		t.Fatal(err)
	}
	if got := podIPsOK(t, p, pod); got != "10.5.0.2" || !fake.isWired("unknown-state") {
		t.Fatalf("unlisted pod with a netns: IPs %q, wired %v; want it kept", got, fake.isWired("unknown-state"))
	}

	// Once the netns is gone, the next Synchronize releases it.
	if err := os.Remove(netns); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Synchronize(ctx, nil, nil); err != nil {
		t.Fatal(err)
	}
	if got := podIPsOK(t, p, pod); got != "" || fake.isWired("unknown-state") {
		t.Fatalf("pod without netns after synchronize: IPs %q, wired %v; want it released", got, fake.isWired("unknown-state"))
	}
}

// failingTeardown fails to tear one veth down.
type failingTeardown struct {
	*fakeNetwork
	failFor string
}

func (f *failingTeardown) Teardown(a *store.Allocation) error {
	if a.HostVeth == f.failFor {
		return errors.New("device busy")
	}
	return f.fakeNetwork.Teardown(a)
}

func TestConfigure(t *testing.T) {
	doc := testPodDoc(t, `ipv4: {subnet: 10.5.0.0/24}`)
	p, _ := newTestPlugin(t, doc)
	// A reconnect brings the same configuration again.
	if _, err := p.Configure(ctx, doc, "rt", "v"); err != nil {
		t.Errorf("same configuration again: %v", err)
	}
	_, err := p.Configure(ctx, strings.Replace(doc, "10.5.0.0/24", "10.6.0.0/24", 1), "rt", "v")
	if err == nil || !strings.Contains(err.Error(), "configuration differs from the one in use") {
		t.Errorf("changed configuration: got %v", err)
	}

	fresh := &plugin{flags: &config.Flags{}, startupYAML: []byte(doc),
		newNetwork: func(*config.Settings) (podNetwork, error) { return nil, errors.New("overlaps the host route x") }}
	_, err = fresh.Configure(ctx, "", "rt", "v")
	if err == nil || err.Error() != "nri-bridge: invalid configuration: overlaps the host route x" {
		t.Errorf("host check failure: got %v", err)
	}
	_, err = fresh.Configure(ctx, `ipv4: {subnet: 10.5.0.0/31}`, "rt", "v")
	if err == nil || !strings.Contains(err.Error(), "nri-bridge: invalid configuration: ipv4.subnet 10.5.0.0/31: too small") {
		t.Errorf("runtime configuration replacing the startup one: got %v", err)
	}
	if _, err := fresh.podIPs(testPod("a")); err == nil {
		t.Error("unconfigured plugin answered")
	}
}

func TestCheckValidatesWithoutActivating(t *testing.T) {
	hostErr := errors.New("IPv4 subnet 10.5.0.0/24 overlaps the host route 10.0.0.0/8 dev tun0")
	p := &plugin{flags: &config.Flags{}, newNetwork: func(*config.Settings) (podNetwork, error) { return nil, hostErr }}
	if err := p.check([]byte(`ipv4: {subnet: 10.5.0.0/24}`)); err == nil || err.Error() != "invalid configuration: "+hostErr.Error() {
		t.Errorf("host conflict: got %v", err)
	}
	if err := p.check([]byte(`ipv4: {subnet: 10.5.0.0/24, gateway: 10.6.0.1}`)); err == nil ||
		err.Error() != "invalid configuration: ipv4.gateway 10.6.0.1: outside subnet 10.5.0.0/24" {
		t.Errorf("static error: got %v", err)
	}
	p.newNetwork = func(*config.Settings) (podNetwork, error) { return &fakeNetwork{}, nil }
	if err := p.check([]byte(`ipv4: {subnet: 10.5.0.0/24}`)); err != nil {
		t.Errorf("valid configuration: %v", err)
	}
	if p.active.Load() != nil {
		t.Error("check activated the configuration")
	}
}

func TestConcurrentPodStartsGetDistinctAddresses(t *testing.T) {
	p, fake := newTestPlugin(t, testPodDoc(t, `ipv4: {subnet: 10.5.0.0/26}`)) // 61 pod addresses
	const pods = 40
	var wg sync.WaitGroup
	errs := make(chan error, 2*pods)
	for i := range pods {
		wg.Go(func() {
			pod := testPod(fmt.Sprint("p", i))
			_, err := p.RunPodSandbox(ctx, pod)
			errs <- err
			// Status queries run alongside the lifecycle events.
			if _, err := p.podIPs(pod); err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	seen := map[string]string{}
	for i := range pods {
		id := fmt.Sprint("p", i)
		ip := podIPsOK(t, p, testPod(id))
		if ip == "" || seen[ip] != "" {
			t.Errorf("%s got %q (also given to %q)", id, ip, seen[ip])
		}
		seen[ip] = id
		if !fake.isWired(id) {
			t.Errorf("%s not wired", id)
		}
	}
}
