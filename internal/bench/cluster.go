package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"strings"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/knext-dev/knext/internal/cluster"
	"github.com/knext-dev/knext/internal/ociimage"
	"github.com/knext-dev/knext/internal/stack"
)

// ClusterRun is one rollout of a Deployment of -cluster-pods pods on one cluster.
type ClusterRun struct {
	Runtime string `json:"runtime"`
	Round   int    `json:"round"`
	// From the Deployment's creation until a pod is seen Ready with its IPs.
	StartP50Ms float64 `json:"startP50Ms"`
	StartP99Ms float64 `json:"startP99Ms"`
	// From a pod seen Ready until its IPs are seen in a ready endpoint of the Service.
	EndpointP50Ms float64 `json:"endpointP50Ms"`
	EndpointP99Ms float64 `json:"endpointP99Ms"`
	// The nodes' own timers, per pod: the pod network's setup (containerd's CNI timer, or
	// nri-bridge's NRI RunPodSandbox), the kubelet's RunPodSandbox call.
	NetworkMs       float64 `json:"networkMs"`
	RunPodSandboxMs float64 `json:"runPodSandboxMs"`
	Timers          []Timer `json:"timers"`
}

const clusterNamespace = "bench"

// runCluster brings a two-node cluster of each runtime up, both at once, and rolls a Deployment
// out on each in turn, for -repeats rounds.
func runCluster(ctx context.Context, s settings, r *report) (err error) {
	var clusters []*benchCluster
	defer func() {
		for _, bc := range clusters {
			err = errors.Join(err, cluster.Down(bc.c.Dir, log.Printf))
		}
	}()
	for _, runtime := range []string{cluster.RuntimeKnext, cluster.RuntimeUpstream} {
		bc, err := newBenchCluster(ctx, runtime)
		if bc != nil {
			clusters = append(clusters, bc)
		}
		if err != nil {
			return fmt.Errorf("%s cluster: %w", runtime, err)
		}
	}
	for round := 1; round <= s.Repeats; round++ {
		for _, bc := range rotated(clusters, round) {
			run, err := bc.rollout(ctx, s.ClusterPods, round)
			if err != nil {
				return fmt.Errorf("%s cluster, round %d: %w", bc.runtime, round, err)
			}
			r.Cluster = append(r.Cluster, run)
		}
	}
	return nil
}

type benchCluster struct {
	runtime string
	c       *cluster.Cluster
	client  kubernetes.Interface
	image   string
}

// newBenchCluster brings the cluster up with the bench's namespace and a dual-stack Service.
func newBenchCluster(ctx context.Context, runtime string) (*benchCluster, error) {
	dir, err := os.MkdirTemp("", "knc-bench-")
	if err != nil {
		return nil, err
	}
	cfg, err := cluster.EnvConfig(dir, 2, runtime)
	if err != nil {
		return nil, errors.Join(err, os.RemoveAll(dir))
	}
	cfg.Logf = log.Printf
	c, err := cluster.Up(ctx, cfg)
	if c == nil {
		return nil, errors.Join(err, os.RemoveAll(dir))
	}
	bc := &benchCluster{runtime: runtime, c: c}
	if err != nil {
		return bc, err
	}
	if bc.client, err = c.Client(); err != nil {
		return bc, err
	}
	if bc.image, err = ociimage.ImageName(cfg.Images[3]); err != nil {
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
	return bc, err
}

// rollout creates the Deployment, measures it until every pod is Ready and in the Service's
// EndpointSlices, deletes it again and waits until its pods are gone.
func (bc *benchCluster) rollout(ctx context.Context, pods, round int) (*ClusterRun, error) {
	before, err := bc.timers(ctx)
	if err != nil {
		return nil, err
	}
	w := bc.watch()
	defer close(w.stop)
	labels := map[string]string{"app": "web"}
	spread := corev1.TopologySpreadConstraint{MaxSkew: 1, TopologyKey: corev1.LabelHostname,
		WhenUnsatisfiable: corev1.DoNotSchedule, LabelSelector: &metav1.LabelSelector{MatchLabels: labels}}
	deployment := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: "web"}, Spec: appsv1.DeploymentSpec{
		Replicas: new(int32(pods)), Selector: &metav1.LabelSelector{MatchLabels: labels},
		Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: corev1.PodSpec{
			TerminationGracePeriodSeconds: new(int64(0)), TopologySpreadConstraints: []corev1.TopologySpreadConstraint{spread},
			Containers: []corev1.Container{{Name: "web", Image: bc.image, Args: []string{"serve"}, ImagePullPolicy: corev1.PullIfNotPresent}},
		}},
	}}
	w.start = time.Now()
	if _, err := bc.client.AppsV1().Deployments(clusterNamespace).Create(ctx, deployment, metav1.CreateOptions{}); err != nil {
		return nil, err
	}
	starts, endpoints, err := w.wait(ctx, pods)
	if err != nil {
		return nil, err
	}
	after, err := bc.timers(ctx)
	if err != nil {
		return nil, err
	}
	run := &ClusterRun{Runtime: bc.runtime, Round: round, Timers: after.since(before),
		StartP50Ms: percentile(starts, 0.5), StartP99Ms: percentile(starts, 0.99),
		EndpointP50Ms: percentile(endpoints, 0.5), EndpointP99Ms: percentile(endpoints, 0.99)}
	for _, t := range run.Timers {
		switch {
		case t.Plugin == cniTimer && t.Operation == "set_up_pod",
			strings.HasSuffix(t.Plugin, "-"+stack.NRIBridgePlugin) && t.Operation == "RunPodSandbox": // <index>-<name>
			run.NetworkMs += t.MeanMs
		case t.Plugin == kubeletTimer && t.Operation == "run_podsandbox":
			run.RunPodSandboxMs = t.MeanMs
		}
	}
	log.Printf("bench: cluster %s round %d: pods Ready p50 %.0f ms, p99 %.0f ms; in the endpoints p50 %.0f ms after; network %.1f ms of RunPodSandbox %.1f ms",
		bc.runtime, round, run.StartP50Ms, run.StartP99Ms, run.EndpointP50Ms, run.NetworkMs, run.RunPodSandboxMs)
	if err := bc.client.AppsV1().Deployments(clusterNamespace).Delete(ctx, "web", metav1.DeleteOptions{}); err != nil {
		return nil, err
	}
	return run, stack.Poll(ctx, 5*time.Minute, time.Second, func() error {
		pods, err := bc.client.CoreV1().Pods(clusterNamespace).List(ctx, metav1.ListOptions{})
		if err == nil && len(pods.Items) > 0 {
			err = fmt.Errorf("%d pods of the Deployment left", len(pods.Items))
		}
		return err
	})
}

// timers reads the histograms of every node's containerd and kubelet, summed.
func (bc *benchCluster) timers(ctx context.Context) (timers, error) {
	sum := timers{}
	for _, n := range bc.c.Nodes {
		t, err := fetchTimers(ctx, fmt.Sprintf("http://%s:%d/v1/metrics", n.IPs[0], cluster.ContainerdMetricsPort))
		if err != nil {
			return nil, err
		}
		sum.add(t)
		raw, err := bc.client.CoreV1().RESTClient().Get().AbsPath("/api/v1/nodes", n.Name, "proxy", "metrics").DoRaw(ctx)
		if err == nil {
			t, err = parseTimers(bytes.NewReader(raw))
		}
		if err != nil {
			return nil, fmt.Errorf("kubelet metrics of %s: %w", n.Name, err)
		}
		sum.add(t)
	}
	return sum, nil
}

// rolloutWatch records when each pod is first seen Ready with its IPs, and when each IP is first
// seen in a ready endpoint of the namespace's EndpointSlices.
type rolloutWatch struct {
	start time.Time
	stop  chan struct{}

	mu      sync.Mutex
	ready   map[string]time.Time // pod name →
	ips     map[string][]string  // pod name → its IPs
	inSlice map[string]time.Time // IP →
}

func (bc *benchCluster) watch() *rolloutWatch {
	w := &rolloutWatch{stop: make(chan struct{}), ready: map[string]time.Time{}, ips: map[string][]string{}, inSlice: map[string]time.Time{}}
	record := func(obj any) {
		now := time.Now()
		w.mu.Lock()
		defer w.mu.Unlock()
		switch obj := obj.(type) {
		case *corev1.Pod:
			if _, seen := w.ready[obj.Name]; !seen && len(obj.Status.PodIPs) > 0 && cluster.PodReady(obj) {
				w.ready[obj.Name] = now
				for _, ip := range obj.Status.PodIPs {
					w.ips[obj.Name] = append(w.ips[obj.Name], ip.IP)
				}
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
	_, podErr := factory.Core().V1().Pods().Informer().AddEventHandler(handler)
	_, sliceErr := factory.Discovery().V1().EndpointSlices().Informer().AddEventHandler(handler)
	if err := errors.Join(podErr, sliceErr); err != nil {
		log.Printf("bench: cluster watch: %v", err)
	}
	factory.Start(w.stop)
	factory.WaitForCacheSync(w.stop)
	return w
}

// wait waits until that many pods are Ready and every IP of theirs is in an EndpointSlice, and
// returns each pod's start and endpoint propagation (Ready until its last IP is in an
// EndpointSlice) in ms: the informers' times, not the polls'.
func (w *rolloutWatch) wait(ctx context.Context, pods int) (starts, endpoints []float64, err error) {
	err = stack.Poll(ctx, 5*time.Minute, 100*time.Millisecond, func() error {
		w.mu.Lock()
		defer w.mu.Unlock()
		starts, endpoints = nil, nil
		missing := 0
		for name, ready := range w.ready {
			last := ready
			for _, ip := range w.ips[name] {
				if t, seen := w.inSlice[ip]; !seen {
					missing++
				} else if t.After(last) {
					last = t
				}
			}
			starts, endpoints = append(starts, msBetween(w.start, ready)), append(endpoints, msBetween(ready, last))
		}
		if len(w.ready) < pods || missing > 0 {
			return fmt.Errorf("%d of %d pods Ready, %d of their IPs not in the EndpointSlices", len(w.ready), pods, missing)
		}
		return nil
	})
	return starts, endpoints, err
}
