package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"os"
	"slices"
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

	"github.com/knext-dev/knext/contrib/cluster"
	"github.com/knext-dev/knext/internal/harness"
	"github.com/knext-dev/knext/internal/harness/testimages"
)

// ClusterRun is one rollout of a Deployment of -cluster-pods pods on one cluster: from its
// creation to every pod Ready with its IPs in the API, each pod's IPs in the Service's
// EndpointSlices, and where the pods' start went by the nodes' own timers.
type ClusterRun struct {
	Runtime string `json:"runtime"`
	Round   int    `json:"round"`
	Pods    int    `json:"pods"`
	// Pod start: the Deployment's creation until the pod is seen Ready with its IPs.
	StartP50Ms float64 `json:"startP50Ms"`
	StartP99Ms float64 `json:"startP99Ms"`
	TotalMs    float64 `json:"totalMs"` // until the last pod
	// Endpoint propagation: the pod seen Ready until its IPs are seen in a ready endpoint.
	EndpointP50Ms float64 `json:"endpointP50Ms"`
	EndpointP99Ms float64 `json:"endpointP99Ms"`
	// Per pod, means of the nodes' own timers: the pod network's setup (containerd's CNI timer, or
	// the network plugin's NRI RunPodSandbox), the kubelet's RunPodSandbox call and its pod start SLI.
	NetworkMs       float64       `json:"networkMs"`
	RunPodSandboxMs float64       `json:"runPodSandboxMs"`
	PodStartSLIMs   float64       `json:"podStartSLIMs"`
	Timers          []HookLatency `json:"timers"`
}

// clusterNamespace holds the benchmark's Deployment and Service.
const clusterNamespace = "bench"

// runCluster brings up a two-node cluster of each runtime, both at once, and rolls a Deployment out
// on them in turn, in a rotating order, for -repeats rounds.
func runCluster(ctx context.Context, s settings, report *report) (err error) {
	var clusters []*benchCluster
	defer func() {
		for _, bc := range clusters {
			err = errors.Join(err, cluster.Down(bc.c.Dir, log.Printf))
		}
	}()
	for runtime := range strings.SplitSeq(s.ClusterRuntimes, ",") {
		bc, err := newBenchCluster(ctx, runtime)
		if bc != nil {
			clusters = append(clusters, bc)
		}
		if err != nil {
			return fmt.Errorf("%s cluster: %w", runtime, err)
		}
	}
	for r := range s.Repeats {
		order := slices.Clone(clusters)
		if r%2 == 1 {
			slices.Reverse(order)
		}
		for _, bc := range order {
			run, err := bc.rollout(ctx, s.ClusterPods, r+1)
			if err != nil {
				return fmt.Errorf("%s cluster, round %d: %w", bc.runtime, r+1, err)
			}
			report.Cluster = append(report.Cluster, run)
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

func newBenchCluster(ctx context.Context, runtime string) (*benchCluster, error) {
	dir, err := os.MkdirTemp("", "knc-bench-")
	if err != nil {
		return nil, err
	}
	cfg, err := cluster.EnvConfig(dir, 2, runtime)
	if err != nil {
		return nil, err
	}
	cfg.Logf = log.Printf
	c, err := cluster.Up(ctx, cfg)
	if err != nil {
		if c == nil {
			os.RemoveAll(dir)
			return nil, err
		}
		return &benchCluster{runtime: runtime, c: c}, err
	}
	bc := &benchCluster{runtime: runtime, c: c}
	if bc.client, err = c.Client(); err != nil {
		return bc, err
	}
	if bc.image, err = testimages.ImageName(cfg.Images[3]); err != nil {
		return bc, err
	}
	if _, err := bc.client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: clusterNamespace}}, metav1.CreateOptions{}); err != nil {
		return bc, err
	}
	dualStack := corev1.IPFamilyPolicyRequireDualStack
	_, err = bc.client.CoreV1().Services(clusterNamespace).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"app": "web"}, IPFamilyPolicy: &dualStack,
			Ports: []corev1.ServicePort{{Port: 80, TargetPort: intstr.FromInt32(8080)}}},
	}, metav1.CreateOptions{})
	return bc, err
}

// rollout creates the Deployment, measures it, and deletes it again.
func (bc *benchCluster) rollout(ctx context.Context, pods, round int) (*ClusterRun, error) {
	run := &ClusterRun{Runtime: bc.runtime, Round: round, Pods: pods}
	before, err := bc.timers(ctx)
	if err != nil {
		return nil, err
	}
	w := bc.watch()
	defer close(w.stop)
	replicas := int32(pods)
	labels := map[string]string{"app": "web"}
	grace := int64(0)
	deployment := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec: appsv1.DeploymentSpec{
			Replicas: &replicas,
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					TerminationGracePeriodSeconds: &grace,
					TopologySpreadConstraints: []corev1.TopologySpreadConstraint{{MaxSkew: 1, TopologyKey: corev1.LabelHostname,
						WhenUnsatisfiable: corev1.DoNotSchedule, LabelSelector: &metav1.LabelSelector{MatchLabels: labels}}},
					Containers: []corev1.Container{{Name: "web", Image: bc.image, Args: []string{"serve"},
						ImagePullPolicy: corev1.PullIfNotPresent}},
				},
			},
		},
	}
	w.start = time.Now()
	if _, err := bc.client.AppsV1().Deployments(clusterNamespace).Create(ctx, deployment, metav1.CreateOptions{}); err != nil {
		return nil, err
	}
	if err := w.wait(ctx, pods, 5*time.Minute); err != nil {
		return nil, err
	}
	starts, endpoints := w.figures()
	run.StartP50Ms, run.StartP99Ms = percentileMs(starts, 0.5), percentileMs(starts, 0.99)
	run.TotalMs = ms(slices.Max(starts))
	run.EndpointP50Ms, run.EndpointP99Ms = percentileMs(endpoints, 0.5), percentileMs(endpoints, 0.99)
	after, err := bc.timers(ctx)
	if err != nil {
		return nil, err
	}
	run.Timers = after.since(before)
	for _, t := range run.Timers {
		switch {
		// The NRI name of a plugin is <index>-<name>.
		case t.Plugin == cniTimer && t.Operation == "set_up_pod",
			strings.HasSuffix(t.Plugin, "-"+harness.NRIBridgePlugin) && t.Operation == "RunPodSandbox":
			run.NetworkMs += t.MeanMs
		case t.Plugin == kubeletTimer && t.Operation == "run_podsandbox":
			run.RunPodSandboxMs = t.MeanMs
		case t.Plugin == kubeletTimer && t.Operation == "pod_start":
			run.PodStartSLIMs = t.MeanMs
		}
	}
	log.Printf("bench: cluster %s round %d: %d pods Ready p50 %.0f ms p99 %.0f ms, all %.0f ms; endpoint after Ready p50 %.0f ms p99 %.0f ms; network %.1f ms of RunPodSandbox %.1f ms",
		bc.runtime, round, pods, run.StartP50Ms, run.StartP99Ms, run.TotalMs, run.EndpointP50Ms, run.EndpointP99Ms, run.NetworkMs, run.RunPodSandboxMs)
	return run, bc.remove(ctx)
}

// remove deletes the Deployment and waits until its pods are gone.
func (bc *benchCluster) remove(ctx context.Context) error {
	if err := bc.client.AppsV1().Deployments(clusterNamespace).Delete(ctx, "web", metav1.DeleteOptions{}); err != nil {
		return err
	}
	deadline := time.Now().Add(5 * time.Minute)
	for {
		pods, err := bc.client.CoreV1().Pods(clusterNamespace).List(ctx, metav1.ListOptions{})
		if err == nil && len(pods.Items) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("pods of the Deployment not gone after 5m (%v)", err)
		}
		time.Sleep(time.Second)
	}
}

// timers reads the pod-start histograms of every node's containerd and kubelet, summed.
func (bc *benchCluster) timers(ctx context.Context) (latencies, error) {
	sum := latencies{}
	add := func(l latencies) {
		for k, t := range l {
			s := sum[k]
			s.count += t.count
			s.seconds += t.seconds
			sum[k] = s
		}
	}
	for _, n := range bc.c.Nodes {
		l, err := fetchLatencies(ctx, fmt.Sprintf("%s:%d", n.IPs[0], cluster.ContainerdMetricsPort))
		if err != nil {
			return nil, err
		}
		add(l)
		raw, err := bc.client.CoreV1().RESTClient().Get().AbsPath("/api/v1/nodes", n.Name, "proxy", "metrics").DoRaw(ctx)
		if err != nil {
			return nil, fmt.Errorf("kubelet metrics of %s: %w", n.Name, err)
		}
		if l, err = parseLatencies(strings.NewReader(string(raw))); err != nil {
			return nil, fmt.Errorf("kubelet metrics of %s: %w", n.Name, err)
		}
		add(l)
	}
	return sum, nil
}

// rolloutWatch records when each pod of the namespace is first seen Ready with its IPs, and when
// each IP is first seen in a ready endpoint of the namespace's EndpointSlices.
type rolloutWatch struct {
	start time.Time
	stop  chan struct{}

	mu      sync.Mutex
	ready   map[string]time.Time // pod name →
	ips     map[string][]string  // pod name → its IPs
	inSlice map[string]time.Time // IP →
	changed chan struct{}
}

func (bc *benchCluster) watch() *rolloutWatch {
	w := &rolloutWatch{stop: make(chan struct{}), ready: map[string]time.Time{}, ips: map[string][]string{},
		inSlice: map[string]time.Time{}, changed: make(chan struct{}, 1)}
	factory := informers.NewSharedInformerFactoryWithOptions(bc.client, 0, informers.WithNamespace(clusterNamespace))
	onPod := func(obj any) {
		pod, ok := obj.(*corev1.Pod)
		if !ok || len(pod.Status.PodIPs) == 0 || !cluster.PodReady(pod) {
			return
		}
		w.mu.Lock()
		if _, seen := w.ready[pod.Name]; !seen {
			w.ready[pod.Name] = time.Now()
			for _, ip := range pod.Status.PodIPs {
				w.ips[pod.Name] = append(w.ips[pod.Name], ip.IP)
			}
		}
		w.mu.Unlock()
		w.notify()
	}
	onSlice := func(obj any) {
		slice, ok := obj.(*discoveryv1.EndpointSlice)
		if !ok {
			return
		}
		now := time.Now()
		w.mu.Lock()
		for _, ep := range slice.Endpoints {
			if ep.Conditions.Ready != nil && !*ep.Conditions.Ready {
				continue
			}
			for _, ip := range ep.Addresses {
				if _, seen := w.inSlice[ip]; !seen {
					w.inSlice[ip] = now
				}
			}
		}
		w.mu.Unlock()
		w.notify()
	}
	factory.Core().V1().Pods().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: onPod, UpdateFunc: func(_, obj any) { onPod(obj) }})
	factory.Discovery().V1().EndpointSlices().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: onSlice, UpdateFunc: func(_, obj any) { onSlice(obj) }})
	factory.Start(w.stop)
	factory.WaitForCacheSync(w.stop)
	return w
}

func (w *rolloutWatch) notify() {
	select {
	case w.changed <- struct{}{}:
	default:
	}
}

// wait returns once `pods` pods are Ready and every IP of theirs is in an EndpointSlice.
func (w *rolloutWatch) wait(ctx context.Context, pods int, timeout time.Duration) error {
	deadline := time.After(timeout)
	for {
		w.mu.Lock()
		done := len(w.ready) >= pods
		for _, ips := range w.ips {
			for _, ip := range ips {
				_, seen := w.inSlice[ip]
				done = done && seen
			}
		}
		readyCount := len(w.ready)
		w.mu.Unlock()
		if done {
			return nil
		}
		select {
		case <-w.changed:
		case <-time.After(time.Second):
		case <-deadline:
			return fmt.Errorf("after %s: %d of %d pods Ready, not every IP in the EndpointSlices", timeout, readyCount, pods)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// figures returns each pod's start (creation of the Deployment until Ready with IPs) and each
// pod's endpoint propagation (Ready until its last IP is in an EndpointSlice).
func (w *rolloutWatch) figures() (starts, endpoints []time.Duration) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for name, ready := range w.ready {
		starts = append(starts, ready.Sub(w.start))
		var last time.Time
		for _, ip := range w.ips[name] {
			if t := w.inSlice[ip]; t.After(last) {
				last = t
			}
		}
		endpoints = append(endpoints, max(0, last.Sub(ready)))
	}
	return starts, endpoints
}

// ClusterSummary is one runtime's cluster figures over the rounds, and their per-round ratios to
// the baseline's.
type ClusterSummary struct {
	Runtime       string  `json:"runtime"`
	StartP50Ms    *Spread `json:"startP50Ms"`
	StartP99Ms    *Spread `json:"startP99Ms"`
	TotalMs       *Spread `json:"totalMs"`
	EndpointP50Ms *Spread `json:"endpointP50Ms"`
	EndpointP99Ms *Spread `json:"endpointP99Ms"`
	NetworkShare  *Spread `json:"networkShareOfRunPodSandbox"`
	NetworkMs     *Spread `json:"networkMs"`
	// Ratios to upstream of the same round (knext only).
	StartP50Ratio    *Spread `json:"startP50Ratio,omitempty"`
	TotalRatio       *Spread `json:"totalRatio,omitempty"`
	EndpointP50Ratio *Spread `json:"endpointP50Ratio,omitempty"`
}

func summarizeCluster(runs []*ClusterRun) []ClusterSummary {
	byRound := map[string]map[int]*ClusterRun{}
	for _, r := range runs {
		if byRound[r.Runtime] == nil {
			byRound[r.Runtime] = map[int]*ClusterRun{}
		}
		byRound[r.Runtime][r.Round] = r
	}
	var summaries []ClusterSummary
	for _, runtime := range []string{cluster.RuntimeKnext, cluster.RuntimeUpstream} {
		rounds := byRound[runtime]
		if len(rounds) == 0 {
			continue
		}
		values := func(f func(*ClusterRun) float64) *Spread {
			var v []float64
			for _, r := range rounds {
				v = append(v, f(r))
			}
			return spread(v)
		}
		ratio := func(f func(*ClusterRun) float64) *Spread {
			if runtime == cluster.RuntimeUpstream {
				return nil
			}
			var v []float64
			for round, r := range rounds {
				if base := byRound[cluster.RuntimeUpstream][round]; base != nil && f(base) > 0 {
					v = append(v, f(r)/f(base))
				}
			}
			return spread(v)
		}
		startP50 := func(r *ClusterRun) float64 { return r.StartP50Ms }
		total := func(r *ClusterRun) float64 { return r.TotalMs }
		endpointP50 := func(r *ClusterRun) float64 { return r.EndpointP50Ms }
		summaries = append(summaries, ClusterSummary{
			Runtime:       runtime,
			StartP50Ms:    values(startP50),
			StartP99Ms:    values(func(r *ClusterRun) float64 { return r.StartP99Ms }),
			TotalMs:       values(total),
			EndpointP50Ms: values(endpointP50),
			EndpointP99Ms: values(func(r *ClusterRun) float64 { return r.EndpointP99Ms }),
			NetworkMs:     values(func(r *ClusterRun) float64 { return r.NetworkMs }),
			NetworkShare: values(func(r *ClusterRun) float64 {
				if r.RunPodSandboxMs == 0 {
					return 0
				}
				return r.NetworkMs / r.RunPodSandboxMs
			}),
			StartP50Ratio: ratio(startP50), TotalRatio: ratio(total), EndpointP50Ratio: ratio(endpointP50),
		})
	}
	return summaries
}

func (r *report) printCluster(out io.Writer) {
	fmt.Fprintf(out, "\ncluster: a Deployment of %d pods over 2 nodes, knext CNI-less (nri-bridge) and upstream + CNI, alternating; median [min..max] over %d rounds\n",
		r.Settings.ClusterPods, r.Settings.Repeats)
	cell := func(s *Spread, unit string) string {
		if s == nil {
			return "-"
		}
		return fmt.Sprintf("%.0f%s [%.0f..%.0f]", s.Median, unit, s.Min, s.Max)
	}
	ratio := func(s *Spread) string {
		if s == nil {
			return "-"
		}
		return fmt.Sprintf("%.2fx [%.2f..%.2f]", s.Median, s.Min, s.Max)
	}
	for _, s := range r.ClusterSummaries {
		fmt.Fprintf(out, "  %-8s pod Ready with IPs: p50 %s, p99 %s, all %s; endpoint after Ready: p50 %s, p99 %s\n",
			s.Runtime, cell(s.StartP50Ms, " ms"), cell(s.StartP99Ms, " ms"), cell(s.TotalMs, " ms"), cell(s.EndpointP50Ms, " ms"), cell(s.EndpointP99Ms, " ms"))
		share := "-"
		if s.NetworkShare != nil {
			share = fmt.Sprintf("%.0f%% [%.0f..%.0f]", 100*s.NetworkShare.Median, 100*s.NetworkShare.Min, 100*s.NetworkShare.Max)
		}
		fmt.Fprintf(out, "  %-8s network setup per pod %s = %s of the kubelet's RunPodSandbox\n", "", cell(s.NetworkMs, " ms"), share)
		if s.StartP50Ratio != nil {
			fmt.Fprintf(out, "  %-8s to upstream: pod start p50 %s, all pods %s, endpoint p50 %s (target <= 1.0x)\n", "",
				ratio(s.StartP50Ratio), ratio(s.TotalRatio), ratio(s.EndpointP50Ratio))
		}
	}
}
