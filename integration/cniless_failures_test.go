package integration

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	criruntime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/knext-dev/knext/internal/stack"
)

// noIPError is how a CNI-less RunPodSandbox fails when no NRI plugin gave the pod an IP
// (C9); it names the sandbox, which the client is never told otherwise.
var noIPError = regexp.MustCompile(`pod sandbox "([0-9a-f]{64})" \([^)]*\) has no IP: CNI is disabled \(disable_cni\)`)

// wantNoIPFailure checks that err is that failure and says each of parts, and that the failed
// sandbox left nothing behind (wantNothingLeftBehind). It returns the sandbox's ID.
func (n *cniLessNode) wantNoIPFailure(t *testing.T, err error, livePods int, parts ...string) string {
	t.Helper()
	if err == nil {
		t.Fatal("RunPodSandbox succeeded, want it to fail for want of an IP")
	}
	match := noIPError.FindStringSubmatch(err.Error())
	if match == nil {
		t.Fatalf("RunPodSandbox failed with %q, want a failure matching %q", err, noIPError)
	}
	for _, part := range parts {
		if !strings.Contains(err.Error(), part) {
			t.Errorf("RunPodSandbox failed with %q, which does not say %q", err, part)
		}
	}
	id := match[1]
	wantNothingLeftBehind(t, n.ctx, n.h, id, livePods)
	return id
}

// wantNothingLeftBehind checks that the pod sandbox id, whose RunPodSandbox failed, left nothing
// behind: no pod in CRI (nor crictl pods), no sandbox or container in containerd, no network
// namespace beyond the livePods' own.
func wantNothingLeftBehind(t *testing.T, ctx context.Context, h *stack.Stack, id string, livePods int) {
	t.Helper()
	var leftovers []string
	pods, err := h.Runtime.ListPodSandbox(ctx, &criruntime.ListPodSandboxRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(pods.Items) != livePods {
		leftovers = append(leftovers, fmt.Sprintf("CRI lists %d pods, want %d: %v", len(pods.Items), livePods, pods.Items))
	}
	out, err := h.Crictl(ctx, "pods", "-q")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(out), id) {
		leftovers = append(leftovers, "crictl pods lists it")
	}
	for _, args := range [][]string{{"sandboxes", "ls"}, {"containers", "ls", "-q"}} {
		out, err := h.Ctr(ctx, args...)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(out), id) {
			leftovers = append(leftovers, "ctr "+strings.Join(args, " ")+" lists it")
		}
	}
	if netns := netnsCount(t, h); netns != livePods {
		leftovers = append(leftovers, fmt.Sprintf("%d network namespaces, want %d", netns, livePods))
	}
	for _, dir := range []string{"root", "state"} {
		if _, err := os.Stat(filepath.Join(h.Root, dir, "io.containerd.grpc.v1.cri", "sandboxes", id)); !os.IsNotExist(err) {
			leftovers = append(leftovers, fmt.Sprintf("its directory in containerd's %s is there (err %v)", dir, err))
		}
	}
	if len(leftovers) > 0 {
		t.Errorf("the failed pod sandbox %s left something behind: %s\ncontainerd's rollback of it: %q",
			id, strings.Join(leftovers, "; "), logLines(t, h.LogPath, "cleaning up failed sandbox", id))
	}
}

// wantTornDown checks that plugin saw pod sandbox id run, then stop and be removed.
func wantTornDown(t *testing.T, plugin *testPlugin, id string) {
	t.Helper()
	want := []string{"RunPodSandbox", "StopPodSandbox", "RemovePodSandbox"}
	if got := plugin.podEvents(t, id); !slices.Equal(got, want) {
		t.Errorf("NRI plugin %s got events %v for the failed pod sandbox %s, want %v", plugin.nriName(), got, id, want)
	}
}

// C8, C9: with disable_cni, a pod that no NRI plugin gives an IP fails RunPodSandbox, as with a
// failed CNI ADD, naming what each plugin answered, and leaves nothing behind (also what the
// network plugin set up for it); with network_plugin set, NetworkReady follows that plugin only,
// whatever other plugin is connected.
func TestCNILessPodWithoutIPFailsToStart(t *testing.T) {
	t.Parallel()
	// A /30 holds one pod address: a later pod getting it proves that a failed pod released it.
	var pool string
	n := startCNILessNodeFollowing(t, "bridge", func(h *stack.Stack) []string {
		pool = netip.PrefixFrom(netip.MustParsePrefix(ipv4Subnet(h)).Addr(), 30).String()
		return []string{"-ipv4-subnet", pool}
	})
	only := netip.MustParsePrefix(pool).Addr().Next().Next().String()
	run := func(config *criruntime.PodSandboxConfig) error {
		_, err := n.h.Runtime.RunPodSandbox(n.ctx, &criruntime.RunPodSandboxRequest{Config: config})
		return err
	}

	// No NRI plugin at all.
	n.wantNoIPFailure(t, run(n.h.PodConfig("web")), 0, "and no connected NRI plugin handles RunPodSandbox or PodSandboxStatus")

	// Only a plugin that owns no IP of any pod: the network is not ready, and a pod fails naming
	// that plugin's answer.
	other := startTestPlugin(t, n.ctx, n.h, "20", "other")
	other.behave(t, "", behaveEmpty)
	if cond := networkCondition(t, n.ctx, n.h); cond.Status || cond.Reason != "NRINetworkPluginNotReady" || !strings.Contains(cond.Message, `"bridge" (network_plugin)`) {
		t.Errorf("with only NRI plugin %s connected: NetworkReady %v, reason %q, message %q; want false, NRINetworkPluginNotReady, naming network_plugin \"bridge\"",
			other.nriName(), cond.Status, cond.Reason, cond.Message)
	}
	id := n.wantNoIPFailure(t, run(n.h.PodConfig("web")), 0,
		"and no NRI plugin reported one (handling RunPodSandbox: "+other.nriName()+"; asked for its status: "+other.nriName()+")")
	wantTornDown(t, other, id)

	n.startBridge(t)

	// nri-bridge wires the pod (a veth, the pool's only address), and the other plugin claims
	// another primary IP: before the pod runs, a status answer's primary IP comes first, as it
	// does before CNI's, and the address nri-bridge reported follows it.
	claimed := annotatedPodConfig(n.h, "claimed", map[string]string{pluginAnnotation(other.name, "ip"): "192.0.2.140"})
	other.behave(t, "claimed", "answer")
	claimedID := runPod(t, n.ctx, n.h, claimed)
	status, network := verbosePodStatus(t, n.ctx, n.h, claimedID)
	wantIPs(t, claimedID, status, network, liveFrom(other, "192.0.2.140"),
		reportedIP{IP: only, Source: "nri:" + nriBridgeName, NRI: nriAtRunPodSandbox})
	if err := n.h.RemovePod(n.ctx, claimedID); err != nil {
		t.Fatal(err)
	}

	// The same pod as the first failure starts now: nothing kept its name, and it gets the
	// address the removed pod had.
	web := n.runBridgePod(t, "web")
	n.wantBridgeIPs(t, web, nriAtRunPodSandbox, only)

	// nri-bridge gone: the network is not ready although the other plugin is still connected.
	n.killBridge(t)
	if exited, err := other.process.Exited(); exited {
		t.Fatalf("NRI plugin %s exited: %v", other.nriName(), err)
	}
}

// C8: a pod that CNI set up before disable_cni was turned on is still torn down by CNI (DEL),
// so that host-local releases its address; no CNI ADD runs any more.
func TestCNIDisabledUnderRunningCNIPod(t *testing.T) {
	t.Parallel()
	binDir, invocations := recordingCNIBinDir(t)
	h, ctx := startHarness(t, stack.Options{CNIBinDir: binDir})
	config := h.PodConfig("cni-pod")
	id := runPod(t, ctx, h, config)
	runContainer(t, ctx, h, id, config, "sleeper")
	ip := cniIPOf(t, h, id)
	if ports := bridgePorts(t, h); ports != 1 {
		t.Fatalf("bridge %s has %d ports with one pod, want 1", h.Bridge, ports)
	}

	if err := h.Reconfigure(cniDisabled, true); err != nil {
		t.Fatal(err)
	}
	if err := h.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	before := len(cniInvocations(t, invocations))
	if status := podStatus(t, ctx, h, id); status.GetState() != criruntime.PodSandboxState_SANDBOX_READY || status.GetNetwork().GetIp() != ip {
		t.Errorf("with CNI disabled, CNI's pod %s is %s with IP %q, want READY with %s", id, status.GetState(), status.GetNetwork().GetIp(), ip)
	}
	if _, err := h.Runtime.RunPodSandbox(ctx, &criruntime.RunPodSandboxRequest{Config: h.PodConfig("after")}); err == nil ||
		!strings.Contains(err.Error(), "no connected NRI plugin handles RunPodSandbox or PodSandboxStatus") {
		t.Errorf("a new pod without NRI plugin and CNI disabled: error %v, want one saying no NRI plugin is subscribed", err)
	}

	if _, err := h.Runtime.StopPodSandbox(ctx, &criruntime.StopPodSandboxRequest{PodSandboxId: id}); err != nil {
		t.Fatalf("stop CNI's pod %s with CNI disabled: %v", id, err)
	}
	calls := cniInvocations(t, invocations)[before:]
	if !slices.Contains(calls, "bridge DEL") || slices.ContainsFunc(calls, func(c string) bool { return strings.HasSuffix(c, " ADD") }) {
		t.Errorf("CNI invocations with CNI disabled: %v; want the pod's bridge DEL and no ADD", calls)
	}
	if _, err := os.Stat(allocationFile(h, ip)); !os.IsNotExist(err) {
		t.Errorf("stopped pod %s: host-local still holds %s (err %v)", id, ip, err)
	}
	if ports := bridgePorts(t, h); ports != 0 {
		t.Errorf("stopped pod %s: bridge %s still has %d ports", id, h.Bridge, ports)
	}
	if _, err := h.Runtime.RemovePodSandbox(ctx, &criruntime.RemovePodSandboxRequest{PodSandboxId: id}); err != nil {
		t.Fatalf("remove CNI's pod %s with CNI disabled: %v", id, err)
	}
}

// The network plugin sets a pod up on a budget of its own (network_setup_timeout), as a CNI ADD
// has no request timeout: its RunPodSandbox may take longer than plugin_request_timeout, while
// another plugin that slow fails the pod's start after plugin_request_timeout, and the network
// plugin fails it after its own budget, not NRI's default. Both failures leave nothing behind, and
// the network plugin stays connected: the next pod starts.
func TestNetworkSetupTimeout(t *testing.T) {
	t.Parallel()
	const request, setup = 500 * time.Millisecond, 6 * time.Second
	n := startCNILessNodeWith(t, stack.Options{
		NRIRequestTimeout: request,
		ExtraConfig: stack.CNILessConfig("net") +
			fmt.Sprintf("[plugins.'io.containerd.nri.v1.nri']\nnetwork_setup_timeout = '%s'\n", setup),
	}, func(*stack.Stack) []string { return nil })
	network := startTestPluginWithPolicy(t, n.ctx, n.h, "10", "net", "both")
	other := startTestPluginWithPolicy(t, n.ctx, n.h, "20", "other", "both")
	// attempt is a RunPodSandbox call: its sandbox as the plugin saw it, how long the call took in
	// all and after the plugin had it, and its error.
	type attempt struct {
		id         string
		took, held time.Duration
		err        error
	}
	// run starts pod name with IP ip, whose RunPodSandbox plugin holds for hold once it has it, or
	// until the call returns if hold is 0.
	run := func(plugin *testPlugin, name, ip string, hold time.Duration) attempt {
		t.Helper()
		file := filepath.Join(plugin.dir, "hold-run."+name)
		if err := os.WriteFile(file, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		var end time.Time
		start := time.Now()
		go func() {
			_, err := n.h.Runtime.RunPodSandbox(n.ctx, &criruntime.RunPodSandboxRequest{
				Config: annotatedPodConfig(n.h, name, map[string]string{annotationIP: ip})})
			end = time.Now()
			done <- err
		}()
		id := plugin.waitRunPodSandbox(t, name)
		seen := time.Now()
		if hold > 0 {
			time.Sleep(hold)
			if err := os.Remove(file); err != nil {
				t.Fatal(err)
			}
		}
		err := <-done
		if err := os.Remove(file); err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
		return attempt{id: id, took: end.Sub(start), held: end.Sub(seen), err: err}
	}

	slow := run(network, "slow-net", "192.0.2.91", 4*request)
	if slow.err != nil {
		t.Fatalf("RunPodSandbox whose network setup took %s (plugin_request_timeout %s, network_setup_timeout %s): %v", slow.held, request, setup, slow.err)
	}
	wantPodReady(t, n.ctx, n.h, slow.id)

	late := run(other, "slow-other", "192.0.2.92", 0)
	if late.err == nil {
		t.Fatalf("RunPodSandbox succeeded although NRI plugin %s, not the network plugin, never answered", other.nriName())
	}
	wantErrorNaming(t, late.err, "plugin "+other.nriName()+" failed to handle RunPodSandbox request", "deadline exceeded")
	if late.held >= setup/2 {
		t.Errorf("RunPodSandbox failed %s after NRI plugin %s got it, not about plugin_request_timeout %s: it had the network plugin's budget %s", late.held, other.nriName(), request, setup)
	}
	wantNothingLeftBehind(t, n.ctx, n.h, late.id, 1)

	stuck := run(network, "stuck-net", "192.0.2.93", 0)
	if stuck.err == nil {
		t.Fatal("RunPodSandbox succeeded while the network plugin never answered")
	}
	wantErrorNaming(t, stuck.err, "plugin "+network.nriName()+" failed to handle RunPodSandbox request", "deadline exceeded")
	// Without the configured budget, NRI's default (30 s) would apply.
	if stuck.took < setup || stuck.took > setup+10*time.Second {
		t.Errorf("RunPodSandbox failed after %s, want network_setup_timeout %s and not much more: %v", stuck.took, setup, stuck.err)
	}
	wantNothingLeftBehind(t, n.ctx, n.h, stuck.id, 1)

	next := run(network, "next", "192.0.2.94", time.Millisecond)
	if next.err != nil {
		t.Fatalf("RunPodSandbox after the network plugin's setup timed out: %v", next.err)
	}
	wantPodReady(t, n.ctx, n.h, next.id)
}
