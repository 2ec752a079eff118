// Package bench is knext-bench (cmd/knext-bench): it measures what knext costs against upstream
// containerd on one node (`make bench`) and on a cluster of each runtime (`make bench-cluster`),
// and renders docs/performance.md from their reports (`knext-bench doc`, doc.go).
//
// Every comparison is paired and interleaved: the measurement alternates between the sides within
// each of -repeats rounds (pair.go, scale.go; cluster.go pauses the cluster not measured). Each
// paired measurement is a line in Go's benchmark format (results.go); benchmath summarizes them
// into a median ratio with its 95% interval, and an A/A pair (upstream against a second upstream)
// sizes what the method cannot resolve (tables.go). The load other processes put on the machine
// is recorded during every phase, and a round that saw too much is measured again (load.go).
package bench

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"
)

// statusPlugin is one process of internal/bench/statusplugin in a configuration.
type statusPlugin struct {
	Name    string `json:"name"`
	Index   string `json:"index"`
	Primary bool   `json:"primary"` // reports the primary IP, else an additional one
	// AtRunPodSandbox reports the IP in the RunPodSandbox answer, not subscribed to status (S10).
	AtRunPodSandbox bool   `json:"atRunPodSandbox,omitempty"`
	Prefix          string `json:"prefix"` // the /48 of the IPv6 addresses it reports
}

// configuration is one daemon setup of the single-node parts.
type configuration struct {
	Key      string         `json:"key"`
	Upstream bool           `json:"upstream,omitempty"` // the pristine upstream build
	CNILess  bool           `json:"cniLess,omitempty"`  // disable_cni; nri-bridge or Plugins are the network
	Plugins  []statusPlugin `json:"plugins,omitempty"`
}

func (c configuration) bridged() bool { return c.CNILess && len(c.Plugins) == 0 }

const (
	cfgUpstream      = "upstream"
	cfgKnext         = "knext"
	cfgOnePlugin     = "knext-1-plugin"
	cfgThreePlugins  = "knext-3-plugins"
	cfgRunPlugin     = "knext-1-run-plugin"
	cfgCNILess       = "cniless"
	cfgCNILessPlugin = "cniless-status-plugin"
	cfgUpstreamAgain = "upstream-again"
)

func configurations() []configuration {
	plugin := func(n int, primary bool) statusPlugin {
		return statusPlugin{Name: fmt.Sprintf("status-%d", n), Index: fmt.Sprint(9 + n), Primary: primary,
			Prefix: fmt.Sprintf("2001:db8:%d::", n)}
	}
	atRun := plugin(1, true)
	atRun.Name, atRun.AtRunPodSandbox = "run-1", true
	return []configuration{ // docs/performance.md describes them
		{Key: cfgUpstream, Upstream: true},
		{Key: cfgKnext},
		{Key: cfgOnePlugin, Plugins: []statusPlugin{plugin(1, true)}},
		{Key: cfgThreePlugins, Plugins: []statusPlugin{plugin(1, true), plugin(2, false), plugin(3, false)}},
		{Key: cfgRunPlugin, Plugins: []statusPlugin{atRun}},
		{Key: cfgCNILess, CNILess: true},
		{Key: cfgCNILessPlugin, CNILess: true, Plugins: []statusPlugin{plugin(1, true)}}, // answers an IP, wires nothing
		{Key: cfgUpstreamAgain, Upstream: true},
	}
}

// pairing is a configuration measured against a base in the status and lifecycle parts.
type pairing struct{ base, config string }

var (
	statusPairs = []pairing{{cfgUpstream, cfgKnext}, {cfgUpstream, cfgOnePlugin}, {cfgUpstream, cfgThreePlugins},
		{cfgUpstream, cfgRunPlugin}, {cfgUpstream, cfgUpstreamAgain}}
	// CNI-less against the floor: a status plugin that answers an IP and wires nothing.
	lifecyclePairs = []pairing{{cfgUpstream, cfgKnext}, {cfgUpstream, cfgCNILess}, {cfgUpstream, cfgUpstreamAgain},
		{cfgCNILessPlugin, cfgCNILess}}
)

// settings are the command line.
type settings struct {
	Benchmarks    string        `json:"benchmarks"`
	Repeats       int           `json:"repeats"`
	Pods          int           `json:"pods"`
	Duration      time.Duration `json:"durationNs"` // of each PodSandboxStatus variant, per side and round
	LifecyclePods int           `json:"lifecyclePods"`
	ScalePods     int           `json:"scalePods"`
	ClusterNodes  int           `json:"clusterNodes"`
	ClusterPods   int           `json:"clusterPods"`
	NodePods      int           `json:"nodePods"`
	MaxLoad       float64       `json:"maxLoad"`
	MaxRedos      int           `json:"maxRedos"`
	QuietWait     time.Duration `json:"quietWaitNs"`
	Knext         string        `json:"knext"`
	Upstream      string        `json:"upstream"`
	Plugin        string        `json:"plugin"`
	Bridge        string        `json:"nriBridge"`
	Out           string        `json:"-"`
}

// selected tells whether -benchmarks names part.
func (s settings) selected(part string) bool {
	return slices.Contains(strings.Split(s.Benchmarks, ","), part)
}

// Main runs knext-bench with the command line of the process.
func Main() {
	if len(os.Args) > 1 && os.Args[1] == "doc" {
		if err := docMain(os.Args[2:]); err != nil {
			log.Fatal(err)
		}
		return
	}
	var s settings
	flag.StringVar(&s.Benchmarks, "benchmarks", "status,lifecycle,scale", "parts to run: status, lifecycle, scale, cluster")
	flag.IntVar(&s.Repeats, "repeats", 6, "rounds of every part (6 is the fewest with a 95% interval of a median)")
	flag.IntVar(&s.Pods, "pods", 20, "running pods of each single-node configuration")
	flag.DurationVar(&s.Duration, "duration", time.Second, "PodSandboxStatus per variant, side and round")
	flag.IntVar(&s.LifecyclePods, "lifecycle-pods", 8, "pods started and removed per side, round and concurrency")
	flag.IntVar(&s.ScalePods, "scale-pods", 110, "pods of each scale configuration")
	flag.IntVar(&s.ClusterNodes, "cluster-nodes", 3, "nodes of each cluster")
	flag.IntVar(&s.ClusterPods, "cluster-pods", 100, "pods of the cluster part's Deployment")
	flag.IntVar(&s.NodePods, "node-pods", 110, "pods one node is filled to (the kubelet's default maximum)")
	flag.Float64Var(&s.MaxLoad, "max-load", 0.25, "share of the CPUs other processes may use during a phase before its round is redone")
	flag.IntVar(&s.MaxRedos, "max-redos", 2, "times a round is redone, after which it is kept and counted as loaded")
	flag.DurationVar(&s.QuietWait, "quiet-wait", 20*time.Second, "longest wait for a quiet machine before a phase")
	flag.StringVar(&s.Knext, "knext", "build/bin/containerd", "knext's containerd (make build)")
	flag.StringVar(&s.Upstream, "upstream", "", "upstream containerd (make upstream), its shim next to it")
	flag.StringVar(&s.Plugin, "plugin", "build/bench/statusplugin", "the status plugin (internal/bench/statusplugin)")
	flag.StringVar(&s.Bridge, "nri-bridge", "build/bin/nri-bridge", "nri-bridge (make build)")
	flag.StringVar(&s.Out, "out", "build/bench/report.json", "the JSON report")
	flag.Parse()
	log.SetFlags(log.Ltime | log.Lmicroseconds)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, s); err != nil {
		log.Fatal(err)
	}
}

func run(ctx context.Context, s settings) error {
	parts := []string{"status", "lifecycle", "scale", "cluster"}
	if slices.ContainsFunc(strings.Split(s.Benchmarks, ","), func(part string) bool { return !slices.Contains(parts, part) }) {
		return fmt.Errorf("-benchmarks %q: want any of %s", s.Benchmarks, strings.Join(parts, ", "))
	}
	if s.Pods < stormWidth || s.Repeats < 1 || s.Duration <= 0 || s.LifecyclePods < 8 || s.ScalePods < 1 ||
		s.ClusterNodes < 1 || s.ClusterPods < s.ClusterNodes || s.NodePods < s.ClusterPods/s.ClusterNodes+2 || s.MaxRedos < 0 {
		return errors.New("-pods must be at least 16, -lifecycle-pods 8, -node-pods more than a node's share of " +
			"-cluster-pods; -repeats, -duration and the other counts positive")
	}
	r, err := newReport(s)
	if err != nil {
		return err
	}
	log.Printf("bench: %s; %d rounds", s.Benchmarks, s.Repeats)
	runErr := runPairs(ctx, s, r)
	if runErr == nil && s.selected("scale") {
		runErr = runScale(ctx, s, r)
	}
	if runErr == nil && s.selected("cluster") {
		runErr = runCluster(ctx, s, r)
	}
	r.Finished = time.Now().UTC()
	if err := r.write(s.Out); err != nil {
		return errors.Join(runErr, err)
	}
	log.Printf("bench: report written to %s", s.Out)
	if runErr != nil {
		return runErr
	}
	measured, err := parseSamples(r.Results)
	if err != nil {
		return err
	}
	for _, t := range measured.tables(s) {
		fmt.Println(t.markdown())
	}
	return nil
}
