package integration

// The kubelet end-to-end suite (`make test` runs it as its own suite, kubelet-e2e): a real kubelet
// in standalone mode (package kubelet) runs static pods on knext. Every scenario checks that no
// app pod's sandbox is created more than once and that no app pod's IPs change, and records the
// figures the suite reports: time from manifest to Running with IP, CRI PodSandboxStatus calls
// per pod start, sandbox re-creations.

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	criruntime "k8s.io/cri-api/pkg/apis/runtime/v1"

	nribridge "github.com/knext-dev/knext/deploy/nri-bridge"
	"github.com/knext-dev/knext/internal/ociimage"
	"github.com/knext-dev/knext/internal/stack"
	"github.com/knext-dev/knext/test/kubelet"
)

// kubeletTestTimeout bounds one kubelet scenario; the suite's go test -timeout is larger.
const kubeletTestTimeout = 10 * time.Minute

// Labels the kubelet puts on the sandboxes and containers it creates.
const (
	podUIDLabel        = "io.kubernetes.pod.uid"
	containerNameLabel = "io.kubernetes.container.name"
)

// appContainer is the container of every app pod.
const appContainer = "app"

// kubeletNode is a knext containerd with a standalone kubelet on it.
type kubeletNode struct {
	h   *stack.Stack
	ctx context.Context
	k   *kubelet.Kubelet
}

// startKubeletNode starts a harness with opts and a kubelet on it; the kubelet is stopped before
// the harness is closed.
func startKubeletNode(t *testing.T, opts stack.Options) *kubeletNode {
	t.Helper()
	// containerd logs the CRI PodSandboxStatus requests it serves at trace level only.
	opts.LogLevel = "trace"
	h, _ := startHarness(t, opts)
	ctx, cancel := context.WithTimeout(context.Background(), kubeletTestTimeout)
	t.Cleanup(cancel)
	k, err := kubelet.New(ctx, h, kubelet.Options{Logf: t.Logf})
	if err != nil {
		t.Fatalf("start kubelet: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Log(k.LogTail(80))
		}
		// Before the harness removes the pods: a running kubelet would start them again.
		if err := k.Stop(); err != nil {
			t.Errorf("stop kubelet: %v", err)
		}
	})
	return &kubeletNode{h: h, ctx: ctx, k: k}
}

// appPod is the manifest of a pod with one sleeping busybox container.
func appPod(name string, annotations map[string]string) *corev1.Pod {
	grace := int64(1)
	return &corev1.Pod{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: stack.PodNamespace, Annotations: annotations},
		Spec: corev1.PodSpec{
			TerminationGracePeriodSeconds: &grace,
			Containers: []corev1.Container{{
				Name: appContainer, Image: ociimage.BusyboxImage, ImagePullPolicy: corev1.PullNever,
				Command: []string{"sleep", "3600"},
			}},
		},
	}
}

// addStaticPods writes the manifests and returns when each was written.
func (n *kubeletNode) addStaticPods(t *testing.T, pods ...*corev1.Pod) map[string]time.Time {
	t.Helper()
	written := map[string]time.Time{}
	for _, pod := range pods {
		if err := n.k.AddStaticPod(pod); err != nil {
			t.Fatal(err)
		}
		written[pod.Name] = time.Now()
	}
	return written
}

// kubeletPods returns the kubelet's pods by manifest name.
func (n *kubeletNode) kubeletPods(t *testing.T) map[string]*corev1.Pod {
	t.Helper()
	pods, err := n.k.Pods(n.ctx)
	if err != nil {
		t.Fatalf("kubelet pods: %v", err)
	}
	return n.byManifest(pods)
}

func (n *kubeletNode) byManifest(pods []corev1.Pod) map[string]*corev1.Pod {
	byName := map[string]*corev1.Pod{}
	for i := range pods {
		if name, ok := strings.CutSuffix(pods[i].Name, "-"+n.k.NodeName); ok {
			byName[name] = &pods[i]
		}
	}
	return byName
}

// podIPs returns the IPs the kubelet reports for pod.
func podIPs(pod *corev1.Pod) []string {
	var ips []string
	for _, ip := range pod.Status.PodIPs {
		ips = append(ips, ip.IP)
	}
	return ips
}

// running tells whether the kubelet reports pod Running with every container running and, unless
// it uses the host's network, an IP.
func running(pod *corev1.Pod) bool {
	if pod == nil || pod.Status.Phase != corev1.PodRunning || (pod.Status.PodIP == "" && !pod.Spec.HostNetwork) ||
		len(pod.Status.ContainerStatuses) != len(pod.Spec.Containers) {
		return false
	}
	for _, c := range pod.Status.ContainerStatuses {
		if c.State.Running == nil {
			return false
		}
	}
	return true
}

// waitKubelet polls the kubelet's pods until done accepts them, and returns them. A kubelet that
// does not answer (restarting) is polled again.
func (n *kubeletNode) waitKubelet(t *testing.T, timeout time.Duration, what string, done func(map[string]*corev1.Pod) bool) map[string]*corev1.Pod {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var pods map[string]*corev1.Pod
	for {
		list, err := n.k.Pods(n.ctx)
		if err == nil {
			pods = n.byManifest(list)
			if done(pods) {
				return pods
			}
		}
		if time.Now().After(deadline) || n.ctx.Err() != nil {
			t.Fatalf("after %s, still not %s (last error %v); the kubelet reports:\n%s", timeout, what, err, describePods(pods))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// waitRunning waits until the kubelet reports every named pod running (see running), and returns
// the pods and when each was first seen running.
func (n *kubeletNode) waitRunning(t *testing.T, names ...string) (map[string]*corev1.Pod, map[string]time.Time) {
	t.Helper()
	seen := map[string]time.Time{}
	pods := n.waitKubelet(t, 3*time.Minute, fmt.Sprintf("running with IPs: %v", names), func(pods map[string]*corev1.Pod) bool {
		for _, name := range names {
			if _, ok := seen[name]; !ok && running(pods[name]) {
				seen[name] = time.Now()
			}
		}
		return len(seen) == len(names)
	})
	return pods, seen
}

func describePods(pods map[string]*corev1.Pod) string {
	var b strings.Builder
	for _, name := range slices.Sorted(maps.Keys(pods)) {
		pod := pods[name]
		fmt.Fprintf(&b, "  %s (uid %s): phase %q, IPs %v", name, pod.UID, pod.Status.Phase, podIPs(pod))
		for _, c := range pod.Status.ContainerStatuses {
			fmt.Fprintf(&b, "; container %s restarts %d state %+v", c.Name, c.RestartCount, c.State)
		}
		b.WriteString("\n")
	}
	return b.String()
}

// sandboxes returns every sandbox containerd has of the pod with UID uid, ready or not.
func (n *kubeletNode) sandboxes(t *testing.T, uid string) []*criruntime.PodSandbox {
	t.Helper()
	resp, err := n.h.Runtime.ListPodSandbox(n.ctx, &criruntime.ListPodSandboxRequest{
		Filter: &criruntime.PodSandboxFilter{LabelSelector: map[string]string{podUIDLabel: uid}}})
	if err != nil {
		t.Fatal(err)
	}
	return resp.Items
}

// sandboxOf returns the one sandbox of pod, failing the test if it has none or several.
func (n *kubeletNode) sandboxOf(t *testing.T, pod *corev1.Pod) *criruntime.PodSandbox {
	t.Helper()
	sandboxes := n.sandboxes(t, string(pod.UID))
	if len(sandboxes) != 1 {
		t.Fatalf("pod %s has %d sandboxes, want 1: %v", pod.Name, len(sandboxes), sandboxes)
	}
	return sandboxes[0]
}

// runningContainer returns the ID of the running container name of the pod with UID uid.
func (n *kubeletNode) runningContainer(t *testing.T, uid, name string) string {
	t.Helper()
	resp, err := n.h.Runtime.ListContainers(n.ctx, &criruntime.ListContainersRequest{Filter: &criruntime.ContainerFilter{
		State:         &criruntime.ContainerStateValue{State: criruntime.ContainerState_CONTAINER_RUNNING},
		LabelSelector: map[string]string{podUIDLabel: uid, containerNameLabel: name},
	}})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Containers) != 1 {
		t.Fatalf("pod %s has %d running containers %s, want 1", uid, len(resp.Containers), name)
	}
	return resp.Containers[0].Id
}

// crash SIGKILLs the main process of container id, as a crash would.
func (n *kubeletNode) crash(t *testing.T, id string) {
	t.Helper()
	resp, err := n.h.Runtime.ContainerStatus(n.ctx, &criruntime.ContainerStatusRequest{ContainerId: id, Verbose: true})
	if err != nil {
		t.Fatal(err)
	}
	var info struct {
		Pid int `json:"pid"`
	}
	if err := json.Unmarshal([]byte(resp.Info["info"]), &info); err != nil || info.Pid <= 0 {
		t.Fatalf("container %s: no pid in its verbose status (%v): %s", id, err, resp.Info["info"])
	}
	if err := syscall.Kill(info.Pid, syscall.SIGKILL); err != nil {
		t.Fatalf("kill container %s (pid %d): %v", id, info.Pid, err)
	}
}

// containerdLog returns containerd's log, all runs of this harness.
func (n *kubeletNode) containerdLog(t *testing.T) []string {
	t.Helper()
	data, err := os.ReadFile(n.h.LogPath)
	if err != nil {
		t.Fatal(err)
	}
	return strings.Split(string(data), "\n")
}

// runPodSandboxes counts the RunPodSandbox requests containerd served for the pod with UID uid,
// and how many of them created a sandbox (its log names the pod's metadata, UID included).
func (n *kubeletNode) runPodSandboxes(t *testing.T, uid string) (requested, created int) {
	t.Helper()
	for _, line := range n.containerdLog(t) {
		if !strings.Contains(line, "RunPodSandbox for ") || !strings.Contains(line, uid) {
			continue
		}
		switch {
		case strings.Contains(line, "returns sandbox id"):
			created++
		case !strings.Contains(line, "failed"):
			requested++
		}
	}
	return requested, created
}

// statusCalls counts the CRI PodSandboxStatus requests containerd served for sandbox id, from any
// client (trace level: `PodSandboxStatus for "<id>"`).
func (n *kubeletNode) statusCalls(t *testing.T, id string) int {
	t.Helper()
	request := `msg="PodSandboxStatus for \"` + id + `\""`
	calls := 0
	for _, line := range n.containerdLog(t) {
		if strings.Contains(line, request) {
			calls++
		}
	}
	return calls
}

// kubeletLogCount counts the kubelet's log lines that contain every one of parts.
func (n *kubeletNode) kubeletLogCount(t *testing.T, parts ...string) int {
	t.Helper()
	data, err := os.ReadFile(n.k.LogPath)
	if err != nil {
		t.Fatal(err)
	}
	count := 0
	for line := range strings.SplitSeq(string(data), "\n") {
		if !slices.ContainsFunc(parts, func(p string) bool { return !strings.Contains(line, p) }) {
			count++
		}
	}
	return count
}

// figure records one of the suite's figures in the test log and, when $KNEXT_TEST_FIGURES names a
// file (script/ci/test.sh sets it and prints the file), in that file.
func figure(t *testing.T, format string, args ...any) {
	t.Helper()
	line := fmt.Sprintf(format, args...)
	t.Log("figure: " + line)
	path := os.Getenv("KNEXT_TEST_FIGURES")
	if path == "" {
		return
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Errorf("figures file: %v", err)
		return
	}
	defer f.Close()
	if _, err := fmt.Fprintf(f, "%s: %s\n", t.Name(), line); err != nil {
		t.Errorf("figures file: %v", err)
	}
}

// startedPod is an app pod as it first ran: the sandbox and IPs every later check compares with.
type startedPod struct {
	name    string
	uid     string
	sandbox string
	ips     []string
}

// recordStarts returns the started pods, and records for each the time from its manifest to
// Running with IP and the PodSandboxStatus calls its sandbox had by then. Call it before the test
// itself asks for the pods' status.
func (n *kubeletNode) recordStarts(t *testing.T, written map[string]time.Time, pods map[string]*corev1.Pod, seen map[string]time.Time) map[string]startedPod {
	t.Helper()
	started := map[string]startedPod{}
	for name, at := range written {
		pod := pods[name]
		sandbox := n.sandboxOf(t, pod)
		started[name] = startedPod{name: name, uid: string(pod.UID), sandbox: sandbox.Id, ips: podIPs(pod)}
		figure(t, "pod %s: manifest to Running with IPs %v in %s, %d PodSandboxStatus calls for its sandbox by then",
			name, podIPs(pod), seen[name].Sub(at).Round(time.Millisecond), n.statusCalls(t, sandbox.Id))
	}
	return started
}

// restartKubelet restarts the kubelet, waits until it reports the pods running again, and records
// how long that took and how many PodSandboxStatus calls each sandbox got meanwhile.
func (n *kubeletNode) restartKubelet(t *testing.T, pods map[string]startedPod) {
	t.Helper()
	before := map[string]int{}
	for name, pod := range pods {
		before[name] = n.statusCalls(t, pod.sandbox)
	}
	start := time.Now()
	if err := n.k.Restart(n.ctx); err != nil {
		t.Fatal(err)
	}
	n.waitRunning(t, slices.Collect(maps.Keys(pods))...)
	for name, pod := range pods {
		figure(t, "kubelet restart: pod %s running again after %s, %d PodSandboxStatus calls for its sandbox",
			name, time.Since(start).Round(time.Millisecond), n.statusCalls(t, pod.sandbox)-before[name])
	}
}

// wantUnchanged checks that the kubelet reports pod with the IPs it started with, that containerd
// has its one first sandbox, created once, and records the re-creations.
func (n *kubeletNode) wantUnchanged(t *testing.T, pods map[string]*corev1.Pod, started map[string]startedPod) {
	t.Helper()
	recreations := 0
	for name, first := range started {
		if pods[name] == nil {
			t.Errorf("the kubelet no longer reports pod %s", name)
			continue
		}
		if got := podIPs(pods[name]); !slices.Equal(got, first.ips) {
			t.Errorf("the kubelet reports pod %s with IPs %v, it started with %v", name, got, first.ips)
		}
		if uid := string(pods[name].UID); uid != first.uid {
			t.Errorf("pod %s has UID %s, it started as %s", name, uid, first.uid)
		}
		var ids []string
		for _, s := range n.sandboxes(t, first.uid) {
			ids = append(ids, s.Id)
		}
		if !slices.Equal(ids, []string{first.sandbox}) {
			t.Errorf("pod %s has sandboxes %v, it started with %s only", name, ids, first.sandbox)
		}
		requested, created := n.runPodSandboxes(t, first.uid)
		if created != 1 {
			t.Errorf("pod %s: containerd created %d sandboxes for it (%d RunPodSandbox requests), want 1", name, created, requested)
		}
		recreations += max(created-1, 0)
	}
	figure(t, "sandbox re-creations of %d app pods: %d", len(started), recreations)
}

// kubeletPick is what the kubelet keeps of a pod's CRI IPs (primary first) on an IPv4 node: the
// first IPv4 address, then the first IPv6 address (sortPodIPs in pkg/kubelet).
func kubeletPick(ips []string) []string {
	var picked []string
	for _, is4 := range []bool{true, false} {
		for _, ip := range ips {
			if addr, err := netip.ParseAddr(ip); err == nil && addr.Unmap().Is4() == is4 {
				picked = append(picked, ip)
				break
			}
		}
	}
	return picked
}

// wantKubeletIPsFrom checks that the kubelet's IPs of pod are its pick of what CRI reports, and
// that each of them comes from NRI plugin source (e.g. "nri:10-bridge") as nriState tells ("live",
// or nriAtRunPodSandbox).
func (n *kubeletNode) wantKubeletIPsFrom(t *testing.T, pod startedPod, source, nriState string) []string {
	t.Helper()
	status, network := verbosePodStatus(t, n.ctx, n.h, pod.sandbox)
	criIPs := statusIPs(status)
	if picked := kubeletPick(criIPs); !slices.Equal(pod.ips, picked) {
		t.Errorf("pod %s: the kubelet reports IPs %v, CRI reports %v, of which the kubelet keeps %v", pod.name, pod.ips, criIPs, picked)
	}
	for _, ip := range pod.ips {
		i := slices.IndexFunc(network.IPs, func(r reportedIP) bool { return r.IP == ip })
		if i < 0 || network.IPs[i].Source != source || network.IPs[i].NRI != nriState {
			t.Errorf("pod %s: IP %s has provenance %+v, want it %s from %s", pod.name, ip, network.IPs, nriState, source)
		}
	}
	return criIPs
}

// hasStatus tells whether the kubelet has generated a status for pod. Until it has (after its
// start, until its first sync of the pod), it shows a static pod with the placeholder status its
// file source gives every manifest: phase Pending, no IPs, no conditions. A generated status always
// has conditions, and is what the kubelet would report to an API server.
func hasStatus(pod *corev1.Pod) bool {
	return pod != nil && len(pod.Status.Conditions) > 0
}

// ipWatch polls the kubelet's pods and records every status of a watched pod whose IPs differ
// from the ones it started with. A kubelet that does not answer (restarting) is polled again.
type ipWatch struct {
	changes []string
	polls   int
	mu      sync.Mutex
	stop    chan struct{}
	done    chan struct{}
}

func (n *kubeletNode) watchIPs(pods map[string]startedPod) *ipWatch {
	w := &ipWatch{stop: make(chan struct{}), done: make(chan struct{})}
	start := time.Now()
	go func() {
		defer close(w.done)
		for {
			select {
			case <-w.stop:
				return
			case <-time.After(200 * time.Millisecond):
			}
			list, err := n.k.Pods(n.ctx)
			if err != nil {
				continue
			}
			reported := n.byManifest(list)
			w.mu.Lock()
			w.polls++
			for name, first := range pods {
				pod := reported[name]
				if !hasStatus(pod) {
					continue
				}
				if got := podIPs(pod); !slices.Equal(got, first.ips) {
					w.changes = append(w.changes, fmt.Sprintf("%s after %s: phase %s, IPs %v instead of %v",
						name, time.Since(start).Round(time.Millisecond), pod.Status.Phase, got, first.ips))
				}
			}
			w.mu.Unlock()
		}
	}()
	return w
}

// check stops the watch and fails the test if a pod's IPs changed meanwhile.
func (w *ipWatch) check(t *testing.T) {
	t.Helper()
	close(w.stop)
	<-w.done
	if len(w.changes) > 0 {
		t.Errorf("the kubelet reported changed pod IPs (%d of %d polls):\n%s", len(w.changes), w.polls, strings.Join(w.changes, "\n"))
	}
	figure(t, "pod IPs polled %d times from the kubelet, %d reports differed from the first", w.polls, len(w.changes))
}

// Scenario 1: CNI sets up the pods, an NRI plugin reports IPs on top. The kubelet shows the
// plugin's IPs, as it picks them from what CRI reports, and a kubelet restart changes nothing.
func TestKubeletCNIModeStatusPlugin(t *testing.T) {
	t.Parallel()
	n := startKubeletNode(t, stack.Options{})
	plugin := startTestPlugin(t, n.ctx, n.h, "10", "status")

	written := n.addStaticPods(t,
		appPod("dual", map[string]string{annotationIP: "198.51.100.10", annotationAdditionalIPs: "2001:db8::10"}),
		appPod("single", map[string]string{annotationIP: "198.51.100.11"}))
	pods, seen := n.waitRunning(t, "dual", "single")
	started := n.recordStarts(t, written, pods, seen)

	for name, want := range map[string][]string{"dual": {"198.51.100.10", "2001:db8::10"}, "single": {"198.51.100.11"}} {
		pod := started[name]
		if !slices.Equal(pod.ips, want) {
			t.Errorf("the kubelet reports pod %s with IPs %v, want the plugin's %v", name, pod.ips, want)
		}
		criIPs := n.wantKubeletIPsFrom(t, pod, "nri:"+plugin.nriName(), "live")
		// CNI's address is still reported, behind the plugin's.
		if !slices.ContainsFunc(criIPs, func(ip string) bool { return n.h.Subnet.Contains(net.ParseIP(ip)) }) {
			t.Errorf("pod %s: CRI reports %v, without its CNI address of %s", name, criIPs, n.h.Subnet)
		}
	}
	watch := n.watchIPs(started)
	n.restartKubelet(t, started)
	watch.check(t)
	n.wantUnchanged(t, n.kubeletPods(t), started)
}

// nriBridgeStaticPod returns deploy/nri-bridge/static-pod.yaml for this node: the image
// `make images` built (imported here), the host paths of this harness (its NRI socket's directory,
// a state and a configuration directory under its root, its netns directory made a shared mount
// for the HostToContainer mount), and a configuration with the harness's bridge name and subnets.
func (n *kubeletNode) nriBridgeStaticPod(t *testing.T) *corev1.Pod {
	t.Helper()
	archive := imageArchive(t, ociimage.NRIBridgeArchive)
	image, err := ociimage.ImageName(archive)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := n.h.Ctr(n.ctx, "images", "import", archive); err != nil {
		t.Fatal(err)
	}

	pod, err := nribridge.StaticPod()
	if err != nil {
		t.Fatal(err)
	}
	container := &pod.Spec.Containers[0]
	container.Image = image
	configDir := filepath.Join(n.h.Root, "nri-bridge-config")
	stateDir := n.h.NRIBridgeStateDir()
	for _, dir := range []string{configDir, stateDir, n.h.NetNSDir} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := kubelet.MakeSharedMount(n.h.NetNSDir); err != nil {
		t.Fatal(err)
	}
	mountPath := map[string]string{}
	for _, m := range container.VolumeMounts {
		mountPath[m.Name] = m.MountPath
	}
	config := fmt.Sprintf("bridge: %s\nstateDir: %s\nipv4:\n  subnet: %s\nipv6:\n  subnet: %s\n",
		n.h.Bridge, mountPath["state"], ipv4Subnet(n.h), ipv6Subnet(n.h))
	if err := os.WriteFile(filepath.Join(configDir, "config.yaml"), []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}
	if filepath.Join(mountPath["nri"], filepath.Base(n.h.NRISocket)) != "/var/run/nri/nri.sock" {
		t.Fatalf("the harness's NRI socket %s is not nri.sock, the manifest's socket name", n.h.NRISocket)
	}
	hostPaths := map[string]string{"nri": filepath.Dir(n.h.NRISocket), "config": configDir, "state": stateDir, "netns": n.h.NetNSDir}
	for i := range pod.Spec.Volumes {
		v := &pod.Spec.Volumes[i]
		path, ok := hostPaths[v.Name]
		if !ok || v.HostPath == nil {
			t.Fatalf("static-pod.yaml: volume %+v is not one of the host paths %v", v, hostPaths)
		}
		v.HostPath.Path = path
	}
	// containerd hands the plugin host paths of network namespaces: they must be the same inside.
	for i := range container.VolumeMounts {
		if container.VolumeMounts[i].Name == "netns" {
			container.VolumeMounts[i].MountPath = n.h.NetNSDir
		}
	}
	return pod
}

// waitNetworkReady waits until CRI's NetworkReady condition is want.
func (n *kubeletNode) waitNetworkReady(t *testing.T, want bool) {
	t.Helper()
	if err := n.h.WaitNetworkReady(n.ctx, want, time.Minute); err != nil {
		t.Fatal(err)
	}
}

// Scenarios 2 and 3: on a CNI-less node, nri-bridge runs as a static pod. App pods wait for it,
// then get its dual-stack IPs, and keep them and their sandboxes through a crash of nri-bridge, a
// containerd restart, a kubelet restart, and a crash of an app container while nri-bridge is away.
func TestKubeletCNILessNRIBridgePod(t *testing.T) {
	t.Parallel()
	binDir, invocations := recordingCNIBinDir(t)
	n := startKubeletNode(t, stack.Options{ExtraConfig: cniLessBridge, SkipNetworkReadyWait: true, CNIBinDir: binDir})
	t.Cleanup(func() {
		if calls := cniInvocations(t, invocations); len(calls) > 0 {
			t.Errorf("CNI plugins ran with disable_cni = true: %v", calls)
		}
	})
	bridgePod := n.nriBridgeStaticPod(t)
	const bridge = "nri-bridge"

	written := n.addStaticPods(t, appPod("a", nil), appPod("b", nil))
	if !t.Run("app pods wait for the network", func(t *testing.T) {
		n.waitKubelet(t, time.Minute, "held back for want of a network", func(pods map[string]*corev1.Pod) bool {
			return hasStatus(pods["a"]) && hasStatus(pods["b"]) &&
				n.kubeletLogCount(t, "network is not ready", "a-"+n.k.NodeName) > 0 &&
				n.kubeletLogCount(t, "network is not ready", "b-"+n.k.NodeName) > 0
		})
		// A few more kubelet syncs (runtime status every 5 s) change nothing.
		time.Sleep(6 * time.Second)
		pods := n.kubeletPods(t)
		for _, name := range []string{"a", "b"} {
			pod := pods[name]
			if !hasStatus(pod) || pod.Status.Phase != corev1.PodPending || len(pod.Status.PodIPs) != 0 {
				t.Errorf("pod %s without a network: phase %q, IPs %v; want Pending without IPs", name, pod.Status.Phase, podIPs(pod))
			}
			if requested, _ := n.runPodSandboxes(t, string(pod.UID)); requested != 0 {
				t.Errorf("pod %s: the kubelet asked for %d sandboxes before the network was ready", name, requested)
			}
		}
		if cond := networkCondition(t, n.ctx, n.h); cond.Status {
			t.Error("NetworkReady is true before nri-bridge runs")
		}
	}) {
		t.FailNow()
	}

	var started map[string]startedPod
	if !t.Run("nri-bridge static pod provides the network", func(t *testing.T) {
		bridgeWritten := n.addStaticPods(t, bridgePod)[bridge]
		_, bridgeSeen := n.waitRunning(t, bridge)
		n.waitNetworkReady(t, true)
		networkReady := time.Now()
		pods, seen := n.waitRunning(t, "a", "b")
		started = n.recordStarts(t, written, pods, seen)
		figure(t, "nri-bridge manifest to its pod running: %s, to NetworkReady: %s, to app pods a and b running with IPs: %s and %s",
			bridgeSeen[bridge].Sub(bridgeWritten).Round(time.Millisecond), networkReady.Sub(bridgeWritten).Round(time.Millisecond),
			seen["a"].Sub(bridgeWritten).Round(time.Millisecond), seen["b"].Sub(bridgeWritten).Round(time.Millisecond))

		for _, name := range []string{"a", "b"} {
			pod := started[name]
			if len(pod.ips) != 2 {
				t.Fatalf("the kubelet reports pod %s with IPs %v, want an IPv4 and an IPv6 address", name, pod.ips)
			}
			inSubnet(t, pod.ips[0], ipv4Subnet(n.h))
			inSubnet(t, pod.ips[1], ipv6Subnet(n.h))
			if criIPs := n.wantKubeletIPsFrom(t, pod, "nri:"+nriBridgeName, nriAtRunPodSandbox); !slices.Equal(criIPs, pod.ips) {
				t.Errorf("pod %s: CRI reports %v, the kubelet %v", name, criIPs, pod.ips)
			}
			container := n.runningContainer(t, pod.uid, appContainer)
			if got := netnsAddrs(t, n.ctx, n.h, container, "eth0"); !slices.Equal(sortedCopy(got), sortedCopy(pod.ips)) {
				t.Errorf("pod %s: eth0 has %v, the kubelet reports %v", name, got, pod.ips)
			}
		}
		a, b := n.runningContainer(t, started["a"].uid, appContainer), started["b"]
		for _, ip := range b.ips {
			execIn(t, n.ctx, n.h, a, "ping", "-c", "1", "-W", "5", ip)
		}
	}) {
		t.FailNow()
	}

	watch := n.watchIPs(started)
	bridgeAdded := 1
	t.Run("nri-bridge crashes and the kubelet restarts it", func(t *testing.T) {
		pod := n.kubeletPods(t)[bridge]
		n.crash(t, n.runningContainer(t, string(pod.UID), bridge))
		n.waitKubelet(t, time.Minute, "restarting nri-bridge", func(pods map[string]*corev1.Pod) bool {
			return running(pods[bridge]) && pods[bridge].Status.ContainerStatuses[0].RestartCount == 1
		})
		n.waitNetworkReady(t, true)
		if _, created := n.runPodSandboxes(t, string(pod.UID)); created != 1 {
			t.Errorf("nri-bridge's pod got %d sandboxes, want 1: the kubelet restarts its container only", created)
		}
	})
	t.Run("containerd restarts", func(t *testing.T) {
		if err := n.h.Restart(n.ctx); err != nil {
			t.Fatal(err)
		}
		n.waitNetworkReady(t, true)
		n.waitRunning(t, "a", "b", bridge)
		for _, pod := range started {
			status, _ := verbosePodStatus(t, n.ctx, n.h, pod.sandbox)
			if got := statusIPs(status); !slices.Equal(got, pod.ips) {
				t.Errorf("pod %s after the containerd restart: CRI reports %v, before %v", pod.name, got, pod.ips)
			}
		}
	})
	t.Run("kubelet restarts", func(t *testing.T) {
		n.restartKubelet(t, started)
	})
	t.Run("app containers crash while nri-bridge is away", func(t *testing.T) {
		notReady := n.kubeletLogCount(t, "Container runtime network not ready")
		if err := n.k.RemoveStaticPod(bridge); err != nil {
			t.Fatal(err)
		}
		n.waitNetworkReady(t, false)
		// a crashes at once, when the kubelet may not know yet that the network is gone; b once
		// the kubelet knows (it checks the runtime's status every 5 s).
		n.crash(t, n.runningContainer(t, started["a"].uid, appContainer))
		n.waitKubelet(t, time.Minute, "noticing that the network is not ready", func(map[string]*corev1.Pod) bool {
			return n.kubeletLogCount(t, "Container runtime network not ready") > notReady
		})
		n.crash(t, n.runningContainer(t, started["b"].uid, appContainer))
		crashed := time.Now()
		n.waitKubelet(t, time.Minute, "seeing pod b's container exit", func(pods map[string]*corev1.Pod) bool {
			c := pods["b"].Status.ContainerStatuses
			return len(c) == 1 && (c[0].State.Terminated != nil || c[0].RestartCount > 0)
		})
		time.Sleep(5 * time.Second)
		pods := n.kubeletPods(t)
		figure(t, "while nri-bridge is away: app container restarts of a (crashed at once) %d, of b (crashed once the kubelet knew, %s ago) %d",
			pods["a"].Status.ContainerStatuses[0].RestartCount, time.Since(crashed).Round(time.Second),
			pods["b"].Status.ContainerStatuses[0].RestartCount)
		for _, name := range []string{"a", "b"} {
			pod := started[name]
			status, network := verbosePodStatus(t, n.ctx, n.h, pod.sandbox)
			var want []reportedIP
			// nri-bridge answered at RunPodSandbox: that answer stands while it is away.
			for _, ip := range pod.ips {
				want = append(want, reportedIP{IP: ip, Source: "nri:" + nriBridgeName, NRI: nriAtRunPodSandbox})
			}
			wantIPs(t, pod.sandbox, status, network, want...)
			if status.GetState() != criruntime.PodSandboxState_SANDBOX_READY {
				t.Errorf("pod %s's sandbox is %s while nri-bridge is away, want READY", name, status.GetState())
			}
		}

		back := time.Now()
		n.addStaticPods(t, bridgePod)
		bridgeAdded++
		n.waitNetworkReady(t, true)
		pods, seen := n.waitRunning(t, "a", "b", bridge)
		for _, name := range []string{"a", "b"} {
			if c := pods[name].Status.ContainerStatuses[0]; c.RestartCount != 1 {
				t.Errorf("pod %s's container restarted %d times, want once", name, c.RestartCount)
			}
		}
		figure(t, "nri-bridge manifest back to pods a and b running again: %s and %s",
			seen["a"].Sub(back).Round(time.Millisecond), seen["b"].Sub(back).Round(time.Millisecond))
	})

	watch.check(t)
	pods := n.kubeletPods(t)
	n.wantUnchanged(t, pods, started)
	_, created := n.runPodSandboxes(t, string(pods[bridge].UID))
	figure(t, "nri-bridge pod: %d sandboxes for %d additions of its manifest", created, bridgeAdded)
	if created != bridgeAdded {
		t.Errorf("nri-bridge's pod got %d sandboxes, its manifest was added %d times", created, bridgeAdded)
	}
}

// Scenario 4: next to nri-bridge, a second NRI plugin subscribed to PodSandboxStatus fails, then
// answers after plugin_request_timeout, then slowly within it. Its last known answers stand in,
// it stays connected, and no app pod is re-created or changes IPs, whatever the kubelet asks.
func TestKubeletSecondStatusPluginFailsOrIsSlow(t *testing.T) {
	t.Parallel()
	n := startKubeletNode(t, stack.Options{ExtraConfig: cniLessBridge, SkipNetworkReadyWait: true})
	const bridge = "nri-bridge"
	n.addStaticPods(t, n.nriBridgeStaticPod(t))
	n.waitRunning(t, bridge)
	n.waitNetworkReady(t, true)
	// Connected after nri-bridge, the network_plugin that alone makes the network ready.
	flaky := startTestPlugin(t, n.ctx, n.h, "60", "flaky")

	written := n.addStaticPods(t, appPod("a", nil), appPod("b", nil))
	pods, seen := n.waitRunning(t, "a", "b")
	started := n.recordStarts(t, written, pods, seen)
	for _, pod := range started {
		// It answered with no IP: it owns none, and that answer is its last known one.
		flaky.waitCalls(t, pod.sandbox, 1)
		n.wantKubeletIPsFrom(t, pod, "nri:"+nriBridgeName, nriAtRunPodSandbox)
	}
	watch := n.watchIPs(started)
	// Each case starts with the plugin connected, even if the previous one lost it.
	connected := func(t *testing.T) {
		t.Helper()
		if exited, _ := flaky.process.Exited(); exited {
			flaky.start(t, n.ctx)
		}
	}
	stillConnected := func(t *testing.T, callsBefore int) {
		t.Helper()
		if exited, err := flaky.process.Exited(); exited {
			t.Errorf("NRI plugin %s exited (%v): containerd closed its connection", flaky.nriName(), err)
		}
		if calls := flaky.calls(t, ""); calls == callsBefore {
			t.Errorf("NRI plugin %s was not asked meanwhile", flaky.nriName())
		}
	}

	t.Run("fails", func(t *testing.T) {
		flaky.behave(t, "", behaveError)
		calls := flaky.calls(t, "")
		n.restartKubelet(t, started)

		a := started["a"]
		n.crash(t, n.runningContainer(t, a.uid, appContainer))
		n.waitKubelet(t, time.Minute, "restarting pod a's container", func(pods map[string]*corev1.Pod) bool {
			return running(pods["a"]) && pods["a"].Status.ContainerStatuses[0].RestartCount == 1
		})

		// A pod started now has no answer of the failing plugin, live or last known: its status is
		// unknown until the plugin answers.
		cWritten := n.addStaticPods(t, appPod("c", nil))["c"]
		time.Sleep(5 * time.Second)
		c := n.kubeletPods(t)["c"]
		figure(t, "pod c started while %s fails: after 5s the kubelet reports phase %q, IPs %v",
			flaky.nriName(), c.Status.Phase, podIPs(c))
		flaky.behave(t, "", "")
		pods, seen := n.waitRunning(t, "c")
		figure(t, "pod c: manifest to Running with IPs %v in %s (%s of them with %s failing)", podIPs(pods["c"]),
			seen["c"].Sub(cWritten).Round(time.Millisecond), 5*time.Second, flaky.nriName())
		if _, created := n.runPodSandboxes(t, string(pods["c"].UID)); created != 1 {
			t.Errorf("pod c: containerd created %d sandboxes for it, want 1", created)
		}
		stillConnected(t, calls)
	})
	t.Run("answers after the request timeout", func(t *testing.T) {
		connected(t)
		// The harness's plugin_request_timeout is 2s.
		flaky.slowDown(t, 5*time.Second)
		calls := flaky.calls(t, "")
		n.restartKubelet(t, started)
		stillConnected(t, calls)
	})
	t.Run("answers slowly within the request timeout", func(t *testing.T) {
		connected(t)
		flaky.slowDown(t, time.Second)
		// The timeouts of the previous case put the plugin in backoff (up to 30 s): until it
		// ends, containerd answers from the last known answers without asking the plugin.
		waitAskedAgain(t, n, flaky, started["a"].sandbox, 45*time.Second)
		calls := flaky.calls(t, "")
		n.restartKubelet(t, started)
		stillConnected(t, calls)
	})
	flaky.slowDown(t, 0)
	watch.check(t)
	n.wantUnchanged(t, n.kubeletPods(t), started)
}

// waitAskedAgain queries the pod's status every 500 ms until containerd asks plugin for it again,
// which it does once the plugin's status backoff has ended.
func waitAskedAgain(t *testing.T, n *kubeletNode, plugin *testPlugin, sandboxID string, timeout time.Duration) {
	t.Helper()
	before := plugin.calls(t, sandboxID)
	deadline := time.Now().Add(timeout)
	for plugin.calls(t, sandboxID) == before {
		if time.Now().After(deadline) {
			t.Fatalf("containerd did not ask NRI plugin %s about pod sandbox %s for %s", plugin.nriName(), sandboxID, timeout)
		}
		if _, err := n.h.Runtime.PodSandboxStatus(n.ctx, &criruntime.PodSandboxStatusRequest{PodSandboxId: sandboxID}); err != nil {
			t.Fatalf("PodSandboxStatus of %s: %v", sandboxID, err)
		}
		time.Sleep(500 * time.Millisecond)
	}
}
