package integration

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	criruntime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/knext-dev/knext/internal/stack"
)

// containerEvents collects the CRI container events (GetContainerEvents) of a harness.
type containerEvents struct {
	mu     sync.Mutex
	events []*criruntime.ContainerEventResponse
	err    error
}

// collectContainerEvents subscribes to h's container events until the test ends.
func collectContainerEvents(t *testing.T, ctx context.Context, h *stack.Stack) *containerEvents {
	t.Helper()
	ctx, cancel := context.WithCancel(ctx)
	stream, err := h.Runtime.GetContainerEvents(ctx, &criruntime.GetEventsRequest{})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	c := &containerEvents{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			event, err := stream.Recv()
			c.mu.Lock()
			if err != nil {
				c.err = err
				c.mu.Unlock()
				return
			}
			c.events = append(c.events, event)
			c.mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	return c
}

// of returns the events so far of the containers (sandbox IDs included) ids.
func (c *containerEvents) of(ids ...string) []*criruntime.ContainerEventResponse {
	c.mu.Lock()
	defer c.mu.Unlock()
	var events []*criruntime.ContainerEventResponse
	for _, e := range c.events {
		if slices.Contains(ids, e.ContainerId) {
			events = append(events, e)
		}
	}
	return events
}

// wait waits until an event of kind for container id arrived, and returns it.
func (c *containerEvents) wait(t *testing.T, id string, kind criruntime.ContainerEventType) *criruntime.ContainerEventResponse {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		for _, e := range c.of(id) {
			if e.ContainerEventType == kind {
				return e
			}
		}
		c.mu.Lock()
		err := c.err
		c.mu.Unlock()
		if err != nil {
			t.Fatalf("container event stream ended before %s of %s: %v", kind, id, err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %s of %s after 30s", kind, id)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// wantNoReadyWithoutIP checks that no event carries a READY pod status without IP: the kubelet
// would kill and re-create that pod.
func wantNoReadyWithoutIP(t *testing.T, events []*criruntime.ContainerEventResponse) {
	t.Helper()
	for _, e := range events {
		if s := e.PodSandboxStatus; s != nil && s.State == criruntime.PodSandboxState_SANDBOX_READY && s.GetNetwork().GetIp() == "" {
			t.Errorf("%s of %s carries a READY pod status without IP: %v", e.ContainerEventType, e.ContainerId, s)
		}
	}
}

// networkReadySamples is what sampleNetworkReady saw.
type networkReadySamples struct {
	count    int
	notReady []string // when and why NetworkReady was false, or Status failed
}

// sampleNetworkReady reads CRI Status's NetworkReady every 20 ms until the returned stop is
// called.
func sampleNetworkReady(ctx context.Context, h *stack.Stack) (stop func() networkReadySamples) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan networkReadySamples, 1)
	go func() {
		var s networkReadySamples
		for {
			resp, err := h.Runtime.Status(ctx, &criruntime.StatusRequest{})
			if ctx.Err() != nil {
				done <- s
				return
			}
			s.count++
			now := time.Now().Format(time.RFC3339Nano)
			if err != nil {
				s.notReady = append(s.notReady, now+": Status failed: "+err.Error())
			}
			for _, c := range resp.GetStatus().GetConditions() {
				if c.Type == criruntime.NetworkReady && !c.Status {
					s.notReady = append(s.notReady, fmt.Sprintf("%s: %s: %s", now, c.Reason, c.Message))
				}
			}
			select {
			case <-ctx.Done():
				done <- s
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()
	return func() networkReadySamples {
		cancel()
		return <-done
	}
}

// wantAlwaysReady checks that every sample saw NetworkReady true.
func wantAlwaysReady(t *testing.T, s networkReadySamples) {
	t.Helper()
	t.Logf("NetworkReady sampled %d times", s.count)
	if s.count < 10 {
		t.Errorf("NetworkReady sampled only %d times: the sampling proves nothing", s.count)
	}
	if len(s.notReady) > 0 {
		t.Errorf("NetworkReady was not true %d times of %d: %v", len(s.notReady), s.count, s.notReady)
	}
}

// C4, C5: the network plugin of a new pod fails from its first query on (it never answered for
// it) while a second plugin answers that it owns nothing: the pod's IPs are unknown, so
// PodSandboxStatus fails with Unavailable naming the owner, its error and the pod (not the
// plugin that answered), never reporting the CNI IP alone; the pod stays READY, and container
// events carry no pod status rather than a guessed one. Once the owner answers, its IPs are
// reported, its primary IP first, container events included.
func TestPodStatusOwnerFailsOtherAnswersEmpty(t *testing.T) {
	t.Parallel()
	h, ctx := startHarness(t, stack.Options{})
	owner := startTestPlugin(t, ctx, h, "10", "owner")
	other := startTestPlugin(t, ctx, h, "20", "other")
	other.behave(t, "", behaveEmpty)
	// Failing from the pod's first query on, at RunPodSandbox: the owner never answered for it.
	owner.behave(t, "owned", behaveError)
	events := collectContainerEvents(t, ctx, h)

	config := annotatedPodConfig(h, "owned", map[string]string{annotationIP: "192.0.2.150"})
	id := runPod(t, ctx, h, config)
	cniIP := cniIPOf(t, h, id)
	container := runContainer(t, ctx, h, id, config, "sleeper")
	if owner.calls(t, id) == 0 || other.calls(t, id) == 0 {
		t.Fatalf("RunPodSandbox asked NRI plugins %s %d times and %s %d times for pod %s, want both asked",
			owner.nriName(), owner.calls(t, id), other.nriName(), other.calls(t, id), id)
	}

	for _, verbose := range []bool{false, true} {
		_, err := h.Runtime.PodSandboxStatus(ctx, &criruntime.PodSandboxStatusRequest{PodSandboxId: id, Verbose: verbose})
		if code := status.Code(err); code != codes.Unavailable {
			t.Fatalf("status (verbose %v) of pod %s whose owner fails: code %s (%v), want %s", verbose, id, code, err, codes.Unavailable)
		}
		wantErrorNaming(t, err,
			fmt.Sprintf("IPs of pod sandbox %q (%s/owned) are unknown: NRI plugin %s gave no answer (", id, stack.PodNamespace, owner.nriName()),
			"fails on purpose", "): unavailable")
		if strings.Contains(err.Error(), other.nriName()) {
			t.Errorf("error %q names NRI plugin %s, which answered", err, other.nriName())
		}
	}
	wantPodReady(t, ctx, h, id)
	execIn(t, ctx, h, container, "true")

	// Container events do not ask the plugins: with the owner's answer unknown, they carry no
	// pod status at all.
	events.wait(t, container, criruntime.ContainerEventType_CONTAINER_STARTED_EVENT)
	unknown := events.of(id, container)
	if len(unknown) < 4 {
		t.Errorf("pod %s: %d container events (sandbox and container created and started), want 4", id, len(unknown))
	}
	for _, e := range unknown {
		if e.PodSandboxStatus != nil {
			t.Errorf("%s of %s carries pod status %v while the owner's answer is unknown, want none", e.ContainerEventType, e.ContainerId, e.PodSandboxStatus)
		}
	}

	owner.behave(t, "owned", "")
	status, network := verbosePodStatus(t, ctx, h, id)
	wantIPs(t, id, status, network, liveFrom(owner, "192.0.2.150"), cniSourced(cniIP))
	if _, err := h.Runtime.StopContainer(ctx, &criruntime.StopContainerRequest{ContainerId: container, Timeout: 1}); err != nil {
		t.Fatal(err)
	}
	stopped := events.wait(t, container, criruntime.ContainerEventType_CONTAINER_STOPPED_EVENT)
	if got := statusIPs(stopped.PodSandboxStatus); !slices.Equal(got, []string{"192.0.2.150", cniIP}) {
		t.Errorf("%s of %s after the owner answered carries IPs %v, want [192.0.2.150 %s]", stopped.ContainerEventType, container, got, cniIP)
	}
	wantNoReadyWithoutIP(t, events.of(id, container))
}

// S4, C8: the network plugin of a CNI-less node (network_plugin names it without its index)
// answers status queries too late, twice: with its default failure policy it stays connected,
// NetworkReady never turns false, and the pod keeps its IPs from the plugin's last known answer.
// After a timeout the plugin is not asked for 1 s, and after the next timeout for twice as
// long: while it backs off, a status query does not wait for it and says it is backing off. Once
// it answers in time it is live again; containerd logs the first timeout and the recovery once
// each.
func TestPodStatusOwnerTimesOutTwice(t *testing.T) {
	t.Parallel()
	const requestTimeout = 2 * time.Second // the harness's default plugin_request_timeout
	n := startCNILessNodeFollowing(t, "owner", func(*stack.Stack) []string { return nil })
	h, ctx := n.h, n.ctx
	owner := startTestPlugin(t, ctx, h, "10", "owner")
	other := startTestPlugin(t, ctx, h, "20", "other")
	other.behave(t, "", behaveEmpty)
	n.waitNetworkReady(t, true)
	connections := owner.connections(t)

	id := runPod(t, ctx, h, annotatedPodConfig(h, "owned", map[string]string{
		annotationIP: "192.0.2.160", annotationAdditionalIPs: "2001:db8::160",
	}))
	status, network := verbosePodStatus(t, ctx, h, id)
	wantIPs(t, id, status, network, liveFrom(owner, "192.0.2.160"), liveFrom(owner, "2001:db8::160"))
	lastKnown := []reportedIP{lastKnownFrom(owner, "192.0.2.160"), lastKnownFrom(owner, "2001:db8::160")}

	stopSampling := sampleNetworkReady(ctx, h)
	owner.behave(t, "owned", behaveSlow(requestTimeout+time.Second))
	var (
		backoffLatencies []time.Duration
		timedOut         time.Time
	)
	for round := 1; round <= 2; round++ {
		// The query that times out: the plugin is asked (a probe in round 2, once the first
		// backoff of 1 s expired) and its last known answer stands in.
		status, network, elapsed := timedVerboseStatus(t, ctx, h, id)
		timedOut = time.Now()
		t.Logf("round %d: the status query that timed out took %s (plugin_request_timeout %s)", round, elapsed, requestTimeout)
		if elapsed < requestTimeout-500*time.Millisecond || elapsed > requestTimeout+5*time.Second {
			t.Errorf("round %d: the status query of pod %s took %s, want about plugin_request_timeout %s", round, id, elapsed, requestTimeout)
		}

		// The next query, during the backoff: not asked, answered from the last known answer.
		calls := owner.calls(t, id)
		start := time.Now()
		plain, err := h.Runtime.PodSandboxStatus(ctx, &criruntime.PodSandboxStatusRequest{PodSandboxId: id})
		latency := time.Since(start)
		backoffStatus, backoffNetwork, _ := timedVerboseStatus(t, ctx, h, id)
		if err != nil {
			t.Fatalf("round %d: status of pod %s during the backoff: %v", round, id, err)
		}
		if since := time.Since(timedOut); since >= time.Second {
			t.Fatalf("round %d: the queries during the backoff ended %s after the timeout, past the shortest backoff (1s): the test was too slow to prove anything", round, since)
		}
		backoffLatencies = append(backoffLatencies, latency)
		t.Logf("round %d: the status query during the backoff took %s", round, latency)

		wantIPs(t, id, status, network, lastKnown...)
		wantNoAnswer(t, id, network, owner.nriName(), "deadline exceeded")
		if got := statusIPs(plain.Status); !slices.Equal(got, []string{"192.0.2.160", "2001:db8::160"}) {
			t.Errorf("round %d: pod %s reports %v during the backoff, want its last known IPs", round, id, got)
		}
		wantIPs(t, id, backoffStatus, backoffNetwork, lastKnown...)
		wantNoAnswer(t, id, backoffNetwork, owner.nriName(), errBackingOff)
		if asked := owner.calls(t, id) - calls; asked != 0 {
			t.Errorf("round %d: NRI plugin %s was asked %d times during its backoff, want never", round, owner.nriName(), asked)
		}
		wantStillConnected(t, h, owner.nriName(), owner.process, connections)
		if round == 1 {
			// Let the first backoff (1 s) expire: the next query probes the plugin.
			time.Sleep(time.Until(timedOut.Add(1100 * time.Millisecond)))
		}
	}
	// The one bound the issue asks for: a query during the backoff does not wait for the plugin.
	if backoffLatencies[0] >= 50*time.Millisecond {
		t.Errorf("the second query, during the backoff, took %s, want < 50ms", backoffLatencies[0])
	}
	// The second timeout doubled the backoff: past the first backoff's 1 s, the plugin is still
	// not asked.
	time.Sleep(time.Until(timedOut.Add(1300 * time.Millisecond)))
	calls := owner.calls(t, id)
	status, network, _ = timedVerboseStatus(t, ctx, h, id)
	if asked := owner.calls(t, id) - calls; asked != 0 {
		t.Errorf("NRI plugin %s was asked %d times 1.3s after its second timeout, want never: its backoff did not double", owner.nriName(), asked)
	} else if since := time.Since(timedOut); since >= 2*time.Second {
		t.Fatalf("the query 1.3s after the second timeout ended %s after it, past the doubled backoff (2s): the test was too slow to prove anything", since)
	}
	wantIPs(t, id, status, network, lastKnown...)
	wantNoAnswer(t, id, network, owner.nriName(), errBackingOff)

	owner.behave(t, "owned", "")
	status, network = waitLiveAgain(t, ctx, h, id, owner.nriName())
	wantIPs(t, id, status, network, liveFrom(owner, "192.0.2.160"), liveFrom(owner, "2001:db8::160"))
	wantAlwaysReady(t, stopSampling())
	wantStillConnected(t, h, owner.nriName(), owner.process, connections)
	// Entering and leaving the backoff are logged once each; the second timeout, while backing
	// off, is not.
	for _, line := range []string{
		"plugin " + owner.nriName() + " did not answer PodSandboxStatus within " + requestTimeout.String() +
			": not asked again for 1s, and longer while it does not answer in time",
		"plugin " + owner.nriName() + " answers PodSandboxStatus again",
	} {
		if n := logCount(t, h, line); n != 1 {
			t.Errorf("containerd logged %q %d times, want once", line, n)
		}
	}
}

// pidOf returns the PID of the one process whose executable is binary.
func pidOf(t *testing.T, binary string) int {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if exe, err := os.Readlink("/proc/" + e.Name() + "/exe"); err == nil && exe == binary {
			pids = append(pids, pid)
		}
	}
	if len(pids) != 1 {
		t.Fatalf("processes of %s: %v, want one", binary, pids)
	}
	return pids[0]
}

// parentOf returns the parent PID of process pid.
func parentOf(t *testing.T, pid int) int {
	t.Helper()
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	// pid (comm) state ppid ...: comm may hold spaces, not ')'.
	fields := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
	ppid, err := strconv.Atoi(fields[1])
	if err != nil {
		t.Fatalf("/proc/%d/stat: %v", pid, err)
	}
	return ppid
}

// S10, S4: a pre-installed network plugin (containerd started it from plugin_path) that reports
// pods' IPs at RunPodSandbox and is stalled past plugin_request_timeout, SIGSTOPped as a starved
// or paused process would be, costs status queries nothing (they never ask it) and stays
// connected: once SIGCONTed, the same process networks new pods, and the node's network never
// stops being ready.
func TestPodStatusStalledPreinstalledPlugin(t *testing.T) {
	t.Parallel()
	n := startCNILessNodeFollowing(t, "bridge", func(*stack.Stack) []string { return nil })
	n.preinstallBridge(t)
	a := n.runBridgePod(t, "a")
	ips := statusIPs(podStatus(t, n.ctx, n.h, a.id))
	n.wantBridgeIPs(t, a, nriAtRunPodSandbox, ips...)
	pid := pidOf(t, n.preinstalledBridgePath())
	if parent := parentOf(t, pid); parent != n.h.PID() {
		t.Fatalf("nri-bridge (pid %d) is a child of %d, want containerd (pid %d)", pid, parent, n.h.PID())
	}
	connections := nriConnections(t, n.h, nriBridgeName)
	t.Cleanup(func() {
		if err := syscall.Kill(pid, syscall.SIGCONT); err != nil && !errors.Is(err, syscall.ESRCH) {
			t.Errorf("SIGCONT nri-bridge (pid %d): %v", pid, err)
		}
	})

	stopSampling := sampleNetworkReady(n.ctx, n.h)
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	status, network, elapsed := timedVerboseStatus(t, n.ctx, n.h, a.id)
	t.Logf("with nri-bridge stopped, a status query took %s", elapsed)
	wantIPs(t, a.id, status, network, bridgeReportedIPs(ips)...)
	if len(network.NRINoAnswer) != 0 {
		t.Errorf("pod %s shows plugins without answer %+v: nri-bridge was asked", a.id, network.NRINoAnswer)
	}

	if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	n.wantBridgeIPs(t, a, nriAtRunPodSandbox, ips...)
	if now := pidOf(t, n.preinstalledBridgePath()); now != pid {
		t.Errorf("nri-bridge runs as pid %d, before the stall as %d: it was restarted", now, pid)
	}
	wantStillConnected(t, n.h, nriBridgeName, nil, connections)

	// The same process still handles pod lifecycle events: it networks a new pod.
	b := n.runBridgePod(t, "b")
	ipsB := statusIPs(podStatus(t, n.ctx, n.h, b.id))
	n.wantBridgeIPs(t, b, nriAtRunPodSandbox, ipsB...)
	execIn(t, n.ctx, n.h, a.container, "ping", "-c", "1", "-W", "5", ipsB[0])
	wantAlwaysReady(t, stopSampling())
}

// bridgeReportedIPs are ips as nri-bridge reports them, in its RunPodSandbox answer.
func bridgeReportedIPs(ips []string) []reportedIP {
	reported := make([]reportedIP, 0, len(ips))
	for _, ip := range ips {
		reported = append(reported, reportedIP{IP: ip, Source: "nri:" + nriBridgeName, NRI: nriAtRunPodSandbox})
	}
	return reported
}
