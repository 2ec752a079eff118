// Package bench is knext-bench (cmd/knext-bench): it measures what knext costs against upstream containerd on one machine
// (`make bench`), and writes docs/performance.md's tables and plots from its report
// (`knext-bench doc`, doc.go).
//
// Every configuration runs its own harness instance (internal/stack) with -pods running pods
// and is measured against upstream's instance with both daemons running, the measurement
// alternating between the two (pair.go): the machines these figures come from drift by tens of
// percent from one minute to the next, which only a paired measurement cancels out. The A/A
// configuration upstream-again, a second upstream instance, sizes what is left of that noise.
//
// The parts (-benchmarks): status (PodSandboxStatus, the raw round trip to a plugin, bursts,
// container events, RunPodSandbox during a status storm), lifecycle (pod start and removal, with
// containerd's own NRI and CNI timers), scale (many pods: status sweep, restart, bytes stored)
// and cluster (a Deployment on a two-node cluster of each runtime, cluster.go).
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
	Name    string        `json:"name"`
	Index   string        `json:"index"`
	Primary bool          `json:"primary"`           // reports the primary IP, else an additional one
	Delay   time.Duration `json:"delayNs,omitempty"` // spent on each answer
	// AtRunPodSandbox reports the IP in the RunPodSandbox answer, not subscribed to status (S10).
	AtRunPodSandbox bool   `json:"atRunPodSandbox,omitempty"`
	Prefix          string `json:"prefix"` // the /48 of the IPv6 addresses it reports
}

// configuration is one daemon setup; what it measures depends on the selected parts.
type configuration struct {
	Key         string         `json:"key"`
	Description string         `json:"description"`
	Upstream    bool           `json:"upstream,omitempty"` // the pristine upstream build
	CNILess     bool           `json:"cniLess,omitempty"`  // disable_cni; nri-bridge or Plugins are the network
	Plugins     []statusPlugin `json:"plugins,omitempty"`
	Status      bool           `json:"status,omitempty"`    // PodSandboxStatus
	Lifecycle   bool           `json:"lifecycle,omitempty"` // pod start and removal
	Storm       bool           `json:"storm,omitempty"`     // RunPodSandbox during a status storm
	Ping        bool           `json:"ping,omitempty"`      // the raw round trip to its plugin
}

func (c configuration) bridged() bool { return c.CNILess && len(c.Plugins) == 0 }

const (
	cfgUpstream      = "upstream"
	cfgKnext         = "knext"
	cfgOnePlugin     = "knext-1-plugin"
	cfgThreePlugins  = "knext-3-plugins"
	cfgSlowPlugin    = "knext-1-slow-plugin"
	cfgRunPlugin     = "knext-1-run-plugin"
	cfgCNILess       = "cniless"
	cfgCNILessPlugin = "cniless-status-plugin"
	cfgUpstreamAgain = "upstream-again"
)

// slowDelay is what the plugin of knext-1-slow-plugin spends on each answer.
const slowDelay = 50 * time.Millisecond

func configurations() []configuration {
	plugin := func(n int, primary bool) statusPlugin {
		return statusPlugin{Name: fmt.Sprintf("status-%d", n), Index: fmt.Sprint(9 + n), Primary: primary,
			Prefix: fmt.Sprintf("2001:db8:%d::", n)}
	}
	slow, atRun := plugin(1, true), plugin(1, true)
	slow.Name, slow.Delay = "slow-status-1", slowDelay
	atRun.Name, atRun.AtRunPodSandbox = "run-1", true
	return []configuration{
		{Key: cfgUpstream, Description: "upstream containerd v2.4.2 (pristine module), NRI enabled, CNI", Upstream: true},
		{Key: cfgKnext, Description: "knext, NRI enabled, no NRI plugin, CNI", Status: true, Lifecycle: true},
		{Key: cfgOnePlugin, Description: "knext + 1 status plugin answering from memory",
			Plugins: []statusPlugin{plugin(1, true)}, Status: true, Ping: true},
		{Key: cfgThreePlugins, Description: "knext + 3 status plugins (one owns the primary IP, two add one each)",
			Plugins: []statusPlugin{plugin(1, true), plugin(2, false), plugin(3, false)}, Status: true},
		{Key: cfgSlowPlugin, Description: fmt.Sprintf("knext + 1 status plugin taking %s per answer", slowDelay),
			Plugins: []statusPlugin{slow}, Status: true, Storm: true},
		{Key: cfgRunPlugin, Description: "knext + 1 plugin reporting its IP at RunPodSandbox, not subscribed to status",
			Plugins: []statusPlugin{atRun}, Status: true},
		{Key: cfgCNILess, Description: "knext without CNI (disable_cni), nri-bridge as the pod network", CNILess: true, Lifecycle: true},
		{Key: cfgCNILessPlugin, Description: "knext without CNI, a status plugin as the network (answers an IP, wires nothing)",
			CNILess: true, Plugins: []statusPlugin{plugin(1, true)}, Lifecycle: true},
		{Key: cfgUpstreamAgain, Description: "upstream again, an instance of its own: the A/A pair that sizes the noise",
			Upstream: true, Status: true, Lifecycle: true},
	}
}

// settings are the command line.
type settings struct {
	Benchmarks    string        `json:"benchmarks"`
	Configs       string        `json:"configs"`
	Repeats       int           `json:"repeats"`
	Pods          int           `json:"pods"`
	Duration      time.Duration `json:"durationNs"` // of each PodSandboxStatus measurement, per side
	LifecyclePods int           `json:"lifecyclePods"`
	ScalePods     int           `json:"scalePods"`
	ScaleRepeats  int           `json:"scaleRepeats"`
	ClusterPods   int           `json:"clusterPods"`
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
	flag.StringVar(&s.Benchmarks, "benchmarks", "status,lifecycle,scale,cluster", "parts to run: status, lifecycle, scale, cluster")
	flag.StringVar(&s.Configs, "configs", strings.Join(configKeys(configurations()), ","), "configurations, upstream first")
	flag.IntVar(&s.Repeats, "repeats", 5, "rounds over the configurations (and cluster rollouts)")
	flag.IntVar(&s.Pods, "pods", 50, "running pods of each configuration")
	flag.DurationVar(&s.Duration, "duration", 2*time.Second, "PodSandboxStatus measurement per variant and side")
	flag.IntVar(&s.LifecyclePods, "lifecycle-pods", 30, "pods started and removed per side, round and concurrency")
	flag.IntVar(&s.ScalePods, "scale-pods", 200, "pods of each scale configuration")
	flag.IntVar(&s.ScaleRepeats, "scale-repeats", 3, "restarts of each scale configuration")
	flag.IntVar(&s.ClusterPods, "cluster-pods", 40, "pods of the cluster part's Deployment")
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

func configKeys(configs []configuration) (keys []string) {
	for _, c := range configs {
		keys = append(keys, c.Key)
	}
	return keys
}

// check checks the settings and returns the configurations of -configs, upstream first.
func (s settings) check() ([]configuration, error) {
	parts := []string{"status", "lifecycle", "scale", "cluster"}
	if slices.ContainsFunc(strings.Split(s.Benchmarks, ","), func(part string) bool { return !slices.Contains(parts, part) }) {
		return nil, fmt.Errorf("-benchmarks %q: want any of %s", s.Benchmarks, strings.Join(parts, ", "))
	}
	if s.Pods < stormWidth || s.Repeats < 1 || s.Duration <= 0 || s.LifecyclePods < 1 || s.ScalePods < 1 || s.ScaleRepeats < 1 || s.ClusterPods < 1 {
		return nil, errors.New("-pods must be at least 16; -repeats, -duration and the other counts positive")
	}
	wanted := strings.Split(s.Configs, ",")
	selected := slices.DeleteFunc(configurations(), func(c configuration) bool { return !slices.Contains(wanted, c.Key) })
	if len(selected) != len(wanted) || selected[0].Key != cfgUpstream {
		return nil, fmt.Errorf("-configs %q: want upstream, every configuration is measured against it, and any of %s",
			s.Configs, strings.Join(configKeys(configurations()), ", "))
	}
	return selected, nil
}

func run(ctx context.Context, s settings) error {
	configs, err := s.check()
	if err != nil {
		return err
	}
	r := newReport(s, configs)
	log.Printf("bench: %s; configurations %s; %d rounds", s.Benchmarks, s.Configs, s.Repeats)
	runErr := runPairs(ctx, s, configs, r)
	if runErr == nil && s.selected("scale") {
		runErr = runScale(ctx, s, configs, r)
	}
	if runErr == nil && s.selected("cluster") {
		runErr = runCluster(ctx, s, r)
	}
	r.Finished = time.Now().UTC()
	if err := r.write(s.Out); err != nil {
		return errors.Join(runErr, err)
	}
	log.Printf("bench: report written to %s", s.Out)
	if runErr == nil {
		for _, t := range r.tables() {
			fmt.Println(t.markdown())
		}
	}
	return runErr
}

// runPairs measures each configuration against upstream, round after round, in a rotating order.
func runPairs(ctx context.Context, s settings, configs []configuration, r *report) error {
	measured := slices.DeleteFunc(slices.Clone(configs[1:]), func(c configuration) bool {
		return !(s.selected("status") && c.Status) && !(s.selected("lifecycle") && c.Lifecycle)
	})
	if len(measured) == 0 {
		return nil
	}
	return withInstances(ctx, s, slices.Concat(configs[:1], measured), s.Pods, func(instances []*instance) error {
		for round := 1; round <= s.Repeats; round++ {
			for _, in := range rotated(instances[1:], round) {
				run, err := runPair(ctx, instances[0], in, round)
				if err != nil {
					return fmt.Errorf("configuration %s, round %d: %w", in.c.Key, round, err)
				}
				r.Pairs = append(r.Pairs, run)
			}
		}
		return nil
	})
}
