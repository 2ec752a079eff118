package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
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

	"github.com/knext-dev/knext/internal/cluster"
	"github.com/knext-dev/knext/internal/ociimage"
	"github.com/knext-dev/knext/internal/stack"
)

const clusterNamespace = "bench"

// clusterFigures are what a round measures on a cluster, in seconds but the share
// (docs/performance.md, Cluster).
var clusterFigures = []string{"Cluster/ready-p50", "Cluster/ready-p99", "Cluster/endpoints-p50", "Cluster/endpoints-p99",
	"Cluster/update", "Cluster/fill", "Cluster/kubelet-status-mean", "Cluster/status-p50",
	"Cluster/status-p99", "Cluster/network-setup", "Cluster/run-pod-sandbox", "Cluster/network-share"}

// endpointFigures take each pod's wait for its endpoints apart at the start of the controller-manager's
// sync that published it: the p50 of the waits until then, and from then until the IPs are seen.
var endpointFigures = []string{"Cluster/endpoints-queued-p50", "Cluster/endpoints-synced-p50"}

// The runtime of each configuration's cluster: knext CNI-less with nri-bridge, upstream with CNI.
// Upstream's cluster is measured twice a round, as upstream and as upstream-again: the A/A pair.
var clusterRuntimes = map[string]string{cfgKnext: cluster.RuntimeKnext, cfgUpstream: cluster.RuntimeUpstream,
	cfgUpstreamAgain: cluster.RuntimeUpstream}

// runCluster brings up a cluster of each runtime and in each round measures each configuration on
// its cluster in turn, in a rotating order, only that cluster running: idle ones take CPUs too.
func runCluster(ctx context.Context, s settings, rep *report) (err error) {
	clusters := map[string]*benchCluster{} // by runtime
	defer func() {
		for _, bc := range clusters {
			err = errors.Join(err, cluster.Down(bc.c.Dir, log.Printf))
		}
	}()
	for _, runtime := range []string{cluster.RuntimeUpstream, cluster.RuntimeKnext} {
		if err := switchTo(ctx, clusters, nil); err != nil {
			return err
		}
		bc, err := newBenchCluster(ctx, runtime, s.ClusterNodes, s.ClusterPods)
		if bc != nil {
			clusters[runtime] = bc
		}
		if err != nil {
			return fmt.Errorf("%s cluster: %w", runtime, err)
		}
	}
	if err := rep.meter.measureOwnIdle(ctx); err != nil {
		return err
	}
	rep.ClusterIdle = rep.meter.ownIdle
	return rep.measureTurns("cluster", []string{cfgKnext, cfgUpstream, cfgUpstreamAgain}, []pairing{{cfgUpstream, cfgKnext}, aaPair},
		s.ClusterPods, func(r *round, key string) (map[string]float64, error) {
			bc := clusters[clusterRuntimes[key]]
			if err := switchTo(ctx, clusters, bc); err != nil {
				return nil, err
			}
			return bc.measure(ctx, r, key, s)
		})
}

type benchCluster struct {
	c      *cluster.Cluster
	client kubernetes.Interface
	image  string
}

// switchTo pauses every cluster, then resumes bc (nil: none) and waits until web is whole: every
// measurement starts from a resumed cluster, whichever was measured before.
func switchTo(ctx context.Context, clusters map[string]*benchCluster, bc *benchCluster) error {
	for _, c := range clusters {
		if err := c.c.Pause(); err != nil {
			return err
		}
	}
	if bc == nil {
		return nil
	}
	if err := bc.c.Resume(ctx); err != nil {
		return err
	}
	return bc.waitDeployment(ctx, "web")
}

// newBenchCluster brings the cluster up with the bench's namespace, the Deployment web with that
// many pods (untimed) and its dual-stack Service.
func newBenchCluster(ctx context.Context, runtime string, nodes, pods int) (*benchCluster, error) {
	cfg, err := cluster.EnvConfig("", nodes, runtime)
	if err == nil {
		cfg.Dir, err = os.MkdirTemp("", "knc-bench-")
	}
	if err != nil {
		return nil, err
	}
	cfg.Logf = log.Printf
	c, err := cluster.Up(ctx, cfg)
	if c == nil {
		return nil, errors.Join(err, os.RemoveAll(cfg.Dir))
	}
	bc := &benchCluster{c: c}
	if err != nil {
		return bc, err
	}
	if bc.client, err = c.Client(); err != nil {
		return bc, err
	}
	if bc.image, err = ociimage.ImageName(filepath.Join(os.Getenv(cluster.ImagesDirEnv), cluster.NetcheckArchive)); err != nil {
		return bc, err
	}
	if _, err := bc.client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: clusterNamespace}}, metav1.CreateOptions{}); err != nil {
		return bc, err
	}
	_, err = bc.client.CoreV1().Services(clusterNamespace).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"app": "web"}, IPFamilyPolicy: new(corev1.IPFamilyPolicyRequireDualStack),
			Ports: []corev1.ServicePort{{Port: 80, TargetPort: intstr.FromInt32(8080)}}},
	}, metav1.CreateOptions{})
	if err == nil {
		_, err = bc.client.AppsV1().Deployments(clusterNamespace).Create(ctx, bc.deployment("web", pods, ""), metav1.CreateOptions{})
	}
	if err == nil {
		err = bc.waitDeployment(ctx, "web")
	}
	return bc, err
}

// measure measures configuration key: it rolls a new template of web out, fills one node, then
// removes the fill and waits until every deleted pod of the bench is stopped and removed on its
// node (untimed), so that nothing of this measurement runs while the next one is measured.
func (bc *benchCluster) measure(ctx context.Context, r *round, key string, s settings) (map[string]float64, error) {
	f := map[string]float64{}
	before, err := bc.histograms(ctx, bc.c.Nodes...)
	if err == nil {
		err = r.phase(ctx, key+" rollout", func() error { return bc.rollout(ctx, s.ClusterPods, f) })
	}
	if err == nil {
		err = r.phase(ctx, key+" fill", func() error { return bc.fill(ctx, s.NodePods, f) })
	}
	after, histErr := bc.histograms(ctx, bc.c.Nodes...)
	if err = errors.Join(err, histErr); err != nil {
		return nil, err
	}
	for k, h := range after.since(before) {
		switch {
		case k.plugin == cniTimer && k.operation == "set_up_pod",
			strings.HasSuffix(k.plugin, "-"+stack.NRIBridgePlugin) && k.operation == "RunPodSandbox": // <index>-<name>
			f["Cluster/network-setup"] = h.mean()
		case k.plugin == kubeletTimer && k.operation == "run_podsandbox":
			f["Cluster/run-pod-sandbox"] = h.mean()
		}
	}
	f["Cluster/network-share"] = f["Cluster/network-setup"] / f["Cluster/run-pod-sandbox"]
	log.Printf("bench: cluster %s: %v", key, f)
	return f, bc.clear(ctx)
}

func labelled(app string) map[string]string { return map[string]string{"app": app} }

// deployment is a Deployment of the netcheck server with pods replicas, whose pods spread evenly
// over the nodes or all run on one. A rolling update starts all its new pods at once and removes
// the old ones once they are available.
func (bc *benchCluster) deployment(name string, pods int, node string) *appsv1.Deployment {
	spec := corev1.PodSpec{TerminationGracePeriodSeconds: new(int64(0)),
		Containers: []corev1.Container{{Name: "web", Image: bc.image, Args: []string{"serve"}, ImagePullPolicy: corev1.PullIfNotPresent}}}
	if node == "" {
		spec.TopologySpreadConstraints = []corev1.TopologySpreadConstraint{{MaxSkew: 1, TopologyKey: corev1.LabelHostname,
			WhenUnsatisfiable: corev1.DoNotSchedule, LabelSelector: &metav1.LabelSelector{MatchLabels: labelled(name)}}}
	} else {
		spec.NodeSelector = map[string]string{corev1.LabelHostname: node}
	}
	surge, unavailable := intstr.FromString("100%"), intstr.FromInt32(0)
	return &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: appsv1.DeploymentSpec{
		Replicas: new(int32(pods)), Selector: &metav1.LabelSelector{MatchLabels: labelled(name)},
		Strategy: appsv1.DeploymentStrategy{RollingUpdate: &appsv1.RollingUpdateDeployment{MaxSurge: &surge, MaxUnavailable: &unavailable}},
		Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labelled(name)}, Spec: spec},
	}}
}

// rollout rolls a new template of web out: from then until each of its pods is Ready with its
// IPs, and until its IPs are in the Service's EndpointSlices (and endpointFigures); and until the
// rolling update is complete, the old pods gone.
func (bc *benchCluster) rollout(ctx context.Context, pods int, f map[string]float64) error {
	ctx, stop := context.WithCancel(ctx)
	defer stop()
	w := bc.watch(ctx, fmt.Sprint(time.Now().UnixNano()))
	patch := fmt.Sprintf(`{"spec":{"template":{"metadata":{"labels":{"rollout":"%s"}}}}}`, w.rollout)
	if _, err := bc.client.AppsV1().Deployments(clusterNamespace).Patch(ctx, "web", types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		return err
	}
	spans, err := w.wait(ctx, pods)
	if err == nil {
		err = bc.waitDeployment(ctx, "web")
	}
	f["Cluster/update"] = time.Since(w.start).Seconds()
	syncs, syncsErr := bc.c.EndpointSliceSyncs(clusterNamespace, "web", w.start)
	var starts, endpoints, queued, synced []float64
	for _, s := range spans {
		starts, endpoints = append(starts, s[0].Sub(w.start).Seconds()), append(endpoints, s[1].Sub(s[0]).Seconds())
		by := -1 // the sync that published the IPs: it writes last thing, so it ends nearest to when they are seen
		for i, y := range syncs {
			if !y.Failed && y.Start.Before(s[1]) && (by < 0 || y.End.Sub(s[1]).Abs() < syncs[by].End.Sub(s[1]).Abs()) {
				by = i
			}
		}
		if by >= 0 {
			queued, synced = append(queued, max(0, syncs[by].Start.Sub(s[0]).Seconds())), append(synced, s[1].Sub(syncs[by].Start).Seconds())
		}
	}
	if len(synced) == 0 && err == nil {
		syncsErr = errors.Join(syncsErr, errors.New("no sync of web's EndpointSlices in the controller-manager's log"))
	}
	f["Cluster/ready-p50"], f["Cluster/ready-p99"] = quantile(starts, 0.5), quantile(starts, 0.99)
	f["Cluster/endpoints-p50"], f["Cluster/endpoints-p99"] = quantile(endpoints, 0.5), quantile(endpoints, 0.99)
	f[endpointFigures[0]], f[endpointFigures[1]] = quantile(queued, 0.5), quantile(synced, 0.5)
	return errors.Join(err, syncsErr)
}

// waitDeployment waits until the Deployment's rollout is complete.
func (bc *benchCluster) waitDeployment(ctx context.Context, name string) error {
	return stack.Poll(ctx, 10*time.Minute, 100*time.Millisecond, func() error {
		return cluster.DeploymentReady(ctx, bc.client, clusterNamespace, name)
	})
}

// fill fills the first node up to nodePods pods with the Deployment fill and waits until they are
// Ready; then reads PodSandboxStatus on that node from the kubelet's histogram, and queries every
// pod's status over the node's CRI socket.
func (bc *benchCluster) fill(ctx context.Context, nodePods int, f map[string]float64) error {
	node := bc.c.Nodes[0]
	pods, err := bc.client.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + node.Name})
	if err != nil {
		return err
	}
	running := len(slices.DeleteFunc(pods.Items, func(p corev1.Pod) bool { // what goes leaves room for the fill
		return p.DeletionTimestamp != nil || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed
	}))
	before, err := bc.histograms(ctx, node)
	if err != nil {
		return err
	}
	start := time.Now()
	_, err = bc.client.AppsV1().Deployments(clusterNamespace).Create(ctx, bc.deployment("fill", nodePods-running, node.Name), metav1.CreateOptions{})
	if err == nil {
		err = bc.waitDeployment(ctx, "fill")
	}
	f["Cluster/fill"] = time.Since(start).Seconds()
	after, histErr := bc.histograms(ctx, node)
	if err = errors.Join(err, histErr); err != nil {
		return err
	}
	f["Cluster/kubelet-status-mean"] = after.since(before)[timerKey{kubeletTimer, "podsandbox_status"}].mean()
	rt, _, closeConn, err := node.CRI()
	if err != nil {
		return err
	}
	defer closeConn()
	sandboxes, err := rt.ListPodSandbox(ctx, &criruntime.ListPodSandboxRequest{Filter: &criruntime.PodSandboxFilter{
		State: &criruntime.PodSandboxStateValue{State: criruntime.PodSandboxState_SANDBOX_READY}}})
	if err != nil {
		return err
	}
	seconds, err := timeEach(len(sandboxes.GetItems()), 1, func(i int) error {
		_, err := rt.PodSandboxStatus(ctx, &criruntime.PodSandboxStatusRequest{PodSandboxId: sandboxes.GetItems()[i].GetId()})
		return err
	})
	f["Cluster/status-p50"], f["Cluster/status-p99"] = quantile(seconds, 0.5), quantile(seconds, 0.99)
	return err
}

// clear deletes the Deployment fill, waits until its pods are gone from the API and the kubelets
// have stopped the sandboxes of every deleted pod of the bench, and removes the stopped ones:
// otherwise a kubelet would still be stopping and collecting them, paused in between, in the
// cluster's next measurement.
func (bc *benchCluster) clear(ctx context.Context) error {
	if err := bc.client.AppsV1().Deployments(clusterNamespace).Delete(ctx, "fill", metav1.DeleteOptions{}); err != nil {
		return err
	}
	err := stack.Poll(ctx, 5*time.Minute, 200*time.Millisecond, func() error {
		pods, err := bc.client.CoreV1().Pods(clusterNamespace).List(ctx, metav1.ListOptions{LabelSelector: "app=fill"})
		if err == nil && len(pods.Items) > 0 {
			err = fmt.Errorf("%d pods of fill left", len(pods.Items))
		}
		return err
	})
	for _, node := range bc.c.Nodes {
		if err != nil {
			return err
		}
		err = node.RemoveGoneSandboxes(ctx, bc.client, clusterNamespace)
	}
	return err
}

// histograms reads the histograms of the nodes' containerd and kubelet, summed.
func (bc *benchCluster) histograms(ctx context.Context, nodes ...*cluster.NodeState) (histograms, error) {
	sum := histograms{}
	for _, n := range nodes {
		h, err := fetchHistograms(ctx, fmt.Sprintf("http://%s:%d/v1/metrics", n.IPs[0], cluster.ContainerdMetricsPort))
		if err != nil {
			return nil, err
		}
		sum.add(h, 1)
		raw, err := bc.client.CoreV1().RESTClient().Get().AbsPath("/api/v1/nodes", n.Name, "proxy", "metrics").DoRaw(ctx)
		if err == nil {
			h, err = parseHistograms(bytes.NewReader(raw))
		}
		if err != nil {
			return nil, fmt.Errorf("kubelet metrics of %s: %w", n.Name, err)
		}
		sum.add(h, 1)
	}
	return sum, nil
}

// rolloutWatch records when each pod is first seen Ready with its IPs, and when each IP is first
// seen in a ready endpoint of the namespace's EndpointSlices, from start.
type rolloutWatch struct {
	rollout string // the value of the label rollout of the pods watched
	start   time.Time
	mu      sync.Mutex
	ready   map[string]time.Time      // pod name →
	ips     map[string][]corev1.PodIP // pod name → its IPs
	inSlice map[string]time.Time      // IP →
}

// watch starts watching the pods of rollout until ctx ends; the rollout starts when it returns.
func (bc *benchCluster) watch(ctx context.Context, rollout string) *rolloutWatch {
	w := &rolloutWatch{rollout: rollout, ready: map[string]time.Time{}, ips: map[string][]corev1.PodIP{}, inSlice: map[string]time.Time{}}
	record := func(obj any) {
		now := time.Now()
		w.mu.Lock()
		defer w.mu.Unlock()
		switch obj := obj.(type) {
		case *corev1.Pod:
			if _, seen := w.ready[obj.Name]; !seen && obj.Labels["rollout"] == w.rollout && len(obj.Status.PodIPs) > 0 && cluster.PodReady(obj) {
				w.ready[obj.Name], w.ips[obj.Name] = now, obj.Status.PodIPs
			}
		case *discoveryv1.EndpointSlice:
			for _, ep := range obj.Endpoints {
				for _, ip := range ep.Addresses {
					if _, seen := w.inSlice[ip]; !seen && (ep.Conditions.Ready == nil || *ep.Conditions.Ready) {
						w.inSlice[ip] = now
					}
				}
			}
		}
	}
	handler := cache.ResourceEventHandlerFuncs{AddFunc: record, UpdateFunc: func(_, obj any) { record(obj) }}
	factory := informers.NewSharedInformerFactoryWithOptions(bc.client, 0, informers.WithNamespace(clusterNamespace))
	// Handlers are added before the informers start: that cannot fail.
	_, _ = factory.Core().V1().Pods().Informer().AddEventHandler(handler)
	_, _ = factory.Discovery().V1().EndpointSlices().Informer().AddEventHandler(handler)
	factory.Start(ctx.Done())
	factory.WaitForCacheSync(ctx.Done())
	w.start = time.Now()
	return w
}

// wait waits until that many pods are Ready and every IP of theirs is in an EndpointSlice, and
// returns when each pod was Ready and when its last IP was in an EndpointSlice: the informers'
// times, not the polls'.
func (w *rolloutWatch) wait(ctx context.Context, pods int) (spans [][2]time.Time, err error) {
	err = stack.Poll(ctx, 10*time.Minute, 100*time.Millisecond, func() error {
		w.mu.Lock()
		defer w.mu.Unlock()
		spans = nil
		missing := 0
		for name, ready := range w.ready {
			last := ready
			for _, ip := range w.ips[name] {
				if t, seen := w.inSlice[ip.IP]; !seen {
					missing++
				} else if t.After(last) {
					last = t
				}
			}
			spans = append(spans, [2]time.Time{ready, last})
		}
		if len(w.ready) < pods || missing > 0 {
			return fmt.Errorf("%d of %d pods Ready, %d of their IPs not in the EndpointSlices", len(w.ready), pods, missing)
		}
		return nil
	})
	return spans, err
}
