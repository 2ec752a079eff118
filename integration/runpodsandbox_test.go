package integration

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	criruntime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/knext-dev/knext/internal/stack"
)

// runReporter is podipobserver, a plugin on knext's stub that reports pods' IPs in its RunPodSandbox answer
// (the annotation runIPsAnnotation(name)) and records every event with the IPs it is shown.
type runReporter struct {
	h       *stack.Stack
	name    string
	idx     string
	out     string
	process *stack.Process
}

func (r *runReporter) nriName() string { return r.idx + "-" + r.name }

// runIPsAnnotation is the annotation whose comma-separated IPs the reporter name reports.
func runIPsAnnotation(name string) string { return "knext.test/" + name + ".run-ips" }

func startRunReporter(t *testing.T, ctx context.Context, h *stack.Stack, idx, name string) *runReporter {
	t.Helper()
	r := &runReporter{h: h, name: name, idx: idx, out: filepath.Join(h.Root, "events-"+idx+"-"+name+".json")}
	r.start(t, ctx)
	return r
}

// start runs the reporter's process (again) and waits until NRI has synchronized it.
func (r *runReporter) start(t *testing.T, ctx context.Context) {
	t.Helper()
	r.process = startSynchronizedPlugin(t, ctx, r.h, r.idx, r.name, podIPObserverPath(t), "-out", r.out)
}

// events returns the events recorded for pod sandbox id, in order.
func (r *runReporter) events(t *testing.T, id string) []observedPodIPs {
	t.Helper()
	var events []observedPodIPs
	for _, e := range readObservations(t, r.out) {
		if e.Pod == id {
			events = append(events, e)
		}
	}
	return events
}

// wantEventsWithIPs checks that the reporter got each of events for pod sandbox id since the
// first from (its index in events(t, id)), each showing ips.
func (r *runReporter) wantEventsWithIPs(t *testing.T, id string, from int, ips []string, events ...string) int {
	t.Helper()
	got := r.events(t, id)[from:]
	for _, want := range events {
		i := slices.IndexFunc(got, func(e observedPodIPs) bool { return e.Event == want })
		if i < 0 {
			t.Errorf("plugin %s got no %s for pod %s since event %d: %+v", r.nriName(), want, id, from, got)
			continue
		}
		gotIPs, wantIPs := got[i].IPs, ips
		if want == "RunPodSandbox" {
			// The IPs reported so far, in the order they were: the pod's primary is decided once
			// every plugin has answered.
			gotIPs, wantIPs = slices.Sorted(slices.Values(gotIPs)), slices.Sorted(slices.Values(wantIPs))
		}
		if !slices.Equal(gotIPs, wantIPs) {
			t.Errorf("plugin %s: %s of pod %s shows IPs %v, want %v", r.nriName(), want, id, got[i].IPs, ips)
		}
	}
	return from + len(got)
}

// metricsConfig has containerd serve its metrics on a free loopback address, which it returns.
func metricsConfig(t *testing.T) (string, string) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	address := l.Addr().String()
	l.Close()
	return fmt.Sprintf("[plugins.'io.containerd.server.v1.metrics']\naddress = %q\n", address), address
}

// nriInvocations counts NRI's recorded calls of operation to plugin nriName, from containerd's
// metrics (since its start).
func nriInvocations(t *testing.T, address, nriName, operation string) int {
	t.Helper()
	resp, err := http.Get("http://" + address + "/v1/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	total := 0
	for line := range strings.SplitSeq(string(body), "\n") {
		if !strings.HasPrefix(line, "containerd_nri_plugin_invocations_total{") ||
			!strings.Contains(line, `operation="`+operation+`"`) || !strings.Contains(line, `plugin="`+nriName+`"`) {
			continue
		}
		var n int
		if _, err := fmt.Sscan(line[strings.LastIndex(line, " ")+1:], &n); err != nil {
			t.Fatalf("metrics line %q: %v", line, err)
		}
		total += n
	}
	return total
}

// A plugin that reports a pod's IPs in its RunPodSandbox answer, with CNI and without: CRI
// reports them (crictl inspectp too) as of RunPodSandbox; they survive a containerd restart and
// a plugin restart; the plugin, not subscribed to PodSandboxStatus, is never asked for status;
// and every plugin sees the pod's IPs, as CRI reports them, in every event: RunPodSandbox after
// the reporter, container events, Synchronize (a plugin joining late, and after a containerd
// restart), UpdatePodSandbox, StopPodSandbox and RemovePodSandbox.
func TestRunPodSandboxAnswerIPs(t *testing.T) {
	t.Parallel()
	for _, cniLess := range []bool{false, true} {
		t.Run(map[bool]string{false: "CNI", true: "CNI-less"}[cniLess], func(t *testing.T) {
			t.Parallel()
			extra, metrics := metricsConfig(t)
			opts := stack.Options{ExtraConfig: extra}
			if cniLess {
				opts.ExtraConfig += cniDisabled + "network_plugin = \"reporter\"\n"
				opts.SkipNetworkReadyWait = true
			}
			h, ctx := startHarness(t, opts)
			reporter := startRunReporter(t, ctx, h, "10", "reporter")
			observer := startRunReporter(t, ctx, h, "90", "observer")
			if cniLess {
				if cond := networkCondition(t, ctx, h); !cond.Status {
					t.Errorf("NetworkReady false with the network plugin reporting at RunPodSandbox connected: %s", cond.Message)
				}
			}

			config := annotatedPodConfig(h, "reported", map[string]string{runIPsAnnotation("reporter"): "10.99.0.7,FD99::7"})
			id := runPod(t, ctx, h, config)
			want := []reportedIP{
				{IP: "10.99.0.7", Source: "nri:10-reporter", NRI: nriAtRunPodSandbox},
				{IP: "fd99::7", Source: "nri:10-reporter", NRI: nriAtRunPodSandbox},
			}
			if !cniLess {
				want = append(want, cniSourced(cniIPOf(t, h, id)))
			}
			var ips []string
			for _, ip := range want {
				ips = append(ips, ip.IP)
			}
			wantReported := func(when string) {
				t.Helper()
				status, network := verbosePodStatus(t, ctx, h, id)
				wantIPs(t, id, status, network, want...)
				if shown := crictlInspectp(t, ctx, h, id); !slices.Equal(shown.PodNetwork.IPs, want) {
					t.Errorf("%s: crictl inspectp shows IPs %+v, want %+v", when, shown.PodNetwork.IPs, want)
				}
			}
			wantReported("after RunPodSandbox")
			if got := reporter.events(t, id); len(got) == 0 || len(got[0].IPs) != len(ips)-2 {
				t.Errorf("the reporter saw RunPodSandbox with IPs %+v, want the runtime's own only", got)
			}
			seen := observer.wantEventsWithIPs(t, id, 0, ips, "RunPodSandbox")
			runContainer(t, ctx, h, id, config, "sleeper")
			seen = observer.wantEventsWithIPs(t, id, seen, ips, "CreateContainer", "StartContainer")

			late := startRunReporter(t, ctx, h, "95", "late")
			late.wantEventsWithIPs(t, id, 0, ips, "Synchronize")

			if calls, runs := nriInvocations(t, metrics, reporter.nriName(), "PodSandboxStatus"), nriInvocations(t, metrics, reporter.nriName(), "RunPodSandbox"); calls != 0 || runs != 1 {
				t.Errorf("NRI called the reporter %d times for PodSandboxStatus and %d for RunPodSandbox, want 0 and 1", calls, runs)
			}

			// A plugin restart changes nothing.
			if err := reporter.process.Kill(); err != nil {
				t.Fatal(err)
			}
			wantReported("with the reporter gone")
			reporter.start(t, ctx)
			wantReported("with the reporter back")

			// Neither does a containerd restart; the plugins, reconnecting, see the IPs.
			if err := h.Restart(ctx); err != nil {
				t.Fatal(err)
			}
			wantReported("after a containerd restart")
			for _, p := range []*runReporter{reporter, observer} {
				p.start(t, ctx)
			}
			seen = observer.wantEventsWithIPs(t, id, seen, ips, "Synchronize")
			wantReported("after a containerd restart, the plugins back")
			if calls := nriInvocations(t, metrics, reporter.nriName(), "PodSandboxStatus"); calls != 0 {
				t.Errorf("NRI called the reporter %d times for PodSandboxStatus after the restart, want 0", calls)
			}

			if _, err := h.Runtime.UpdatePodSandboxResources(ctx, &criruntime.UpdatePodSandboxResourcesRequest{
				PodSandboxId: id, Resources: &criruntime.LinuxContainerResources{CpuShares: 512},
			}); err != nil {
				t.Fatal(err)
			}
			if _, err := h.Runtime.StopPodSandbox(ctx, &criruntime.StopPodSandboxRequest{PodSandboxId: id}); err != nil {
				t.Fatal(err)
			}
			if _, err := h.Runtime.RemovePodSandbox(ctx, &criruntime.RemovePodSandboxRequest{PodSandboxId: id}); err != nil {
				t.Fatal(err)
			}
			observer.wantEventsWithIPs(t, id, seen, ips, "UpdatePodSandbox", "StopContainer", "RemoveContainer", "StopPodSandbox", "RemovePodSandbox")
		})
	}
}

// Two plugins that report different primary IPs at RunPodSandbox: it fails naming both plugins
// and both IPs, and leaves no sandbox behind; the plugins were told to tear the pod down.
func TestRunPodSandboxAnswersConflict(t *testing.T) {
	t.Parallel()
	h, ctx := startHarness(t, stack.Options{ExtraConfig: cniDisabled, SkipNetworkReadyWait: true})
	first := startRunReporter(t, ctx, h, "10", "first")
	second := startRunReporter(t, ctx, h, "20", "second")
	config := annotatedPodConfig(h, "conflict", map[string]string{
		runIPsAnnotation("first"): "10.99.0.7", runIPsAnnotation("second"): "10.99.0.8,fd99::8",
	})
	_, err := h.Runtime.RunPodSandbox(ctx, &criruntime.RunPodSandboxRequest{Config: config})
	if err == nil {
		t.Fatal("RunPodSandbox succeeded with two plugins reporting different primary IPs")
	}
	wantErrorNaming(t, err, "NRI plugins 10-first and 20-second both report the primary IP of the pod: 10.99.0.7 and 10.99.0.8")
	pods, err := h.Runtime.ListPodSandbox(ctx, &criruntime.ListPodSandboxRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(pods.Items) != 0 {
		t.Errorf("a failed RunPodSandbox left pods behind: %v", pods.Items)
	}
	for _, p := range []*runReporter{first, second} {
		events, err := os.ReadFile(p.out)
		if err != nil {
			t.Fatal(err)
		}
		for _, want := range []string{`"event":"RunPodSandbox"`, `"event":"StopPodSandbox"`, `"event":"RemovePodSandbox"`} {
			if !strings.Contains(string(events), want) {
				t.Errorf("plugin %s got no %s for the failed pod: %s", p.nriName(), want, events)
			}
		}
	}

	// A pod they agree on starts.
	runPod(t, ctx, h, annotatedPodConfig(h, "agreed", map[string]string{
		runIPsAnnotation("first"): "10.99.0.9", runIPsAnnotation("second"): "10.99.0.9,fd99::9",
	}))
}

// The IPs a plugin reports at RunPodSandbox are the pod's own, as CNI's are: a plugin answering
// status queries adds IPs behind them, and cannot change the primary.
func TestRunPodSandboxAnswerAndStatusAnswerMerge(t *testing.T) {
	t.Parallel()
	h, ctx := startHarness(t, stack.Options{})
	reporter := startRunReporter(t, ctx, h, "20", "reporter")
	status := startTestPlugin(t, ctx, h, "10", "status")
	id := runPod(t, ctx, h, annotatedPodConfig(h, "merged", map[string]string{
		runIPsAnnotation("reporter"):                 "10.99.0.7,fd99::7",
		pluginAnnotation("status", "additional-ips"): "10.77.0.2",
	}))
	cniIP := cniIPOf(t, h, id)
	st, network := verbosePodStatus(t, ctx, h, id)
	wantIPs(t, id, st, network,
		reportedIP{IP: "10.99.0.7", Source: "nri:" + reporter.nriName(), NRI: nriAtRunPodSandbox},
		reportedIP{IP: "fd99::7", Source: "nri:" + reporter.nriName(), NRI: nriAtRunPodSandbox},
		cniSourced(cniIP), liveFrom(status, "10.77.0.2"))

	// A status answer that would change the running pod's primary IP fails the query.
	status.behave(t, "", behaveReport("10.77.0.1"))
	wantErrorNaming(t, podStatusError(t, ctx, h, id), stack.PodNamespace+"/merged",
		"has the primary IP 10.99.0.7 (nri:20-reporter), and its IPs would now make it 10.77.0.1 (nri:10-status)")
	status.behave(t, "", "")

	// Before the pod runs, a status answer's primary IP overrides the RunPodSandbox answer's, as
	// it does CNI's.
	second := runPod(t, ctx, h, annotatedPodConfig(h, "overridden", map[string]string{
		runIPsAnnotation("reporter"):     "10.99.0.8",
		pluginAnnotation("status", "ip"): "10.77.0.3",
	}))
	st, network = verbosePodStatus(t, ctx, h, second)
	wantIPs(t, second, st, network, liveFrom(status, "10.77.0.3"),
		reportedIP{IP: "10.99.0.8", Source: "nri:" + reporter.nriName(), NRI: nriAtRunPodSandbox}, cniSourced(cniIPOf(t, h, second)))
}

// One IP, one pod: a plugin reporting at RunPodSandbox, for a new pod, the IP a running pod holds
// fails the new pod's RunPodSandbox naming both pods, and leaves it nothing; once the first pod
// is gone, the IP can be reported again.
func TestRunPodSandboxAnswerWithAnotherPodsIP(t *testing.T) {
	t.Parallel()
	h, ctx := startHarness(t, stack.Options{ExtraConfig: cniDisabled, SkipNetworkReadyWait: true})
	startRunReporter(t, ctx, h, "10", "reporter")
	same := map[string]string{runIPsAnnotation("reporter"): "10.99.0.7"}
	first := runPod(t, ctx, h, annotatedPodConfig(h, "first", same))
	_, err := h.Runtime.RunPodSandbox(ctx, &criruntime.RunPodSandboxRequest{Config: annotatedPodConfig(h, "second", same)})
	if err == nil {
		t.Fatal("RunPodSandbox of a second pod with the first one's IP succeeded")
	}
	wantErrorNaming(t, err, "nri:10-reporter reports IP 10.99.0.7", stack.PodNamespace+"/second",
		`pod sandbox "`+first+`" (`+stack.PodNamespace+"/first) holds")
	pods, err := h.Runtime.ListPodSandbox(ctx, &criruntime.ListPodSandboxRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(pods.Items) != 1 || pods.Items[0].Id != first {
		t.Errorf("pods after the refused one: %v, want %s alone", pods.Items, first)
	}

	if _, err := h.Runtime.StopPodSandbox(ctx, &criruntime.StopPodSandboxRequest{PodSandboxId: first}); err != nil {
		t.Fatal(err)
	}
	second := runPod(t, ctx, h, annotatedPodConfig(h, "second", same))
	if ips := statusIPs(podStatus(t, ctx, h, second)); !slices.Equal(ips, []string{"10.99.0.7"}) {
		t.Errorf("pod %s reports %v once the first pod stopped, want 10.99.0.7", second, ips)
	}
}
