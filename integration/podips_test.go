package integration

import (
	"context"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	criruntime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/knext-dev/knext/internal/stack"
)

// maxPodIPsPerAnswer is NRI's limit of the IPs one plugin may report for a pod.
const maxPodIPsPerAnswer = 16

// behaveReport is the behaviour of a test plugin that answers with ips, the first as the primary.
func behaveReport(ips ...string) string { return "report " + strings.Join(ips, ",") }

// behaveFlood is the behaviour of a test plugin that answers with n IPs of 198.18.0.0/15.
func behaveFlood(n int) string { return "flood " + strconv.Itoa(n) }

// invalidNetworkError is how an invalid answer of plugin about the pod named pod fails, naming
// both; what is wrong follows it.
func invalidNetworkError(plugin *testPlugin, pod string) string {
	return "plugin " + plugin.nriName() + " reported an invalid network for pod " + stack.PodNamespace + "/" + pod + ": "
}

// overLimitError is how an answer with too many IPs fails, for a plugin, a pod and a count.
func overLimitError(plugin *testPlugin, pod string, count int) string {
	return invalidNetworkError(plugin, pod) + strconv.Itoa(count) + " IPs, at most " + strconv.Itoa(maxPodIPsPerAnswer) + " allowed"
}

// failedPodSandbox matches the pod sandbox of the pod named name in the error of its failed
// RunPodSandbox, which the client is told nowhere else.
func failedPodSandbox(name string) *regexp.Regexp {
	return regexp.MustCompile(`pod sandbox "([0-9a-f]{64})" \(` + regexp.QuoteMeta(stack.PodNamespace+"/"+name) + `\)`)
}

// wantRunRefused checks that err, the error of the RunPodSandbox of the pod named name, names
// each of parts and the new pod sandbox, that the sandbox left nothing behind
// (wantNothingLeftBehind, with livePods), and that each of plugins saw it torn down. It returns
// the sandbox's ID.
func wantRunRefused(t *testing.T, ctx context.Context, h *stack.Stack, err error, name string, livePods int, plugins []*testPlugin, parts ...string) string {
	t.Helper()
	if err == nil {
		t.Fatalf("RunPodSandbox of pod %s succeeded, want it refused", name)
	}
	wantErrorNaming(t, err, parts...)
	match := failedPodSandbox(name).FindStringSubmatch(err.Error())
	if match == nil {
		t.Fatalf("RunPodSandbox of pod %s failed with %q, which does not name the new pod sandbox", name, err)
	}
	wantNothingLeftBehind(t, ctx, h, match[1], livePods)
	for _, plugin := range plugins {
		wantTornDown(t, plugin, match[1])
	}
	return match[1]
}

// wantCNIReleased checks that host-local holds no IP for the pod sandbox id any more.
func wantCNIReleased(t *testing.T, h *stack.Stack, id string) {
	t.Helper()
	if ips := cniIPsOf(t, h, id); len(ips) != 0 {
		t.Errorf("the refused pod sandbox %s keeps its CNI IPs %v", id, ips)
	}
}

// floodIPs are the first n IPs of a flood answer (behaveFlood), live from plugin.
func floodIPs(plugin *testPlugin, n int) []reportedIP {
	ips := make([]reportedIP, 0, n)
	for addr := netip.MustParseAddr("198.18.0.0"); len(ips) < n; {
		addr = addr.Next()
		ips = append(ips, liveFrom(plugin, addr.String()))
	}
	return ips
}

// A plugin may report at most 16 IPs for a pod. An answer with more fails the new pod's
// RunPodSandbox, naming the plugin, the pod and the count, and leaves nothing behind, with CNI
// (its IP released) and without. An answer at the limit networks a pod. For a running pod, an
// answer over the limit fails its status (crictl inspectp too), naming the plugin, the pod and
// the count, while the pod stays READY; it is neither remembered nor persisted: the plugin's
// answer at the limit is live again once it answers so, stands in once the plugin is gone, and
// is what containerd's metadata database holds.
func TestPluginAnswerOverTheIPLimit(t *testing.T) {
	t.Parallel()
	t.Run("CNI", func(t *testing.T) {
		t.Parallel()
		h, ctx := startHarness(t, stack.Options{})
		plugin := startTestPlugin(t, ctx, h, "10", "flood")
		plugin.behave(t, "", behaveFlood(20000))
		start := time.Now()
		_, err := h.Runtime.RunPodSandbox(ctx, &criruntime.RunPodSandboxRequest{Config: h.PodConfig("flood")})
		t.Logf("RunPodSandbox with a plugin answering 20000 IPs: %s", time.Since(start))
		refused := wantRunRefused(t, ctx, h, err, "flood", 0, []*testPlugin{plugin}, overLimitError(plugin, "flood", 20000))
		wantCNIReleased(t, h, refused)

		// A pod networked by an answer at the limit.
		plugin.behave(t, "", behaveFlood(maxPodIPsPerAnswer))
		id := runPod(t, ctx, h, h.PodConfig("at-limit"))
		cniIP := cniIPOf(t, h, id)
		atLimit := append(floodIPs(plugin, maxPodIPsPerAnswer), cniSourced(cniIP))
		status, network := verbosePodStatus(t, ctx, h, id)
		wantIPs(t, id, status, network, atLimit...)

		// The same pod, running, flooded.
		plugin.behave(t, "", behaveFlood(20000))
		for range 2 {
			wantErrorNaming(t, podStatusError(t, ctx, h, id), overLimitError(plugin, "at-limit", 20000), id)
		}
		if out, err := h.Crictl(ctx, "inspectp", id); err == nil || !strings.Contains(err.Error()+string(out), overLimitError(plugin, "at-limit", 20000)) {
			t.Errorf("crictl inspectp of pod %s: %v\n%.300s; want it to fail naming the limit", id, err, out)
		}
		wantPodReady(t, ctx, h, id)
		plugin.behave(t, "", behaveFlood(maxPodIPsPerAnswer))
		status, network = verbosePodStatus(t, ctx, h, id)
		wantIPs(t, id, status, network, atLimit...)

		// What stands in and what was persisted is the answer at the limit, never the flood.
		plugin.behave(t, "", behaveFlood(maxPodIPsPerAnswer+1))
		wantErrorNaming(t, podStatusError(t, ctx, h, id), overLimitError(plugin, "at-limit", maxPodIPsPerAnswer+1), id)
		plugin.kill(t)
		waitLogLine(t, h, `connection to plugin \"`+plugin.nriName()+`\" closed`)
		lastKnown := floodIPs(plugin, maxPodIPsPerAnswer)
		for i := range lastKnown {
			lastKnown[i].NRI = "last-known"
		}
		status, network = verbosePodStatus(t, ctx, h, id)
		wantIPs(t, id, status, network, append(lastKnown, cniSourced(cniIP))...)
		if err := h.Stop(); err != nil {
			t.Fatal(err)
		}
		db, err := os.ReadFile(filepath.Join(h.Root, "root", "io.containerd.metadata.v1.bolt", "meta.db"))
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(db), "198.18.0.16") || strings.Contains(string(db), "198.18.0.17") {
			t.Errorf("containerd's metadata database holds 198.18.0.16: %v, 198.18.0.17: %v; want the answer at the limit only",
				strings.Contains(string(db), "198.18.0.16"), strings.Contains(string(db), "198.18.0.17"))
		}
	})

	t.Run("CNI-less", func(t *testing.T) {
		t.Parallel()
		// The test plugin is the network: NetworkReady follows any plugin.
		n := startCNILessNodeFollowing(t, "", dualStack)
		plugin := startTestPlugin(t, n.ctx, n.h, "10", "flood")
		plugin.behave(t, "", behaveFlood(20000))
		_, err := n.h.Runtime.RunPodSandbox(n.ctx, &criruntime.RunPodSandboxRequest{Config: n.h.PodConfig("flood")})
		wantRunRefused(t, n.ctx, n.h, err, "flood", 0, []*testPlugin{plugin}, overLimitError(plugin, "flood", 20000))
	})
}

// conflictingPod matches the pod sandbox a conflict names as the one that reports the IP.
func conflictingPod(name string) *regexp.Regexp {
	return regexp.MustCompile(`pod sandbox "([0-9a-f]{64})" \(` + stack.PodNamespace + "/" + name + `\): \S+ reports IP`)
}

// One IP, one pod: an IP a plugin reports for a pod while another pod of the node holds it
// fails a new pod's RunPodSandbox (leaving nothing behind) and a running pod's status, naming
// both pods and the plugin; once the holder's network is gone, the IP is free. The IPs are held
// across a containerd restart; host-network pods hold none.
func TestOneIPOnePodPerNode(t *testing.T) {
	t.Parallel()
	h, ctx := startHarness(t, stack.Options{})
	plugin := startTestPlugin(t, ctx, h, "10", "netip")
	const shared = "192.0.2.200"
	run := func(name, ip string) (string, error) {
		resp, err := h.Runtime.RunPodSandbox(ctx, &criruntime.RunPodSandboxRequest{
			Config: annotatedPodConfig(h, name, map[string]string{annotationIP: ip}),
		})
		return resp.GetPodSandboxId(), err
	}
	// wantRefused checks that the new pod name, handed ip, failed to start because holder holds
	// ip, and left nothing behind.
	wantRefused := func(name, ip, holder, holderName string, livePods int) {
		t.Helper()
		id, err := run(name, ip)
		if err == nil {
			t.Fatalf("pod %s handed %s, which pod %s holds, started as %s", name, ip, holderName, id)
		}
		wantErrorNaming(t, err, "nri:"+plugin.nriName()+" reports IP "+ip, stack.PodNamespace+"/"+name,
			`pod sandbox "`+holder+`" (`+stack.PodNamespace+"/"+holderName+`) holds`)
		match := conflictingPod(name).FindStringSubmatch(err.Error())
		if match == nil {
			t.Fatalf("RunPodSandbox of pod %s failed with %q, which does not name the new pod sandbox", name, err)
		}
		wantNothingLeftBehind(t, ctx, h, match[1], livePods)
		wantTornDown(t, plugin, match[1])
		if ips := cniIPsOf(t, h, match[1]); len(ips) != 0 {
			t.Errorf("the refused pod %s keeps its CNI IPs %v", match[1], ips)
		}
	}

	first, err := run("first", shared)
	if err != nil {
		t.Fatal(err)
	}
	firstCNI := cniIPOf(t, h, first)

	// A plugin handing a new pod the IP of a running pod.
	wantRefused("second", shared, first, "first", 1)

	// A plugin that starts reporting a running pod's IP for its neighbour.
	neighbour, err := run("neighbour", "192.0.2.201")
	if err != nil {
		t.Fatal(err)
	}
	neighbourCNI := cniIPOf(t, h, neighbour)
	plugin.behave(t, "neighbour", behaveReport("192.0.2.201", shared))
	wantErrorNaming(t, podStatusError(t, ctx, h, neighbour), "nri:"+plugin.nriName()+" reports IP "+shared,
		`pod sandbox "`+neighbour+`" (`+stack.PodNamespace+"/neighbour)", `pod sandbox "`+first+`" (`+stack.PodNamespace+"/first) holds")
	wantPodReady(t, ctx, h, neighbour)
	status, network := verbosePodStatus(t, ctx, h, first)
	wantIPs(t, first, status, network, liveFrom(plugin, shared), cniSourced(firstCNI))

	// ... or the IP CNI assigned to a running pod.
	plugin.behave(t, "neighbour", behaveReport("192.0.2.201", firstCNI))
	wantErrorNaming(t, podStatusError(t, ctx, h, neighbour), "reports IP "+firstCNI,
		`pod sandbox "`+first+`" (`+stack.PodNamespace+"/first) holds")
	plugin.behave(t, "neighbour", "")
	status, network = verbosePodStatus(t, ctx, h, neighbour)
	wantIPs(t, neighbour, status, network, liveFrom(plugin, "192.0.2.201"), cniSourced(neighbourCNI))

	// The IPs are held across a restart of containerd, before any query: the test plugin exits
	// with its connection, and connects again.
	if err := h.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	plugin.waitExit(t, 30*time.Second)
	plugin.start(t, ctx)
	wantRefused("third", shared, first, "first", 2)
	status, network = verbosePodStatus(t, ctx, h, first)
	wantIPs(t, first, status, network, liveFrom(plugin, shared), cniSourced(firstCNI))

	// A stopped pod's network is gone, and so is its hold on its IPs: the neighbour takes the IP.
	if _, err := h.Runtime.StopPodSandbox(ctx, &criruntime.StopPodSandboxRequest{PodSandboxId: first}); err != nil {
		t.Fatal(err)
	}
	plugin.behave(t, "neighbour", behaveReport("192.0.2.201", shared))
	status, network = verbosePodStatus(t, ctx, h, neighbour)
	wantIPs(t, neighbour, status, network, liveFrom(plugin, "192.0.2.201"), liveFrom(plugin, shared), cniSourced(neighbourCNI))
	if err := h.RemovePod(ctx, first); err != nil {
		t.Fatal(err)
	}
	wantRefused("fourth", shared, neighbour, "neighbour", 1)

	// Once the holder is removed, the IP can be reused.
	if err := h.RemovePod(ctx, neighbour); err != nil {
		t.Fatal(err)
	}
	fifth, err := run("fifth", shared)
	if err != nil {
		t.Fatalf("a new pod handed %s after its holders were removed: %v", shared, err)
	}
	status, network = verbosePodStatus(t, ctx, h, fifth)
	wantIPs(t, fifth, status, network, liveFrom(plugin, shared), cniSourced(cniIPOf(t, h, fifth)))

	// Host-network pods hold no IP and are refused none.
	hostConfig := h.HostNetworkPodConfig("host")
	hostConfig.Annotations = map[string]string{annotationIP: shared}
	runPod(t, ctx, h, hostConfig)
	status, network = verbosePodStatus(t, ctx, h, fifth)
	wantIPs(t, fifth, status, network, liveFrom(plugin, shared), cniSourced(cniIPOf(t, h, fifth)))
}
