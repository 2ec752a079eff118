package integration

// The cluster end-to-end suite (`make test` runs it as its own suite, cluster-e2e): a real
// Kubernetes cluster of two nodes (package cluster: etcd, kube-apiserver, controller-manager,
// scheduler, per node containerd, kubelet and kube-proxy, CoreDNS) on knext without CNI with
// nri-bridge as its network, and the same checks on the baseline of upstream containerd with CNI,
// except those about NRI itself. $KNEXT_CLUSTER_RUNTIMES (default "knext,upstream") selects the
// runtimes. Figures (failed Service requests per fault, what became of a restarted node's pods)
// go to $KNEXT_TEST_FIGURES.

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	criruntime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/knext-dev/knext/contrib/cluster"
	"github.com/knext-dev/knext/internal/harness"
	"github.com/knext-dev/knext/internal/harness/testimages"
)

const (
	// e2eNamespace holds the suite's workloads.
	e2eNamespace = "e2e"
	// webPort is netcheck's port in every workload pod; webHostPort the hostPort pod's.
	webPort     = 8080
	webHostPort = 18080
	// clusterTestTimeout bounds one runtime's run of the suite.
	clusterTestTimeout = 25 * time.Minute
)

// clusterRuntimes returns the runtimes the suite runs on.
func clusterRuntimes() []string {
	if env := os.Getenv("KNEXT_CLUSTER_RUNTIMES"); env != "" {
		return strings.Split(env, ",")
	}
	return []string{cluster.RuntimeKnext, cluster.RuntimeUpstream}
}

func TestCluster(t *testing.T) {
	for _, runtime := range clusterRuntimes() {
		t.Run(runtime, func(t *testing.T) {
			e := startCluster(t, runtime)
			if e.knext() {
				t.Run("Bootstrap", e.testBootstrap)
			}
			if t.Failed() {
				return
			}
			e.deployWorkloads(t)
			t.Run("PodIPs", e.testPodIPs)
			t.Run("PodToPod", e.testPodToPod)
			t.Run("Services", e.testServices)
			t.Run("Faults", e.testFaults)
			if e.knext() {
				t.Run("NodeWithoutNetwork", e.testNodeWithoutNetwork)
			}
		})
	}
}

// clusterEnv is one running cluster of the suite.
type clusterEnv struct {
	runtime  string
	ctx      context.Context
	c        *cluster.Cluster
	client   kubernetes.Interface
	image    string // netcheck's
	figures  *figureLog
	nodeIPs  map[string][]string // node name → IPv4, IPv6
	services map[string]*corev1.Service
}

func (e *clusterEnv) knext() bool { return e.runtime == cluster.RuntimeKnext }

// startCluster brings up a two-node cluster of runtime; in knext mode without nri-bridge (the
// Bootstrap test applies it). It is removed when the test ends, its logs shown if it failed.
func startCluster(t *testing.T, runtime string) *clusterEnv {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), clusterTestTimeout)
	t.Cleanup(cancel)
	dir, err := os.MkdirTemp("", "knc-") //nolint:usetesting // a short path: the nodes' sockets live under it
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := cluster.EnvConfig(dir, 2, runtime)
	if err != nil {
		t.Fatal(err)
	}
	cfg.SkipNRIBridge = true
	cfg.Logf = t.Logf
	start := time.Now()
	c, err := cluster.Up(ctx, cfg)
	if c != nil {
		t.Cleanup(func() {
			if t.Failed() {
				logClusterTails(t, c)
			}
			// Everything the nodes ran (their shims above all) must be gone after Down.
			var nodeProcesses []int
			for _, n := range c.Nodes {
				pids, err := harness.MountNamespaceProcesses(n.MountNS)
				if err != nil {
					t.Errorf("processes of %s: %v", n.Name, err)
				}
				nodeProcesses = append(nodeProcesses, pids...)
			}
			if err := cluster.Down(c.Dir, t.Logf); err != nil {
				t.Errorf("cluster down: %v", err)
			}
			for _, pid := range nodeProcesses {
				if harness.ProcessAlive(pid) {
					cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
					t.Errorf("pid %d of a node outlived cluster down: %s", pid, strings.ReplaceAll(string(cmdline), "\x00", " "))
				}
			}
		})
	}
	if err != nil {
		t.Fatalf("cluster up: %v", err)
	}
	t.Logf("cluster %s (%s) up in %s", c.ID, runtime, time.Since(start).Round(time.Millisecond))
	client, err := c.Client()
	if err != nil {
		t.Fatal(err)
	}
	image, err := testimages.ImageName(filepath.Join(os.Getenv(cluster.ImagesDirEnv), cluster.NetcheckArchive))
	if err != nil {
		t.Fatal(err)
	}
	e := &clusterEnv{runtime: runtime, ctx: ctx, c: c, client: client, image: image,
		figures: newFigureLog(t, "cluster-e2e "+runtime), nodeIPs: map[string][]string{}, services: map[string]*corev1.Service{}}
	for _, n := range c.Nodes {
		e.nodeIPs[n.Name] = n.IPs
	}
	if _, err := client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: e2eNamespace}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return e
}

func logClusterTails(t *testing.T, c *cluster.Cluster) {
	for _, p := range c.ControlPlane.Processes {
		t.Log(harness.Tail(p.Log, 15, nil))
	}
	for _, n := range c.Nodes {
		for _, p := range n.Processes {
			t.Log(harness.Tail(p.Log, 30, nil))
		}
	}
}

// figureLog collects the suite's figures and appends them to $KNEXT_TEST_FIGURES at the end.
type figureLog struct {
	mu    sync.Mutex
	lines []string
}

func newFigureLog(t *testing.T, heading string) *figureLog {
	f := &figureLog{lines: []string{heading + ":"}}
	t.Cleanup(func() {
		if path := os.Getenv("KNEXT_TEST_FIGURES"); path != "" && len(f.lines) > 1 {
			out, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
			if err == nil {
				fmt.Fprintln(out, strings.Join(f.lines, "\n  "))
				out.Close()
			}
		}
	})
	return f
}

func (f *figureLog) add(t *testing.T, format string, args ...any) {
	t.Helper()
	line := fmt.Sprintf(format, args...)
	t.Log(line)
	f.mu.Lock()
	defer f.mu.Unlock()
	f.lines = append(f.lines, line)
}

// pollUntil calls check every 500 ms until it returns nil; after timeout it fails the test with
// check's last error.
func (e *clusterEnv) pollUntil(t *testing.T, timeout time.Duration, what string, check func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := check()
		if err == nil {
			return
		}
		if time.Now().After(deadline) || e.ctx.Err() != nil {
			t.Fatalf("after %s, still not %s: %v", timeout, what, err)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// netcheckPod returns a pod on node running `netcheck serve`, with a readiness probe on its port.
func (e *clusterEnv) netcheckPod(name, node string, labels map[string]string) *corev1.Pod {
	grace := int64(1)
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: e2eNamespace, Labels: labels},
		Spec: corev1.PodSpec{
			NodeSelector:                  map[string]string{corev1.LabelHostname: node},
			TerminationGracePeriodSeconds: &grace,
			Containers:                    []corev1.Container{e.netcheckContainer("serve")},
		},
	}
}

func (e *clusterEnv) netcheckContainer(args ...string) corev1.Container {
	return corev1.Container{
		Name: "netcheck", Image: e.image, ImagePullPolicy: corev1.PullIfNotPresent, Args: args,
		Ports: []corev1.ContainerPort{{ContainerPort: webPort, Protocol: corev1.ProtocolTCP}, {ContainerPort: webPort, Protocol: corev1.ProtocolUDP}},
		ReadinessProbe: &corev1.Probe{
			ProbeHandler:  corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Port: intstr.FromInt32(webPort)}},
			PeriodSeconds: 1,
		},
	}
}

func (e *clusterEnv) createPod(t *testing.T, pod *corev1.Pod) *corev1.Pod {
	t.Helper()
	created, err := e.client.CoreV1().Pods(pod.Namespace).Create(e.ctx, pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create pod %s: %v", pod.Name, err)
	}
	return created
}

// waitPodsReady waits until every named pod of the e2e namespace is Ready with its IPs, and
// returns them by name.
func (e *clusterEnv) waitPodsReady(t *testing.T, names ...string) map[string]*corev1.Pod {
	t.Helper()
	pods := map[string]*corev1.Pod{}
	e.pollUntil(t, 3*time.Minute, fmt.Sprintf("Ready with IPs: %v", names), func() error {
		for _, name := range names {
			pod, err := e.client.CoreV1().Pods(e2eNamespace).Get(e.ctx, name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if !cluster.PodReady(pod) || len(pod.Status.PodIPs) == 0 {
				return fmt.Errorf("pod %s: phase %s, IPs %v, conditions %v", name, pod.Status.Phase, pod.Status.PodIPs, pod.Status.Conditions)
			}
			pods[name] = pod
		}
		return nil
	})
	return pods
}

// podSandboxes returns the IDs of every sandbox (any state) the node's containerd has of the pod.
func (e *clusterEnv) podSandboxes(t *testing.T, node string, uid types.UID) []string {
	t.Helper()
	var ids []string
	for _, s := range e.sandboxes(t, node, uid) {
		ids = append(ids, s.GetId())
	}
	return ids
}

// sandboxes returns the sandboxes the node's containerd has of the pod.
func (e *clusterEnv) sandboxes(t *testing.T, node string, uid types.UID) []*criruntime.PodSandbox {
	t.Helper()
	rt, _, closeConn, err := e.c.Node(node).CRI()
	if err != nil {
		t.Fatal(err)
	}
	defer closeConn()
	resp, err := rt.ListPodSandbox(e.ctx, &criruntime.ListPodSandboxRequest{Filter: &criruntime.PodSandboxFilter{
		LabelSelector: map[string]string{podUIDLabel: string(uid)},
	}})
	if err != nil {
		t.Fatalf("node %s: list sandboxes of pod %s: %v", node, uid, err)
	}
	return resp.GetItems()
}

// networkReady returns the node's containerd's NetworkReady condition.
func (e *clusterEnv) networkReady(t *testing.T, node string) *criruntime.RuntimeCondition {
	t.Helper()
	rt, _, closeConn, err := e.c.Node(node).CRI()
	if err != nil {
		t.Fatal(err)
	}
	defer closeConn()
	resp, err := rt.Status(e.ctx, &criruntime.StatusRequest{})
	if err != nil {
		t.Fatalf("node %s: CRI status: %v", node, err)
	}
	for _, c := range resp.GetStatus().GetConditions() {
		if c.Type == criruntime.NetworkReady {
			return c
		}
	}
	t.Fatalf("node %s: CRI status has no NetworkReady condition", node)
	return nil
}

// testBootstrap: before nri-bridge runs on a node, the node is NotReady with NetworkReady false,
// an ordinary pod waits without any sandbox being made for it, and a host-network pod runs; once
// nri-bridge's DaemonSet is applied, the nodes become Ready and the waiting pod starts in one
// sandbox.
func (e *clusterEnv) testBootstrap(t *testing.T) {
	for _, n := range e.c.Nodes {
		if cond := e.networkReady(t, n.Name); cond.Status {
			t.Fatalf("node %s: NetworkReady is true before nri-bridge runs", n.Name)
		}
		node, err := e.client.CoreV1().Nodes().Get(e.ctx, n.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		ready := cluster.NodeCondition(node, corev1.NodeReady)
		if ready == nil || ready.Status == corev1.ConditionTrue || !strings.Contains(ready.Message, "NetworkReady=false") {
			t.Errorf("node %s before nri-bridge: Ready condition %+v, want False naming NetworkReady=false", n.Name, ready)
		}
	}
	waiting := e.netcheckPod("early", "node-1", nil)
	// A node without a pod network is tainted not-ready: pods that tolerate it are placed there
	// and wait for the network, as a DaemonSet's would.
	waiting.Spec.Tolerations = []corev1.Toleration{{Operator: corev1.TolerationOpExists}}
	waiting = e.createPod(t, waiting)
	hostNet := e.netcheckPod("early-host", "node-1", nil)
	hostNet.Spec.HostNetwork = true
	hostNet.Spec.Tolerations = waiting.Spec.Tolerations
	hostNet.Spec.Containers[0].Args = []string{"serve", "-port", "18081"}
	hostNet.Spec.Containers[0].Ports = nil
	hostNet.Spec.Containers[0].ReadinessProbe.HTTPGet.Port = intstr.FromInt32(18081)
	e.createPod(t, hostNet)
	e.waitPodsReady(t, "early-host")
	// The kubelet syncs a pod about every second while it waits: long enough to see a loop.
	time.Sleep(15 * time.Second)
	pod, err := e.client.CoreV1().Pods(e2eNamespace).Get(e.ctx, "early", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if pod.Status.Phase != corev1.PodPending {
		t.Errorf("pod early before nri-bridge: phase %s, want Pending", pod.Status.Phase)
	}
	if ids := e.podSandboxes(t, "node-1", pod.UID); len(ids) != 0 {
		t.Errorf("pod early before nri-bridge: containerd has sandboxes %v, want none", ids)
	}
	start := time.Now()
	if err := e.c.ApplyNRIBridge(e.ctx); err != nil {
		t.Fatal(err)
	}
	if err := e.c.WaitReady(e.ctx); err != nil {
		t.Fatalf("after applying nri-bridge: %v", err)
	}
	e.figures.add(t, "bootstrap: nodes Ready and CoreDNS available %s after applying nri-bridge's DaemonSet", time.Since(start).Round(100*time.Millisecond))
	e.waitPodsReady(t, "early")
	if ids := e.podSandboxes(t, "node-1", pod.UID); len(ids) != 1 {
		t.Errorf("pod early: containerd has sandboxes %v, want exactly one", ids)
	}
	for _, n := range e.c.Nodes {
		if cond := e.networkReady(t, n.Name); !cond.Status {
			t.Errorf("node %s: NetworkReady false with nri-bridge running: %s %s", n.Name, cond.Reason, cond.Message)
		}
	}
}

// The suite's workloads: a web Deployment with one pod per node behind a dual-stack ClusterIP
// Service and a NodePort Service, a client pod on every node, a hostPort pod on node-1, and a
// prober on node-1 that requests the Service every 200 ms for the whole suite.
func (e *clusterEnv) deployWorkloads(t *testing.T) {
	replicas := int32(len(e.c.Nodes))
	labels := map[string]string{"app": "web"}
	grace := int64(1)
	web := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: e2eNamespace},
		Spec: appsv1.DeploymentSpec{
			Replicas: &replicas,
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					TerminationGracePeriodSeconds: &grace,
					Affinity: &corev1.Affinity{PodAntiAffinity: &corev1.PodAntiAffinity{
						RequiredDuringSchedulingIgnoredDuringExecution: []corev1.PodAffinityTerm{{
							TopologyKey: corev1.LabelHostname, LabelSelector: &metav1.LabelSelector{MatchLabels: labels},
						}},
					}},
					Containers: []corev1.Container{e.netcheckContainer("serve")},
				},
			},
		},
	}
	if _, err := e.client.AppsV1().Deployments(e2eNamespace).Create(e.ctx, web, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	dualStack := corev1.IPFamilyPolicyRequireDualStack
	ports := []corev1.ServicePort{
		{Name: "http", Port: 80, TargetPort: intstr.FromInt32(webPort), Protocol: corev1.ProtocolTCP},
		{Name: "udp", Port: 81, TargetPort: intstr.FromInt32(webPort), Protocol: corev1.ProtocolUDP},
	}
	for name, kind := range map[string]corev1.ServiceType{"web": corev1.ServiceTypeClusterIP, "web-nodeport": corev1.ServiceTypeNodePort} {
		svc, err := e.client.CoreV1().Services(e2eNamespace).Create(e.ctx, &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: e2eNamespace},
			Spec:       corev1.ServiceSpec{Type: kind, Selector: labels, IPFamilyPolicy: &dualStack, Ports: ports},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("create Service %s: %v", name, err)
		}
		e.services[name] = svc
	}
	names := []string{"hostport"}
	hostPortPod := e.netcheckPod("hostport", "node-1", nil)
	hostPortPod.Spec.Containers[0].Ports[0].HostPort = webHostPort
	e.createPod(t, hostPortPod)
	for _, n := range e.c.Nodes {
		e.createPod(t, e.netcheckPod("client-"+n.Name, n.Name, nil))
		names = append(names, "client-"+n.Name)
	}
	prober := e.netcheckPod("prober", "node-1", nil)
	prober.Spec.Containers[0].Args = []string{"probe", "-timeout", "1s", "http://" + e.services["web"].Spec.ClusterIPs[0] + "/"}
	prober.Spec.Containers[0].ReadinessProbe = nil
	e.createPod(t, prober)
	e.waitPodsReady(t, append(names, "prober")...)
	e.pollUntil(t, 3*time.Minute, "web available", func() error {
		d, err := e.client.AppsV1().Deployments(e2eNamespace).Get(e.ctx, "web", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if d.Status.AvailableReplicas != replicas {
			return fmt.Errorf("%d of %d replicas available", d.Status.AvailableReplicas, replicas)
		}
		return nil
	})
}

// webPods returns the web Deployment's pods by node.
func (e *clusterEnv) webPods(t *testing.T) map[string]*corev1.Pod {
	t.Helper()
	list, err := e.client.CoreV1().Pods(e2eNamespace).List(e.ctx, metav1.ListOptions{LabelSelector: "app=web"})
	if err != nil {
		t.Fatal(err)
	}
	byNode := map[string]*corev1.Pod{}
	for i := range list.Items {
		if pod := &list.Items[i]; pod.DeletionTimestamp == nil {
			byNode[pod.Spec.NodeName] = pod
		}
	}
	if len(byNode) != len(e.c.Nodes) {
		t.Fatalf("web pods on nodes %v, want one on each of %d nodes", slices.Sorted(maps.Keys(byNode)), len(e.c.Nodes))
	}
	return byNode
}

// allPods returns every pod of the cluster that is not being deleted.
func (e *clusterEnv) allPods(t *testing.T) []corev1.Pod {
	t.Helper()
	list, err := e.client.CoreV1().Pods("").List(e.ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var pods []corev1.Pod
	for _, pod := range list.Items {
		if pod.DeletionTimestamp == nil {
			pods = append(pods, pod)
		}
	}
	return pods
}

// testPodIPs: every pod on the pod network has one IPv4 and one IPv6 in the API, in its node's
// spec.podCIDRs, equal to what the node's containerd reports for its sandbox; in knext mode every
// one of those IPs comes live from nri-bridge (`crictl inspectp`).
func (e *clusterEnv) testPodIPs(t *testing.T) {
	nodeCIDRs := map[string][]string{}
	for _, n := range e.c.Nodes {
		node, err := e.client.CoreV1().Nodes().Get(e.ctx, n.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		nodeCIDRs[n.Name] = node.Spec.PodCIDRs
	}
	checked := 0
	for _, pod := range e.allPods(t) {
		if pod.Spec.HostNetwork || pod.Status.Phase != corev1.PodRunning {
			continue
		}
		checked++
		ips := podIPs(&pod)
		if len(ips) != 2 || !netip.MustParseAddr(ips[0]).Is4() || !netip.MustParseAddr(ips[1]).Is6() {
			t.Errorf("pod %s/%s: IPs %v, want an IPv4 and an IPv6", pod.Namespace, pod.Name, ips)
			continue
		}
		for i, ip := range ips {
			inSubnet(t, ip, nodeCIDRs[pod.Spec.NodeName][i])
		}
		sandboxes := e.podSandboxes(t, pod.Spec.NodeName, pod.UID)
		if len(sandboxes) != 1 {
			t.Errorf("pod %s/%s: sandboxes %v on %s, want one", pod.Namespace, pod.Name, sandboxes, pod.Spec.NodeName)
			continue
		}
		out, err := e.c.Crictl(e.ctx, pod.Spec.NodeName, "inspectp", "-o", "json", sandboxes[0])
		if err != nil {
			t.Fatal(err)
		}
		var shown inspectp
		if err := json.Unmarshal(out, &shown); err != nil {
			t.Fatalf("crictl inspectp %s: %v\n%s", sandboxes[0], err, out)
		}
		criIPs := []string{shown.Status.Network.IP}
		for _, a := range shown.Status.Network.AdditionalIPs {
			criIPs = append(criIPs, a.IP)
		}
		if !slices.Equal(sortedCopy(criIPs), sortedCopy(ips)) {
			t.Errorf("pod %s/%s: the API has IPs %v, containerd reports %v", pod.Namespace, pod.Name, ips, criIPs)
		}
		if !e.knext() {
			continue
		}
		for _, ip := range ips {
			i := slices.IndexFunc(shown.PodNetwork.IPs, func(r reportedIP) bool { return r.IP == ip })
			if i < 0 || shown.PodNetwork.IPs[i].Source != "nri:"+nriBridgeName || shown.PodNetwork.IPs[i].NRI != nriAtRunPodSandbox {
				t.Errorf("pod %s/%s: IP %s has provenance %+v, want it from the RunPodSandbox answer of nri:%s", pod.Namespace, pod.Name, ip, shown.PodNetwork.IPs, nriBridgeName)
			}
		}
	}
	if checked < 2*len(e.c.Nodes) {
		t.Errorf("only %d pods on the pod network to check", checked)
	}
}

// exec runs netcheck in pod (of the e2e namespace) through the API server and returns its output.
func (e *clusterEnv) exec(pod string, args ...string) (string, error) {
	out, err := e.c.Kubectl(e.ctx, nil, append([]string{"-n", e2eNamespace, "exec", pod, "--", "netcheck"}, args...)...)
	return strings.TrimSpace(string(out)), err
}

// answerFrom parses netcheck's answer "client=<ip> host=<hostname>".
func answerFrom(out string) (client, host string) {
	for field := range strings.FieldsSeq(out) {
		if v, ok := strings.CutPrefix(field, "client="); ok {
			client = v
		} else if v, ok := strings.CutPrefix(field, "host="); ok {
			host = v
		}
	}
	return client, host
}

// testPodToPod: a client pod on each node reaches the web pod on every other node directly, over
// both families, TCP and UDP, and the server sees the client's own pod IP (no NAT between pods).
func (e *clusterEnv) testPodToPod(t *testing.T) {
	web := e.webPods(t)
	for _, n := range e.c.Nodes {
		client, err := e.client.CoreV1().Pods(e2eNamespace).Get(e.ctx, "client-"+n.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		clientIPs := podIPs(client)
		for node, server := range web {
			if node == n.Name {
				continue
			}
			for i, ip := range podIPs(server) {
				for _, proto := range []string{"tcp", "udp"} {
					args := []string{"get", "http://" + hostPort(netip.MustParseAddr(ip), webPort) + "/"}
					if proto == "udp" {
						args = []string{"udp", hostPort(netip.MustParseAddr(ip), webPort)}
					}
					out, err := e.exec(client.Name, args...)
					got, host := answerFrom(out)
					if err != nil || got != clientIPs[i] || host != server.Name {
						t.Errorf("%s from %s (%s) to %s (%s) over %s: answer %q, error %v; want client=%s host=%s",
							proto, client.Name, n.Name, server.Name, node, ip, out, err, clientIPs[i], server.Name)
					}
				}
			}
		}
	}
}

// testServices: the dual-stack ClusterIP Service's EndpointSlices list exactly the web pods' IPs;
// it answers from a client pod on every node (both families, TCP and UDP, and by name through
// CoreDNS) and from a web pod that is its own endpoint (hairpin); the NodePort Service answers on
// every node's IPs; the hostPort answers from the other node.
func (e *clusterEnv) testServices(t *testing.T) {
	web := e.webPods(t)
	var want []string
	for _, pod := range web {
		want = append(want, podIPs(pod)...)
	}
	e.pollUntil(t, time.Minute, "EndpointSlices with exactly the web pods' IPs", func() error {
		got, err := e.endpointAddresses("web")
		if err != nil {
			return err
		}
		if !slices.Equal(sortedCopy(got), sortedCopy(want)) {
			return fmt.Errorf("EndpointSlices of web list %v, the web pods have %v", got, want)
		}
		return nil
	})
	svc := e.services["web"]
	name := "web." + e2eNamespace + ".svc.cluster.local"
	for _, n := range e.c.Nodes {
		client := "client-" + n.Name
		for _, ip := range svc.Spec.ClusterIPs {
			if out, err := e.exec(client, "get", "http://"+hostPort(netip.MustParseAddr(ip), 80)+"/"); err != nil || !strings.Contains(out, "host=web-") {
				t.Errorf("TCP %s:80 from %s: %q, %v", ip, client, out, err)
			}
			if out, err := e.exec(client, "udp", hostPort(netip.MustParseAddr(ip), 81)); err != nil || !strings.Contains(out, "host=web-") {
				t.Errorf("UDP %s:81 from %s: %q, %v", ip, client, out, err)
			}
		}
		out, err := e.exec(client, "lookup", name)
		if got := strings.Fields(out); err != nil || !slices.Equal(sortedCopy(got), sortedCopy(svc.Spec.ClusterIPs)) {
			t.Errorf("lookup %s from %s: %q, %v; want %v", name, client, out, err, svc.Spec.ClusterIPs)
		}
		if out, err := e.exec(client, "get", "http://"+name+"/"); err != nil || !strings.Contains(out, "host=web-") {
			t.Errorf("GET http://%s/ from %s: %q, %v", name, client, out, err)
		}
	}
	// Hairpin: a web pod asks its own Service until the answer comes from itself.
	for _, pod := range web {
		for _, ip := range svc.Spec.ClusterIPs {
			hairpin := false
			var last string
			for range 20 {
				out, err := e.exec(pod.Name, "get", "http://"+hostPort(netip.MustParseAddr(ip), 80)+"/")
				last = fmt.Sprintf("%q, %v", out, err)
				if _, host := answerFrom(out); err == nil && host == pod.Name {
					hairpin = true
					break
				}
			}
			if !hairpin {
				t.Errorf("pod %s never reached itself through Service IP %s in 20 requests (last: %s)", pod.Name, ip, last)
			}
		}
	}
	// NodePort, from the host on the underlay.
	nodePort := e.services["web-nodeport"].Spec.Ports[0].NodePort
	for node, ips := range e.nodeIPs {
		for _, ip := range ips {
			if body, err := httpGet(e.ctx, "http://"+hostPort(netip.MustParseAddr(ip), nodePort)+"/"); err != nil || !strings.Contains(body, "host=web-") {
				t.Errorf("NodePort %s on node %s: %q, %v", hostPort(netip.MustParseAddr(ip), nodePort), node, body, err)
			}
		}
	}
	// hostPort of the pod on node-1, from the client on node-2.
	for _, ip := range e.nodeIPs["node-1"] {
		if out, err := e.exec("client-node-2", "get", "http://"+hostPort(netip.MustParseAddr(ip), webHostPort)+"/"); err != nil || !strings.Contains(out, "host=hostport") {
			t.Errorf("hostPort %s from client-node-2: %q, %v", hostPort(netip.MustParseAddr(ip), webHostPort), out, err)
		}
	}
}

// endpointAddresses returns the addresses of the ready endpoints of the Service's EndpointSlices.
func (e *clusterEnv) endpointAddresses(service string) ([]string, error) {
	slices, err := e.client.DiscoveryV1().EndpointSlices(e2eNamespace).List(e.ctx, metav1.ListOptions{
		LabelSelector: discoveryv1.LabelServiceName + "=" + service,
	})
	if err != nil {
		return nil, err
	}
	var addrs []string
	for _, s := range slices.Items {
		for _, ep := range s.Endpoints {
			if ep.Conditions.Ready == nil || *ep.Conditions.Ready {
				addrs = append(addrs, ep.Addresses...)
			}
		}
	}
	return addrs, nil
}

func httpGet(ctx context.Context, url string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "", err
	}
	resp, err := (&http.Client{Transport: &http.Transport{DisableKeepAlives: true}}).Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return strings.TrimSpace(string(body)), err
}

// podRecord is what the fault tests hold every running pod to.
type podRecord struct {
	namespace, name, node string
	ips                   []string
	restarts              int32
	sandboxes             []string
}

// podWatch records, for the pods running when it starts, every change the API shows of their IPs
// or container restart counts, and their removal.
type podWatch struct {
	mu      sync.Mutex
	pods    map[types.UID]podRecord
	changes map[types.UID][]string
	stop    chan struct{}
}

func (e *clusterEnv) watchPods(t *testing.T) *podWatch {
	t.Helper()
	w := &podWatch{pods: map[types.UID]podRecord{}, changes: map[types.UID][]string{}, stop: make(chan struct{})}
	for _, pod := range e.allPods(t) {
		if pod.Status.Phase != corev1.PodRunning {
			continue
		}
		r := podRecord{namespace: pod.Namespace, name: pod.Name, node: pod.Spec.NodeName, ips: podIPs(&pod), restarts: restarts(&pod)}
		if !pod.Spec.HostNetwork {
			r.sandboxes = e.podSandboxes(t, pod.Spec.NodeName, pod.UID)
		}
		w.pods[pod.UID] = r
	}
	factory := informers.NewSharedInformerFactory(e.client, 0)
	informer := factory.Core().V1().Pods().Informer()
	informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		UpdateFunc: func(_, obj any) { w.observe(obj.(*corev1.Pod), "") },
		DeleteFunc: func(obj any) {
			if pod, ok := obj.(*corev1.Pod); ok {
				w.observe(pod, "deleted")
			}
		},
	})
	factory.Start(w.stop)
	factory.WaitForCacheSync(w.stop)
	t.Cleanup(func() { close(w.stop) })
	return w
}

func restarts(pod *corev1.Pod) int32 {
	var n int32
	for _, c := range pod.Status.ContainerStatuses {
		n += c.RestartCount
	}
	return n
}

func (w *podWatch) observe(pod *corev1.Pod, event string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	r, ok := w.pods[pod.UID]
	if !ok {
		return
	}
	var change []string
	if event != "" {
		change = append(change, event)
	}
	if ips := podIPs(pod); len(ips) > 0 && !slices.Equal(ips, r.ips) {
		change = append(change, fmt.Sprintf("IPs %v → %v", r.ips, ips))
	}
	if n := restarts(pod); n != r.restarts {
		change = append(change, fmt.Sprintf("container restarts %d → %d", r.restarts, n))
	}
	if len(change) > 0 {
		w.changes[pod.UID] = append(w.changes[pod.UID], time.Now().Format("15:04:05.000")+" "+strings.Join(change, ", "))
	}
}

// check fails the test for every watched pod not in exempt (by UID) that changed IPs or restart
// count, was removed, or has a sandbox other than the one it had, and forgets exempt pods.
func (w *podWatch) check(t *testing.T, e *clusterEnv, fault string, exempt func(podRecord) bool) {
	t.Helper()
	w.mu.Lock()
	defer w.mu.Unlock()
	checked := 0
	for uid, r := range w.pods {
		if exempt(r) {
			delete(w.pods, uid)
			continue
		}
		checked++
		if changes := w.changes[uid]; len(changes) > 0 {
			t.Errorf("%s: pod %s/%s on %s changed: %v", fault, r.namespace, r.name, r.node, changes)
		}
		if r.sandboxes != nil {
			if got := e.podSandboxes(t, r.node, uid); !slices.Equal(got, r.sandboxes) {
				t.Errorf("%s: pod %s/%s on %s has sandboxes %v, had %v", fault, r.namespace, r.name, r.node, got, r.sandboxes)
			}
		}
	}
	t.Logf("%s: %d running pods kept their sandbox, containers and IPs", fault, checked)
}

// proberFailures returns the prober's requests between from and to, and those that failed.
func (e *clusterEnv) proberFailures(t *testing.T, from, to time.Time) (requests int, failed []string) {
	t.Helper()
	out, err := e.client.CoreV1().Pods(e2eNamespace).GetLogs("prober", &corev1.PodLogOptions{SinceTime: &metav1.Time{Time: from.Add(-time.Second)}}).Do(e.ctx).Raw()
	if err != nil {
		t.Fatalf("prober log: %v", err)
	}
	scanner := bufio.NewScanner(strings.NewReader(string(out)))
	for scanner.Scan() {
		when, rest, _ := strings.Cut(scanner.Text(), " ")
		at, err := time.Parse(time.RFC3339Nano, when)
		if err != nil || at.Before(from) || at.After(to) {
			continue
		}
		requests++
		if strings.HasPrefix(rest, "fail") {
			failed = append(failed, scanner.Text())
		}
	}
	return requests, failed
}

// fault runs inject with the pod watch on, waits until the cluster is whole again, checks the
// running pods (except those exempt says the fault itself replaces) and reports the prober's
// failed Service requests during it.
func (e *clusterEnv) fault(t *testing.T, w *podWatch, name string, inject func() error, exempt func(podRecord) bool) {
	t.Helper()
	start := time.Now()
	if err := inject(); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	if err := e.c.WaitReady(e.ctx); err != nil {
		t.Fatalf("%s: cluster not ready again: %v", name, err)
	}
	// The prober's requests right after the fault belong to it too.
	time.Sleep(3 * time.Second)
	end := time.Now()
	w.check(t, e, name, exempt)
	requests, failed := e.proberFailures(t, start, end)
	e.figures.add(t, "fault %q: %s until the cluster was ready again; Service requests from node-1 during it: %d, failed %d",
		name, end.Sub(start).Round(100*time.Millisecond), requests, len(failed))
	for _, f := range failed[:min(len(failed), 5)] {
		t.Logf("  %s", f)
	}
	if requests == 0 {
		t.Errorf("%s: the prober made no request during the fault", name)
	}
}

func isNRIBridgePod(r podRecord) bool {
	return r.namespace == "kube-system" && strings.HasPrefix(r.name, "nri-bridge-")
}

func never(podRecord) bool { return false }

// testFaults injects faults one after another, with a watch on every running pod for the whole
// test: nri-bridge's pod deleted and its DaemonSet rolled (knext), a containerd restart, a
// kubelet restart, an API server restart, and a whole node restarted from its state, after which
// it reports what became of that node's pods.
func (e *clusterEnv) testFaults(t *testing.T) {
	w := e.watchPods(t)
	if e.knext() {
		e.fault(t, w, "nri-bridge pod on node-1 deleted", func() error {
			pods, err := e.client.CoreV1().Pods("kube-system").List(e.ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=node-1", LabelSelector: "app.kubernetes.io/name=nri-bridge"})
			if err != nil || len(pods.Items) != 1 {
				return fmt.Errorf("nri-bridge pod on node-1: %v (%d pods)", err, len(pods.Items))
			}
			if err := e.client.CoreV1().Pods("kube-system").Delete(e.ctx, pods.Items[0].Name, metav1.DeleteOptions{}); err != nil {
				return err
			}
			return e.waitDaemonSet()
		}, isNRIBridgePod)
		e.fault(t, w, "kubectl rollout restart of nri-bridge", func() error {
			if _, err := e.c.Kubectl(e.ctx, nil, "-n", "kube-system", "rollout", "restart", "daemonset/nri-bridge"); err != nil {
				return err
			}
			_, err := e.c.Kubectl(e.ctx, nil, "-n", "kube-system", "rollout", "status", "daemonset/nri-bridge", "--timeout=3m")
			return err
		}, isNRIBridgePod)
	}
	e.fault(t, w, "containerd restarted on node-1", func() error {
		return e.c.RestartProcess(e.ctx, "node-1", "containerd")
	}, never)
	e.fault(t, w, "kubelet restarted on node-2", func() error {
		return e.c.RestartProcess(e.ctx, "node-2", "kubelet")
	}, never)
	e.fault(t, w, "API server restarted", func() error {
		return e.c.RestartAPIServer(e.ctx)
	}, never)
	before, restarted := e.podsOn(t, "node-2"), time.Now()
	e.fault(t, w, "node-2 restarted (every process killed, booted from its state)", func() error {
		return e.c.RestartNode(e.ctx, "node-2")
	}, func(r podRecord) bool { return r.node == "node-2" })
	e.reportRestartedNode(t, "node-2", before, restarted)
}

// waitDaemonSet waits until nri-bridge runs, up to date and ready, on every node.
func (e *clusterEnv) waitDaemonSet() error {
	return waitFor(e.ctx, 3*time.Minute, func() error {
		ds, err := e.client.AppsV1().DaemonSets("kube-system").Get(e.ctx, "nri-bridge", metav1.GetOptions{})
		if err != nil {
			return err
		}
		s := ds.Status
		if s.ObservedGeneration != ds.Generation || s.NumberReady != s.DesiredNumberScheduled || s.UpdatedNumberScheduled != s.DesiredNumberScheduled {
			return fmt.Errorf("nri-bridge: %d of %d ready, %d updated", s.NumberReady, s.DesiredNumberScheduled, s.UpdatedNumberScheduled)
		}
		return nil
	})
}

func waitFor(ctx context.Context, timeout time.Duration, check func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		err := check()
		if err == nil || time.Now().After(deadline) || ctx.Err() != nil {
			return err
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// podsOn returns the node's running pods by UID.
func (e *clusterEnv) podsOn(t *testing.T, node string) map[types.UID]podRecord {
	t.Helper()
	pods := map[types.UID]podRecord{}
	for _, pod := range e.allPods(t) {
		if pod.Spec.NodeName == node && pod.Status.Phase == corev1.PodRunning {
			r := podRecord{namespace: pod.Namespace, name: pod.Name, node: node, ips: podIPs(&pod), restarts: restarts(&pod)}
			if !pod.Spec.HostNetwork {
				r.sandboxes = e.podSandboxes(t, node, pod.UID)
			}
			pods[pod.UID] = r
		}
	}
	return pods
}

// reportRestartedNode waits until every pod the node ran before its restart is gone or Ready
// again (in a new sandbox, unless it uses the host's network), and reports for each whether the
// same pod runs again, with which IPs and container restarts, in which sandbox.
func (e *clusterEnv) reportRestartedNode(t *testing.T, node string, before map[types.UID]podRecord, restarted time.Time) {
	t.Helper()
	e.pollUntil(t, 4*time.Minute, "every pod of the restarted node gone or running again", func() error {
		for uid, r := range before {
			pod, err := e.client.CoreV1().Pods(r.namespace).Get(e.ctx, r.name, metav1.GetOptions{})
			if err != nil || pod.UID != uid {
				continue // gone
			}
			if !cluster.PodReady(pod) {
				return fmt.Errorf("pod %s/%s is not Ready", r.namespace, r.name)
			}
			if r.sandboxes == nil {
				continue
			}
			var fresh bool
			for _, s := range e.sandboxes(t, node, uid) {
				fresh = fresh || (s.GetState() == criruntime.PodSandboxState_SANDBOX_READY && !slices.Contains(r.sandboxes, s.GetId()))
			}
			if !fresh {
				return fmt.Errorf("pod %s/%s has no new ready sandbox yet", r.namespace, r.name)
			}
		}
		return nil
	})
	e.figures.add(t, "after the restart of %s: all its pods gone or Ready again %s after the restart began", node, time.Since(restarted).Round(100*time.Millisecond))
	for _, uid := range slices.Sorted(maps.Keys(before)) {
		r := before[uid]
		pod, err := e.client.CoreV1().Pods(r.namespace).Get(e.ctx, r.name, metav1.GetOptions{})
		if err != nil || pod.UID != uid {
			e.figures.add(t, "  pod %s/%s: gone (its controller replaced it, or it was deleted)", r.namespace, r.name)
			continue
		}
		state := fmt.Sprintf("same pod, IPs %v (were %v), container restarts %d (were %d)", podIPs(pod), r.ips, restarts(pod), r.restarts)
		if r.sandboxes != nil {
			var attempts []string
			for _, s := range e.sandboxes(t, node, uid) {
				attempts = append(attempts, fmt.Sprintf("attempt %d %s", s.GetMetadata().GetAttempt(), strings.TrimPrefix(s.GetState().String(), "SANDBOX_")))
			}
			state += ", sandboxes: " + strings.Join(attempts, ", ")
		}
		e.figures.add(t, "  pod %s/%s: %s", r.namespace, r.name, state)
	}
}

// testNodeWithoutNetwork: with nri-bridge kept off node-2, a new pod for node-2 waits without a
// sandbox being made for it, pods on node-1 run on unaffected, and once nri-bridge returns the
// waiting pod starts in one sandbox.
func (e *clusterEnv) testNodeWithoutNetwork(t *testing.T) {
	w := e.watchPods(t)
	start := time.Now()
	patch := `{"spec":{"template":{"spec":{"affinity":{"nodeAffinity":{"requiredDuringSchedulingIgnoredDuringExecution":` +
		`{"nodeSelectorTerms":[{"matchExpressions":[{"key":"kubernetes.io/hostname","operator":"NotIn","values":["node-2"]}]}]}}}}}}}`
	if _, err := e.c.Kubectl(e.ctx, nil, "-n", "kube-system", "patch", "daemonset/nri-bridge", "--type=strategic", "-p", patch); err != nil {
		t.Fatal(err)
	}
	e.pollUntil(t, 2*time.Minute, "node-2 without network", func() error {
		if cond := e.networkReady(t, "node-2"); cond.Status {
			return fmt.Errorf("node-2: NetworkReady still true")
		}
		return nil
	})
	pod := e.netcheckPod("waiting", "node-2", nil)
	pod.Spec.Tolerations = []corev1.Toleration{{Operator: corev1.TolerationOpExists}}
	pod = e.createPod(t, pod)
	time.Sleep(15 * time.Second)
	if got, err := e.client.CoreV1().Pods(e2eNamespace).Get(e.ctx, "waiting", metav1.GetOptions{}); err != nil || got.Status.Phase != corev1.PodPending {
		t.Errorf("pod waiting on node-2 without nri-bridge: %v, want Pending (error %v)", got.Status.Phase, err)
	}
	if ids := e.podSandboxes(t, "node-2", pod.UID); len(ids) != 0 {
		t.Errorf("pod waiting on node-2 without nri-bridge: sandboxes %v, want none", ids)
	}
	// node-1 runs on: its pods keep their sandboxes, containers and IPs, and the prober reaches the
	// Service through node-1's endpoint.
	requests, failed := e.proberFailures(t, start, time.Now())
	e.figures.add(t, "nri-bridge kept off node-2: Service requests from node-1: %d, failed %d", requests, len(failed))
	if _, err := e.c.Kubectl(e.ctx, nil, "-n", "kube-system", "patch", "daemonset/nri-bridge", "--type=json",
		"-p", `[{"op":"remove","path":"/spec/template/spec/affinity"}]`); err != nil {
		t.Fatal(err)
	}
	if err := e.waitDaemonSet(); err != nil {
		t.Fatal(err)
	}
	e.waitPodsReady(t, "waiting")
	if ids := e.podSandboxes(t, "node-2", pod.UID); len(ids) != 1 {
		t.Errorf("pod waiting after nri-bridge returned: sandboxes %v, want one", ids)
	}
	w.check(t, e, "nri-bridge off node-2 and back", func(r podRecord) bool { return r.node == "node-2" || isNRIBridgePod(r) })
}
