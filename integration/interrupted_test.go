package integration

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	criruntime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/knext-dev/knext/internal/stack"
)

// Pods started 8 at a time while an NRI network plugin is killed and containerd restarts: every
// RunPodSandbox that a restart cuts short before containerd recorded the sandbox's setup complete
// must leave no READY sandbox, and nothing that outlives the pod once every sandbox is removed.

const (
	churnPods     = 100
	churnParallel = 8
	// How many pods have started when nri-bridge is SIGKILLed (and started again a second
	// later), when containerd is restarted with SIGTERM, and when it is SIGKILLed and started.
	churnKillBridgeAt  = 25
	churnRestartAt     = 45
	churnKillRestartAt = 70
	// churnTimeout bounds a churn run, removals included.
	churnTimeout = 8 * time.Minute
)

// churnPod is one pod of a churn run: the sandbox its successful RunPodSandbox returned.
type churnPod struct {
	name    string
	id      string
	attempt uint32
	err     error // the last failure, if it never started
}

// churnFigures is what a churn run counted, and whether its containerd records setups.
type churnFigures struct {
	calls, failed int // RunPodSandbox calls, and those that failed (each retried with a new attempt)
	sandboxes     int // sandboxes listed once every pod started
	// orphans are sandboxes no RunPodSandbox returned to the client; readyOrphans those of them
	// that are READY; of those, setUp the ones whose record says that containerd set them up
	// completely (it stopped, or the client's call timed out, after that and before its answer
	// reached the client), counted on knext only (setupOnRecord: upstream records no setup), and
	// answered the ones containerd logged as returned (the answer was lost on its way).
	orphans, readyOrphans, setUp, answered int
	setupOnRecord                          bool
	readyWithoutIP                         int
	duplicateIPs                           int
	podsWithoutReadyIP                     int // pods whose returned sandbox is not READY with an IP
	left                                   map[string]int
}

func (f churnFigures) String() string {
	var left []string
	for _, kind := range slices.Sorted(maps.Keys(f.left)) {
		left = append(left, fmt.Sprintf("%s %d", kind, f.left[kind]))
	}
	setUp := "n/a"
	if f.setupOnRecord {
		setUp = fmt.Sprint(f.setUp)
	}
	return fmt.Sprintf("%d pods, %d at a time: %d RunPodSandbox calls, %d failed and retried; %d sandboxes, %d orphans "+
		"(%d READY: %s set up completely on record, %d logged as answered), %d READY without IP, %d duplicate IPs, "+
		"%d pods without their sandbox READY with an IP; left after removing every sandbox: %s",
		churnPods, churnParallel, f.calls, f.failed, f.sandboxes, f.orphans, f.readyOrphans, setUp, f.answered,
		f.readyWithoutIP, f.duplicateIPs, f.podsWithoutReadyIP, strings.Join(left, ", "))
}

// churnNode is a node under churn: CNI (nri-bridge nil) or CNI-less with nri-bridge.
type churnNode struct {
	h      *stack.Stack
	bridge *cniLessNode
}

// startPods runs churnPods pods, churnParallel at a time, each retried with the next attempt
// number until RunPodSandbox succeeds; faults runs meanwhile, given a wait for that many pods
// to have started.
func (n *churnNode) startPods(ctx context.Context, faults func(waitStarted func(int32) error) error) ([]churnPod, int, int, error) {
	// A failed fault (containerd does not come back) ends the run.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	pods := make([]churnPod, churnPods)
	var started, calls, failed atomic.Int32
	next := make(chan int)
	var workers sync.WaitGroup
	for range churnParallel {
		workers.Go(func() {
			for i := range next {
				pod := churnPod{name: fmt.Sprintf("churn-%03d", i)}
				// Each failure is retried after a back-off, as the kubelet does: 0.2 s, doubling to 2 s.
				backOff := 200 * time.Millisecond
				for ; ctx.Err() == nil; pod.attempt++ {
					config := n.h.PodConfig(pod.name)
					config.Metadata.Attempt = pod.attempt
					callCtx, cancel := context.WithTimeout(ctx, time.Minute)
					resp, err := n.h.Runtime.RunPodSandbox(callCtx, &criruntime.RunPodSandboxRequest{Config: config})
					cancel()
					calls.Add(1)
					if err == nil {
						pod.id, pod.err = resp.PodSandboxId, nil
						started.Add(1)
						break
					}
					failed.Add(1)
					pod.err = err
					time.Sleep(backOff)
					backOff = min(2*backOff, 2*time.Second)
				}
				pods[i] = pod
			}
		})
	}
	faultErr := make(chan error, 1)
	go func() {
		err := faults(func(want int32) error {
			for started.Load() < want {
				if ctx.Err() != nil {
					return fmt.Errorf("%d pods started, waiting for %d: %w", started.Load(), want, ctx.Err())
				}
				time.Sleep(20 * time.Millisecond)
			}
			return nil
		})
		if err != nil {
			cancel()
		}
		faultErr <- err
	}()
	for i := range churnPods {
		next <- i
	}
	close(next)
	workers.Wait()
	return pods, int(calls.Load()), int(failed.Load()), <-faultErr
}

// audit counts, once every pod started, the sandboxes no client asked for and those READY
// without network, and reads the records of the READY ones no client asked for.
func (n *churnNode) audit(t *testing.T, ctx context.Context, pods []churnPod, figures *churnFigures) {
	t.Helper()
	returned := map[string]bool{}
	for _, pod := range pods {
		returned[pod.id] = true
	}
	list, err := n.h.Runtime.ListPodSandbox(ctx, &criruntime.ListPodSandboxRequest{})
	if err != nil {
		t.Fatal(err)
	}
	figures.sandboxes = len(list.Items)
	holders := map[string][]string{}
	readyWithIP := map[string]bool{}
	for _, sandbox := range list.Items {
		resp, err := n.h.Runtime.PodSandboxStatus(ctx, &criruntime.PodSandboxStatusRequest{PodSandboxId: sandbox.Id})
		if err != nil {
			t.Errorf("status of sandbox %s (%s): %v", sandbox.Id, sandbox.Metadata.GetName(), err)
			continue
		}
		status := resp.Status
		ready := status.State == criruntime.PodSandboxState_SANDBOX_READY
		ips := statusIPs(status)
		if ready && len(ips) == 0 {
			figures.readyWithoutIP++
			t.Logf("sandbox %s of pod %s (attempt %d) is READY without IP", sandbox.Id, sandbox.Metadata.GetName(), sandbox.Metadata.GetAttempt())
		}
		if ready {
			for _, ip := range ips {
				holders[ip] = append(holders[ip], sandbox.Id)
			}
			readyWithIP[sandbox.Id] = len(ips) > 0
		}
		if returned[sandbox.Id] {
			continue
		}
		figures.orphans++
		if ready {
			figures.readyOrphans++
			// The instrumented CRI service logs the ID it returns; a containerd stopped after it
			// recorded the setup complete may not get as far as that, and one that logs it may
			// still lose the answer.
			answered := logCount(t, n.h, "RunPodSandbox for", `returns sandbox id \"`+sandbox.Id+`\"`) > 0
			if answered {
				figures.answered++
			}
			name, attempt := sandbox.Metadata.GetName(), sandbox.Metadata.GetAttempt()
			if !figures.setupOnRecord {
				if !answered {
					t.Logf("sandbox %s of pod %s (attempt %d) is READY, but its RunPodSandbox never returned", sandbox.Id, name, attempt)
				}
			} else if complete, err := setupComplete(ctx, n.h, sandbox.Id); err != nil {
				t.Error(err)
			} else if complete {
				figures.setUp++
				t.Logf("sandbox %s of pod %s (attempt %d) is READY although its RunPodSandbox never returned: containerd had "+
					"recorded its setup complete (its answer logged: %v)", sandbox.Id, name, attempt, answered)
			} else {
				t.Logf("sandbox %s of pod %s (attempt %d) is READY, but its RunPodSandbox never returned and its record "+
					"does not say it was set up completely (its answer logged: %v)", sandbox.Id, name, attempt, answered)
			}
		}
	}
	for ip, ids := range holders {
		if len(ids) > 1 {
			figures.duplicateIPs++
			t.Logf("IP %s is held by READY sandboxes %v", ip, ids)
		}
	}
	for _, pod := range pods {
		if pod.id == "" || !readyWithIP[pod.id] {
			figures.podsWithoutReadyIP++
			t.Logf("pod %s: its sandbox %q (attempt %d) is not READY with an IP (last error: %v)", pod.name, pod.id, pod.attempt, pod.err)
		}
	}
}

// removeAll stops and removes every sandbox, churnParallel at a time.
func (n *churnNode) removeAll(t *testing.T, ctx context.Context) {
	t.Helper()
	list, err := n.h.Runtime.ListPodSandbox(ctx, &criruntime.ListPodSandboxRequest{})
	if err != nil {
		t.Fatal(err)
	}
	ids := make(chan string)
	var workers sync.WaitGroup
	for range churnParallel {
		workers.Go(func() {
			for id := range ids {
				if err := n.h.RemovePod(ctx, id); err != nil {
					t.Errorf("remove sandbox %s: %v", id, err)
				}
			}
		})
	}
	for _, sandbox := range list.Items {
		ids <- sandbox.Id
	}
	close(ids)
	workers.Wait()
}

// leftovers counts what the node still holds of its pods: sandboxes (CRI's and the sandbox
// store's records), containers, shims, pod processes, network namespaces, veths, and the pod
// network's address allocations. Counting nri-bridge's allocations stops it.
func (n *churnNode) leftovers(t *testing.T, ctx context.Context) map[string]int {
	t.Helper()
	left := map[string]int{}
	list, err := n.h.Runtime.ListPodSandbox(ctx, &criruntime.ListPodSandboxRequest{})
	if err != nil {
		t.Fatal(err)
	}
	left["CRI sandboxes"] = len(list.Items)
	for kind, args := range map[string][]string{"sandbox records": {"sandboxes", "ls"}, "containers": {"containers", "ls"}} {
		out, err := n.h.Ctr(ctx, args...)
		if err != nil {
			t.Fatal(err)
		}
		// One line per item after the header.
		left[kind] = max(len(strings.Split(strings.TrimSpace(string(out)), "\n"))-1, 0)
	}
	shims, err := n.h.Shims()
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range shims {
		t.Logf("left: the shim of %s", id)
	}
	left["shims"] = len(shims)
	processes, err := n.h.PodProcesses()
	if err != nil {
		t.Fatal(err)
	}
	left["pod processes"] = len(processes)
	netns, err := filepath.Glob(filepath.Join(n.h.NetNSDir, "*"))
	if err != nil {
		t.Fatal(err)
	}
	for _, path := range netns {
		t.Logf("left: network namespace %s", path)
	}
	left["netns"] = len(netns)
	if ports, err := n.h.BridgePorts(); err == nil {
		left["veths"] = len(ports)
	}
	if n.bridge == nil {
		left["host-local allocations"] = hostLocalAllocations(t, n.h)
	} else {
		allocations := n.bridge.allocationsLeft(t, ctx)
		for _, a := range allocations {
			t.Logf("left: %s", a)
		}
		left["nri-bridge allocations"] = len(allocations)
	}
	return left
}

// hostLocalAllocations counts the addresses host-local holds for the instance's network.
func hostLocalAllocations(t *testing.T, h *stack.Stack) int {
	t.Helper()
	entries, err := os.ReadDir(filepath.Join(h.IPAMDataDir, h.Network))
	if errors.Is(err, os.ErrNotExist) {
		return 0
	}
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range entries {
		if _, err := netip.ParseAddr(e.Name()); err == nil {
			n++
		}
	}
	return n
}

// allocationsLeft stops nri-bridge and returns the allocations its store still holds, as
// `nri-bridge -cleanup` names them when it removes them.
func (n *cniLessNode) allocationsLeft(t *testing.T, ctx context.Context) []string {
	t.Helper()
	if n.bridge != nil {
		if err := n.bridge.Stop(); err != nil {
			t.Fatal(err)
		}
		n.bridge = nil
	}
	out, err := exec.CommandContext(ctx, nriBridgePath(t), append([]string{"-cleanup"}, n.bridgeArgs...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("nri-bridge -cleanup: %v\n%s", err, out)
	}
	var left []string
	for line := range strings.SplitSeq(string(out), "\n") {
		if strings.Contains(line, "removed nbr") {
			left = append(left, line)
		}
	}
	return left
}

// churn starts the pods under faults, audits them, removes every sandbox and counts what is
// left.
func (n *churnNode) churn(t *testing.T) churnFigures {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), churnTimeout)
	defer cancel()
	var bridgeBinary string
	if n.bridge != nil {
		bridgeBinary = nriBridgePath(t)
	}
	start := time.Now()
	pods, calls, failed, err := n.startPods(ctx, func(waitStarted func(int32) error) error {
		if n.bridge != nil {
			if err := waitStarted(churnKillBridgeAt); err != nil {
				return err
			}
			if err := n.bridge.bridge.Kill(); err != nil {
				return err
			}
			time.Sleep(time.Second)
			p, err := n.h.StartProcess("nri-bridge", bridgeBinary, n.bridge.bridgeArgs...)
			if err != nil {
				return err
			}
			n.bridge.bridge = p
		}
		if err := waitStarted(churnRestartAt); err != nil {
			return err
		}
		if err := n.h.Restart(ctx); err != nil {
			return err
		}
		if err := waitStarted(churnKillRestartAt); err != nil {
			return err
		}
		if err := n.h.Kill(); err != nil {
			return err
		}
		return n.h.Start(ctx)
	})
	if err != nil {
		t.Fatalf("faults: %v", err)
	}
	started := time.Since(start)
	// The CNI-less node runs knext's containerd, the only one that records a sandbox's setup.
	figures := churnFigures{calls: calls, failed: failed, setupOnRecord: n.bridge != nil}
	n.audit(t, ctx, pods, &figures)
	n.removeAll(t, ctx)
	figures.left = n.leftovers(t, ctx)
	t.Logf("started in %s, audited and removed in %s", started.Round(time.Millisecond), (time.Since(start) - started).Round(time.Millisecond))
	return figures
}

// wantNoneLeft fails the test for everything the churn left.
func wantNoneLeft(t *testing.T, left map[string]int) {
	t.Helper()
	for _, kind := range slices.Sorted(maps.Keys(left)) {
		if left[kind] != 0 {
			t.Errorf("after every sandbox was removed: %d %s left", left[kind], kind)
		}
	}
}

// Pods started under churn on knext CNI-less, with nri-bridge SIGKILLed and containerd restarted
// twice in the middle (SIGTERM, then SIGKILL), and the same on upstream containerd with CNI for
// comparison.
func TestChurnWithRestarts(t *testing.T) {
	t.Parallel()
	t.Run("knext CNI-less", func(t *testing.T) {
		t.Parallel()
		bridge := startCNILessNode(t, func(h *stack.Stack) []string { return []string{"-ipv4-subnet", ipv4Subnet(h)} })
		bridge.startBridge(t)
		figures := (&churnNode{h: bridge.h, bridge: bridge}).churn(t)
		figure(t, "knext CNI-less (nri-bridge SIGKILLed; containerd SIGTERMed, then SIGKILLed): %s", figures)
		if figures.readyWithoutIP != 0 || figures.duplicateIPs != 0 || figures.podsWithoutReadyIP != 0 ||
			figures.readyOrphans != figures.setUp {
			t.Errorf("want no READY sandbox without IP, no duplicate IP, every pod's sandbox READY with its IP, and no READY sandbox " +
				"whose RunPodSandbox never returned unless containerd recorded it as set up completely")
		}
		wantNoneLeft(t, figures.left)
	})
	t.Run("upstream CNI", func(t *testing.T) {
		t.Parallel()
		h, _ := startHarness(t, stack.Options{Containerd: upstreamContainerd(t)})
		figures := (&churnNode{h: h}).churn(t)
		figure(t, "upstream containerd with CNI (containerd SIGTERMed, then SIGKILLed): %s", figures)
	})
}

// waitRunPodSandbox waits until the plugin got RunPodSandbox for the pod named name, and returns
// the pod's sandbox ID.
func (p *testPlugin) waitRunPodSandbox(t *testing.T, name string) string {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		data, err := os.ReadFile(filepath.Join(p.dir, "events"))
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			t.Fatal(err)
		}
		for line := range strings.SplitSeq(string(data), "\n") {
			if fields := strings.Fields(line); len(fields) == 3 && fields[0] == "RunPodSandbox" && fields[2] == name {
				return fields[1]
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("NRI plugin %s got no RunPodSandbox for pod %s in a minute", p.nriName(), name)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// heldPod is the pod whose RunPodSandbox the cut-short tests hold and cut short.
const heldPod = "held"

// cutShort cuts RunPodSandbox of the pod heldPod short: with the file hold in place, it starts
// RunPodSandbox, waits until held returns the pod's sandbox ID (the hold was reached), stops
// containerd with signal (SIGKILL or SIGTERM), removes hold and starts containerd again. It checks
// that the sandbox, if listed, is not READY, reports no IP and is not recorded as set up
// completely, runs afterRestart, and removes the sandbox checking that nothing of it is left;
// then the pod's name is used again, and nothing is left of either pod. After a SIGKILL the
// sandbox must be listed; a SIGTERM may let containerd finish the rollback of the failed
// RunPodSandbox.
func (n *cniLessNode) cutShort(t *testing.T, signal, hold string, held func() string, afterRestart func(id string)) {
	t.Helper()
	if err := os.WriteFile(hold, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	config := n.h.PodConfig(heldPod)
	run := make(chan error, 1)
	go func() {
		_, err := n.h.Runtime.RunPodSandbox(n.ctx, &criruntime.RunPodSandboxRequest{Config: config})
		run <- err
	}()
	id := held()

	stop := n.h.Kill
	if signal == "SIGTERM" {
		stop = n.h.Stop
	}
	if err := stop(); err != nil {
		t.Fatalf("%s containerd: %v", signal, err)
	}
	if err := os.Remove(hold); err != nil {
		t.Fatal(err)
	}
	if err := <-run; err == nil {
		t.Fatalf("RunPodSandbox of sandbox %s succeeded although containerd stopped during it", id)
	} else {
		t.Logf("RunPodSandbox of sandbox %s: %v", id, err)
	}
	if err := n.h.Start(n.ctx); err != nil {
		t.Fatal(err)
	}
	n.waitNetworkReady(t, true)

	pods, err := n.h.Runtime.ListPodSandbox(n.ctx, &criruntime.ListPodSandboxRequest{})
	if err != nil {
		t.Fatal(err)
	}
	listed := slices.ContainsFunc(pods.Items, func(p *criruntime.PodSandbox) bool { return p.Id == id })
	if listed {
		for _, p := range pods.Items {
			if p.Id == id && p.State != criruntime.PodSandboxState_SANDBOX_NOTREADY {
				t.Errorf("ListPodSandbox: sandbox %s is %s after the restart, want NOTREADY", id, p.State)
			}
		}
		status := podStatus(t, n.ctx, n.h, id)
		if status.State != criruntime.PodSandboxState_SANDBOX_NOTREADY || len(statusIPs(status)) != 0 {
			t.Errorf("sandbox %s is %s with IPs %v after the restart, want NOTREADY without IP", id, status.State, statusIPs(status))
		}
		if complete, err := setupComplete(n.ctx, n.h, id); err != nil {
			t.Error(err)
		} else if complete {
			t.Errorf("the record of sandbox %s says it was set up completely, although its RunPodSandbox was cut short", id)
		}
	} else if signal == "SIGKILL" {
		t.Errorf("sandbox %s is not listed after a SIGKILL cut its RunPodSandbox short", id)
	}
	t.Logf("after %s: sandbox %s listed %v", signal, id, listed)
	afterRestart(id)
	n.removeCutShort(t, id, listed)
	n.reuseNameAndCheckNothingLeft(t, config)
}

// setupComplete tells whether the record of sandbox id says that its RunPodSandbox set it up
// completely: the extension "setup" of `ctr sandboxes info`, base64-encoded JSON. A record
// without it says nothing (false), although containerd recovers such a sandbox as set up.
func setupComplete(ctx context.Context, h *stack.Stack, id string) (bool, error) {
	out, err := h.Ctr(ctx, "sandboxes", "info", id)
	if err != nil {
		return false, err
	}
	var record struct {
		Extensions map[string]struct {
			Value []byte `json:"value"`
		}
	}
	if err := json.Unmarshal(out, &record); err != nil {
		return false, fmt.Errorf("ctr sandboxes info %s: %w: %s", id, err, out)
	}
	var setup struct {
		Complete bool `json:"complete"`
	}
	if extension, ok := record.Extensions["setup"]; ok {
		if err := json.Unmarshal(extension.Value, &setup); err != nil {
			return false, fmt.Errorf("the setup extension of sandbox %s: %w: %q", id, err, extension.Value)
		}
	}
	return setup.Complete, nil
}

// wantShimGone checks that the shim of sandbox id does not run.
func wantShimGone(t *testing.T, h *stack.Stack, id, when string) {
	t.Helper()
	shims, err := h.Shims()
	if err != nil {
		t.Fatal(err)
	}
	if slices.Contains(shims, id) {
		t.Errorf("the shim of sandbox %s runs %s", id, when)
	}
}

// removeCutShort stops and removes the sandbox id whose RunPodSandbox was cut short, if it is
// listed, and checks that nothing of it is left: shim, network namespace, veth, sandbox or
// container record.
func (n *cniLessNode) removeCutShort(t *testing.T, id string, listed bool) {
	t.Helper()
	if listed {
		if err := n.h.RemovePod(n.ctx, id); err != nil {
			t.Fatalf("remove sandbox %s: %v", id, err)
		}
	}
	wantShimGone(t, n.h, id, "after its removal")

	if netns := netnsCount(t, n.h); netns != 0 {
		t.Errorf("%d network namespaces left", netns)
	}
	if ports, err := n.h.BridgePorts(); err == nil && len(ports) != 0 {
		t.Errorf("veths %v left on bridge %s", ports, n.h.Bridge)
	}
	for _, args := range [][]string{{"sandboxes", "ls"}, {"containers", "ls", "-q"}} {
		out, err := n.h.Ctr(n.ctx, args...)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(out), id) {
			t.Errorf("ctr %s lists sandbox %s after its removal", strings.Join(args, " "), id)
		}
	}
	if lines := logLines(t, n.h.LogPath, "failed to unmarshal sandbox spec"); len(lines) != 0 {
		t.Errorf("containerd logged %q", lines)
	}
}

// reuseNameAndCheckNothingLeft starts a pod with the name (and attempt) of the one whose
// RunPodSandbox was cut short, checks that it is READY with an IP and recorded as set up
// completely, removes it, and checks that nri-bridge holds no allocation and no shim or pod
// process is left.
func (n *cniLessNode) reuseNameAndCheckNothingLeft(t *testing.T, config *criruntime.PodSandboxConfig) {
	t.Helper()
	id := runPod(t, n.ctx, n.h, config)
	if status := podStatus(t, n.ctx, n.h, id); status.State != criruntime.PodSandboxState_SANDBOX_READY || len(statusIPs(status)) == 0 {
		t.Errorf("pod %s started again as %s: %s with IPs %v, want READY with an IP", config.Metadata.Name, id, status.State, statusIPs(status))
	}
	if complete, err := setupComplete(n.ctx, n.h, id); err != nil {
		t.Error(err)
	} else if !complete {
		t.Errorf("the record of sandbox %s (pod %s) does not say it was set up completely", id, config.Metadata.Name)
	}
	if err := n.h.RemovePod(n.ctx, id); err != nil {
		t.Fatal(err)
	}
	if left := n.allocationsLeft(t, n.ctx); len(left) != 0 {
		t.Errorf("nri-bridge holds allocations after every pod was removed: %q", left)
	}
	if shims, err := n.h.Shims(); err != nil || len(shims) != 0 {
		t.Errorf("shims left: %v (%v)", shims, err)
	}
	if processes, err := n.h.PodProcesses(); err != nil || len(processes) != 0 {
		t.Errorf("pod processes left: %v (%v)", processes, err)
	}
}

// containerd stops (SIGKILL, SIGTERM) while an NRI plugin holds RunPodSandbox: nri-bridge, invoked
// before it, has wired the pod. After the restart the sandbox is not READY and reports no IP,
// its shim is gone, and stopping and removing it release what nri-bridge set up; the pod's
// name can be used again.
func TestRunPodSandboxCutShortInNRIHook(t *testing.T) {
	t.Parallel()
	for _, signal := range []string{"SIGKILL", "SIGTERM"} {
		t.Run(signal, func(t *testing.T) {
			t.Parallel()
			// A long plugin_request_timeout: the hold ends by the restart, not by a timeout.
			n := startCNILessNodeWith(t, stack.Options{ExtraConfig: cniLessBridge, NRIRequestTimeout: time.Minute},
				func(h *stack.Stack) []string { return []string{"-ipv4-subnet", ipv4Subnet(h)} })
			n.startBridge(t)
			holder := startTestPlugin(t, n.ctx, n.h, "20", "holder")
			n.cutShort(t, signal, filepath.Join(holder.dir, "hold-run."+heldPod), func() string {
				id := holder.waitRunPodSandbox(t, heldPod)
				if ports := bridgePorts(t, n.h); ports != 1 {
					t.Fatalf("nri-bridge wired %d pods before the holding plugin got RunPodSandbox, want 1", ports)
				}
				return id
			}, func(id string) {
				// Its task (the pause process) is deleted at once, and the shim with it.
				wantShimGone(t, n.h, id, "after the restart")
				t.Logf("NRI plugin %s got %v for sandbox %s", holder.nriName(), holder.podEvents(t, id), id)
			})
		})
	}
}

// heldShimStart returns a directory with containerd and a containerd-shim-runc-v2 that runs the
// real ones of the harness's binaries, except that the shim's start command, once it started the
// shim server, waits while the file hold exists; it writes its arguments to hold+".reached"
// when it begins to wait.
func heldShimStart(t *testing.T, hold string) string {
	t.Helper()
	binDir := os.Getenv("KNEXT_BIN_DIR")
	if binDir == "" {
		t.Fatal("KNEXT_BIN_DIR is not set: run the tests through make")
	}
	dir := t.TempDir()
	if err := os.Symlink(filepath.Join(binDir, "containerd"), filepath.Join(dir, "containerd")); err != nil {
		t.Fatal(err)
	}
	script := fmt.Sprintf(`#!/bin/sh
real=%q hold=%q
case " $* " in *" start "*) ;; *) exec "$real" "$@" ;; esac
out=$(mktemp)
"$real" "$@" >"$out"
status=$?
echo "$@" >"$hold.reaching" && mv "$hold.reaching" "$hold.reached"
while [ -e "$hold" ]; do sleep 0.02; done
cat "$out"
rm -f "$out"
exit $status
`, filepath.Join(binDir, "containerd-shim-runc-v2"), hold)
	if err := os.WriteFile(filepath.Join(dir, "containerd-shim-runc-v2"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// waitHeldShimStart waits until the held shim start command waits, and returns the ID it was
// started for.
func waitHeldShimStart(t *testing.T, hold string) string {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		if data, err := os.ReadFile(hold + ".reached"); err == nil {
			args := strings.Fields(string(data))
			if i := slices.Index(args, "-id"); i >= 0 && i+1 < len(args) {
				return args[i+1]
			}
			t.Fatalf("the shim's start command got no -id: %q", data)
		}
		if time.Now().After(deadline) {
			t.Fatal("no shim start command waited in a minute")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// containerd stops (SIGKILL, SIGTERM) while the shim's start command of a new sandbox returns:
// the shim server runs, but containerd never recorded its address. After the restart the
// sandbox is not READY, its shim server is gone, and stopping and removing it leave nothing; the
// pod's name can be used again.
func TestRunPodSandboxCutShortInShimStart(t *testing.T) {
	t.Parallel()
	for _, signal := range []string{"SIGKILL", "SIGTERM"} {
		t.Run(signal, func(t *testing.T) {
			t.Parallel()
			hold := filepath.Join(t.TempDir(), "hold")
			n := startCNILessNodeWith(t, stack.Options{ExtraConfig: cniLessBridge, Containerd: filepath.Join(heldShimStart(t, hold), "containerd")},
				func(h *stack.Stack) []string { return []string{"-ipv4-subnet", ipv4Subnet(h)} })
			n.startBridge(t)
			n.cutShort(t, signal, hold, func() string {
				id := waitHeldShimStart(t, hold)
				if shims, err := n.h.Shims(); err != nil || !slices.Contains(shims, id) {
					t.Fatalf("the shim server of sandbox %s does not run while its start command waits: shims %v (%v)", id, shims, err)
				}
				return id
			}, func(string) {})
		})
	}
}
