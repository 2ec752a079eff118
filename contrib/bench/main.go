// Command bench measures what knext costs against upstream containerd, in one run on one machine
// (`make bench`; docs/performance.md): PodSandboxStatus (docs/design.md S3, S4, S8, C2,
// C7), pod starts and removals with CNI and CNI-less, the status query beyond the raw round
// trip to its plugin, and restarts and status sweeps with many pods.
//
// Every configuration has its own harness instance (internal/harness) with N running pods,
// set up once; the daemon of a configuration runs only while it is measured, with the plugins it
// needs. Every instance has the same generated configuration: a CNI network of bridge,
// host-local, portmap and loopback, NRI enabled, a metrics endpoint.
//
//	upstream                 containerd built from the pristine module (`make upstream`)
//	knext                    knext, NRI enabled, no NRI plugin
//	knext-1-plugin           knext + one status plugin (contrib/bench/statusplugin) answering from memory
//	knext-3-plugins          knext + three such plugins
//	knext-1-slow-plugin      knext + one status plugin taking -slow-delay per answer
//	knext-1-run-plugin       knext + one plugin that reports its IP in its RunPodSandbox answer and
//	                         is not subscribed to PodSandboxStatus: status queries ask nobody
//	knext-3-slow-plugins     (opt-in) knext + three status plugins taking -slow-delay per answer
//	cniless                  knext CNI-less (disable_cni) with nri-bridge as the pod network
//	cniless-status-plugin    knext CNI-less with one status plugin as the pod network: it answers an
//	                         IP and wires nothing, so what containerd itself spends on a CNI-less pod
//	                         shows apart from nri-bridge's
//	cniless-baseline-bridge  (opt-in) cniless with the nri-bridge binary of -baseline-nri-bridge
//	upstream-again           upstream again, an instance of its own: the A/A check that sizes what
//	                         this machine varies between two instances of the same build (its
//	                         ratios to upstream are noise only)
//
// -benchmarks selects the parts:
//
//   - status (upstream, the knext configurations with CNI, upstream-again): PodSandboxStatus latency (p50, p99) and throughput over the CRI socket at
//     concurrency 1 and 16, verbose off and on, and the plugin calls per PodSandboxStatus; with
//     status plugins, the plugin calls caused by internal callers (CRI container events) and by
//     bursts of concurrent queries for one pod; for upstream and knext-1-slow-plugin, RunPodSandbox
//     latency during a 16-way status storm; for knext-1-plugin, a no-op ttrpc round trip to its plugin process (package ping):
//     back to back, over NRI's multiplexer and, at c1, after an idle gap.
//   - lifecycle (upstream, knext, the cniless ones, upstream-again): RunPodSandbox, then StopPodSandbox + RemovePodSandbox, of
//     -lifecycle-pods new pods at concurrency 1 and 8, with where the time goes: NRI plugin
//     and CNI latencies (containerd's metrics), nri-bridge's steps (its log), CNI plugin
//     executions (a traced pass through contrib/bench/cnitrace).
//   - paired (knext, cniless and upstream-again against upstream, in every round after the
//     configurations): both daemons run at once and the lifecycle (and for knext and
//     upstream-again the status) measurement alternates between them
//     (paired.go), so that the machine's drift over minutes, which the rounds see, cancels out.
//   - scale (upstream, knext-1-plugin, cniless, after the rounds, on instances of their own with -scale-pods pods):
//     a status sweep of every pod, a daemon restart until every pod answers again, and the bytes
//     persisted per pod.
//   - cluster (after the others): a real two-node cluster of each runtime (package cluster), knext
//     CNI-less with nri-bridge and upstream containerd with CNI, both up at once; in each round a
//     Deployment of -cluster-pods pods on each in turn, from its creation to every pod Ready with
//     its IPs in the API and in the Service's EndpointSlices, with the pod network's share of
//     RunPodSandbox from the nodes' containerd and kubelet histograms.
//
// Configurations alternate, in a rotating order, for -repeats rounds; the report gives the
// min/median/max of the rounds and ratios to upstream from the same round (JSON fields
// *RatioToA), checks the targets, prints a table and writes a JSON report.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"
)

// statusPlugin is one status plugin process of a configuration.
type statusPlugin struct {
	Name    string        `json:"name"`  // the plugin's name; NRI knows it as Index-Name
	Index   string        `json:"index"` // NRI plugin index
	Primary bool          `json:"primary"`
	Delay   time.Duration `json:"delayNs,omitempty"` // spent on each answer
	// AtRunPodSandbox reports the IP in the RunPodSandbox answer, with no status subscription.
	AtRunPodSandbox bool   `json:"atRunPodSandbox,omitempty"`
	Prefix          string `json:"prefix"` // IPv6 prefix of the IPs it reports (a /48)
}

// configuration is one of the benchmark's daemon setups.
type configuration struct {
	Key         string         `json:"key"`
	Description string         `json:"description"`
	Upstream    bool           `json:"upstream"` // runs the pristine upstream build
	Plugins     []statusPlugin `json:"plugins"`
	Status      bool           `json:"status"`    // measures PodSandboxStatus
	Storm       bool           `json:"storm"`     // measures RunPodSandbox during a status storm
	Lifecycle   bool           `json:"lifecycle"` // measures pod starts and removals
	Ping        bool           `json:"ping"`      // measures the raw round trip to its status plugin
	// CNILess runs with disable_cni: nri-bridge is the pod network, or, with Plugins, the status
	// plugins are (they answer IPs and wire nothing); else the CNI network.
	CNILess bool `json:"cniLess"`
	// BaselineBridge runs the nri-bridge binary of -baseline-nri-bridge instead of -nri-bridge.
	BaselineBridge bool `json:"baselineBridge,omitempty"`
	// Paired is measured against (upstream) with both daemons running, alternating (paired.go): its
	// pod lifecycle, and PodSandboxStatus if Status.
	Paired bool `json:"paired,omitempty"`
}

// bridged tells whether nri-bridge is the configuration's pod network.
func (c configuration) bridged() bool { return c.CNILess && len(c.Plugins) == 0 }

// podsNeedPlugins tells whether the configuration's plugins must run when its pods are created:
// they are its pod network, or they report the pods' IPs at RunPodSandbox only.
func (c configuration) podsNeedPlugins() bool {
	return c.CNILess || slices.ContainsFunc(c.Plugins, func(p statusPlugin) bool { return p.AtRunPodSandbox })
}

// The configurations' keys: what each runs (configurations describes them).
const (
	cfgUpstream            = "upstream"
	cfgKnext               = "knext"
	cfgOnePlugin           = "knext-1-plugin"
	cfgThreePlugins        = "knext-3-plugins"
	cfgOneSlowPlugin       = "knext-1-slow-plugin"
	cfgOneRunPlugin        = "knext-1-run-plugin"
	cfgThreeSlowPlugins    = "knext-3-slow-plugins"
	cfgCNILess             = "cniless"
	cfgCNILessStatusPlugin = "cniless-status-plugin"
	cfgCNILessBaseline     = "cniless-baseline-bridge"
	cfgUpstreamAgain       = "upstream-again"
)

// defaultConfigurations are the keys -configs selects by default: all but the opt-in ones.
func defaultConfigurations() []string {
	return []string{cfgUpstream, cfgKnext, cfgOnePlugin, cfgThreePlugins, cfgOneSlowPlugin, cfgOneRunPlugin, cfgCNILess, cfgCNILessStatusPlugin, cfgUpstreamAgain}
}

func configurations(slowDelay time.Duration) []configuration {
	fast := func(n int, primary bool) statusPlugin {
		return statusPlugin{Name: fmt.Sprintf("status-%d", n), Index: fmt.Sprintf("%d", 9+n), Primary: primary,
			Prefix: fmt.Sprintf("2001:db8:%d::", n)}
	}
	slow := func(n int, primary bool) statusPlugin {
		p := fast(n, primary)
		p.Name, p.Delay = fmt.Sprintf("slow-status-%d", n), slowDelay
		return p
	}
	runReporting := func(p statusPlugin) statusPlugin {
		p.Name, p.AtRunPodSandbox = "run"+strings.TrimPrefix(p.Name, "status"), true
		return p
	}
	return []configuration{
		{Key: cfgUpstream, Description: "upstream containerd (pristine module), NRI enabled, CNI", Upstream: true,
			Status: true, Storm: true, Lifecycle: true},
		{Key: cfgKnext, Description: "knext, NRI enabled, no NRI plugin, CNI", Status: true, Lifecycle: true, Paired: true},
		{Key: cfgOnePlugin, Description: "knext + 1 status plugin answering from memory", Plugins: []statusPlugin{fast(1, true)},
			Status: true, Ping: true},
		{Key: cfgThreePlugins, Description: "knext + 3 status plugins answering from memory",
			Plugins: []statusPlugin{fast(1, true), fast(2, false), fast(3, false)}, Status: true},
		{Key: cfgOneSlowPlugin, Description: fmt.Sprintf("knext + 1 status plugin taking %s per answer", slowDelay),
			Plugins: []statusPlugin{slow(1, true)}, Status: true, Storm: true},
		// A plugin reporting at RunPodSandbox is never asked again (S10): its status queries
		// should cost what (knext)'s do, paired with upstream to see it within a percent.
		{Key: cfgOneRunPlugin, Description: "knext + 1 plugin reporting its IP at RunPodSandbox, not subscribed to status",
			Plugins: []statusPlugin{runReporting(fast(1, true))}, Status: true, Paired: true},
		// Opt-in: shows whether plugins are asked concurrently (S3) without the
		// CPU contention that three fast plugins cause on a small machine.
		{Key: cfgThreeSlowPlugins, Description: fmt.Sprintf("knext + 3 status plugins taking %s per answer", slowDelay),
			Plugins: []statusPlugin{slow(1, true), slow(2, false), slow(3, false)}, Status: true},
		{Key: cfgCNILess, Description: "knext CNI-less (disable_cni) + nri-bridge", Lifecycle: true, CNILess: true, Paired: true},
		// (cniless) without nri-bridge's work. What containerd itself spends on a
		// CNI-less pod (NRI hooks, the seed status query) shows apart from the plugin's.
		{Key: cfgCNILessStatusPlugin, Description: "knext CNI-less + 1 status plugin as the pod network (answers an IP, wires nothing)",
			Plugins: []statusPlugin{fast(1, true)}, Lifecycle: true, CNILess: true},
		// A second upstream instance. Its ratios to (upstream) show how far two
		// identical daemons drift apart on this machine, the yardstick for (knext)'s 1.02.
		{Key: cfgUpstreamAgain, Description: "upstream containerd again, an instance of its own (A/A: noise of the machine)", Upstream: true,
			Status: true, Lifecycle: true, Paired: true},
		// Opt-in: (cniless) with another build of nri-bridge, e.g. an older one, in the same rounds.
		{Key: cfgCNILessBaseline, Description: "knext CNI-less + the nri-bridge of -baseline-nri-bridge", Lifecycle: true, CNILess: true,
			BaselineBridge: true},
	}
}

// benchmarks are the parts of the run -benchmarks selects.
type benchmarks struct {
	Status    bool `json:"status"`    // PodSandboxStatus, with the raw round trip
	Lifecycle bool `json:"lifecycle"` // pod starts and removals
	Scale     bool `json:"scale"`     // restart and status sweep with many pods
	// Paired measures knext, cniless and upstream-again against upstream with both daemons running.
	Paired bool `json:"paired"`
	// Cluster rolls a Deployment out on a real cluster of each runtime (cluster.go).
	Cluster bool `json:"cluster"`
}

func parseBenchmarks(list string) (benchmarks, error) {
	var b benchmarks
	for name := range strings.SplitSeq(list, ",") {
		switch strings.TrimSpace(name) {
		case "status":
			b.Status = true
		case "lifecycle":
			b.Lifecycle = true
		case "scale":
			b.Scale = true
		case "paired":
			b.Paired = true
		case "cluster":
			b.Cluster = true
		default:
			return b, fmt.Errorf("-benchmarks: unknown benchmark %q (known: status, lifecycle, paired, scale, cluster)", name)
		}
	}
	return b, nil
}

// measuresAlone tells whether configuration c is measured on its own in the selected rounds.
func (b benchmarks) measuresAlone(c configuration) bool {
	return (b.Status && c.Status) || (b.Lifecycle && c.Lifecycle)
}

// measures tells whether configuration c has anything to measure in the selected rounds: on its
// own, or paired (a is the other side of every pair).
func (b benchmarks) measures(c configuration) bool {
	return b.measuresAlone(c) || (b.Paired && (c.Paired || c.Key == cfgUpstream))
}

// settings are the command line.
type settings struct {
	Pods       int           `json:"pods"`
	Duration   time.Duration `json:"durationNs"` // of each latency measurement
	Repeats    int           `json:"repeats"`
	StormPods  int           `json:"stormPods"` // pods created during each storm
	Bursts     int           `json:"bursts"`
	SlowDelay  time.Duration `json:"slowDelayNs"`
	Configs    string        `json:"configs"`
	Upstream   string        `json:"upstream"`
	Knext      string        `json:"knext"`
	Plugin     string        `json:"plugin"`
	Out        string        `json:"-"`
	LogLevel   string        `json:"logLevel"`
	NRITimeout time.Duration `json:"nriRequestTimeoutNs"`
	Profile    string        `json:"profile,omitempty"` // directory of daemon CPU profiles

	Benchmarks    string     `json:"benchmarks"`
	Selected      benchmarks `json:"-"`
	LifecyclePods int        `json:"lifecyclePods"` // pods started and removed per round and concurrency
	CNITracePods  int        `json:"cniTracePods"`  // pods of the traced CNI pass per round
	ScalePods     int        `json:"scalePods"`
	ScaleRepeats  int        `json:"scaleRepeats"`
	Bridge        string     `json:"bridge"` // nri-bridge binary
	BaseBridge    string     `json:"baselineBridge,omitempty"`
	CNITrace      string     `json:"cniTrace"` // cnitrace binary
	CNIBinDir     string     `json:"cniBinDir"`
	ClusterPods   int        `json:"clusterPods"`
	// ClusterRuntimes are the clusters of the cluster part: knext, upstream or both.
	ClusterRuntimes string `json:"clusterRuntimes"`
}

func main() {
	var s settings
	flag.IntVar(&s.Pods, "pods", 50, "running pods during every measurement")
	flag.DurationVar(&s.Duration, "duration", 2*time.Second, "length of each PodSandboxStatus measurement")
	flag.IntVar(&s.Repeats, "repeats", 5, "rounds over all configurations")
	flag.IntVar(&s.StormPods, "storm-pods", 10, "pods created (one at a time) during each status storm")
	flag.IntVar(&s.Bursts, "bursts", 20, "bursts of 16 concurrent queries for one pod")
	flag.DurationVar(&s.SlowDelay, "slow-delay", 50*time.Millisecond, "answer time of the slow plugins of "+cfgOneSlowPlugin+" and "+cfgThreeSlowPlugins)
	flag.StringVar(&s.Configs, "configs", strings.Join(defaultConfigurations(), ","),
		"configurations to run, comma-separated: "+cfgUpstream+" (the baseline of every ratio) and any of the others (opt-in: "+
			cfgThreeSlowPlugins+", "+cfgCNILessBaseline+")")
	flag.StringVar(&s.Upstream, "upstream", binaryIn("KNEXT_UPSTREAM_BIN_DIR", "containerd"),
		"upstream containerd binary (make upstream; default from $KNEXT_UPSTREAM_BIN_DIR); its shim must be next to it")
	flag.StringVar(&s.Knext, "knext", binaryIn("KNEXT_BIN_DIR", "containerd"),
		"knext containerd binary (make build; default from $KNEXT_BIN_DIR); its shim must be next to it")
	flag.StringVar(&s.Plugin, "plugin", "", "status plugin binary (contrib/bench/statusplugin)")
	flag.StringVar(&s.Bridge, "nri-bridge", binaryIn("KNEXT_BIN_DIR", "nri-bridge"), "nri-bridge binary (make build), the network of configuration "+cfgCNILess)
	flag.StringVar(&s.BaseBridge, "baseline-nri-bridge", "", "another nri-bridge binary, for the opt-in configuration "+cfgCNILessBaseline)
	flag.StringVar(&s.CNITrace, "cnitrace", "", "CNI plugin timing wrapper (contrib/bench/cnitrace); without it, no CNI breakdown")
	flag.StringVar(&s.CNIBinDir, "cni-bin-dir", "/usr/lib/cni", "the real CNI plugins (bridge, host-local, loopback, portmap)")
	flag.StringVar(&s.Benchmarks, "benchmarks", "status,lifecycle,paired,scale,cluster", "parts to run, comma-separated: status, lifecycle, paired, scale, cluster")
	flag.IntVar(&s.ClusterPods, "cluster-pods", 40, "pods of the cluster part's Deployment")
	flag.StringVar(&s.ClusterRuntimes, "cluster-runtimes", "knext,upstream", "the cluster part's clusters, comma-separated: knext, upstream")
	flag.IntVar(&s.LifecyclePods, "lifecycle-pods", 30, "pods started and removed per configuration, round and concurrency")
	flag.IntVar(&s.CNITracePods, "cni-trace-pods", 10, "pods of the traced CNI pass per round of "+cfgUpstream+" and "+cfgKnext+" (0: none)")
	flag.IntVar(&s.ScalePods, "scale-pods", 200, "pods of each configuration in the scale measurements")
	flag.IntVar(&s.ScaleRepeats, "scale-repeats", 3, "daemon restarts per configuration in the scale measurements")
	flag.StringVar(&s.Out, "out", "build/bench/report.json", "JSON report")
	flag.StringVar(&s.LogLevel, "log-level", "info", "containerd log level (upstream's default)")
	flag.DurationVar(&s.NRITimeout, "nri-request-timeout", 2*time.Second, "NRI plugin_request_timeout")
	flag.StringVar(&s.Profile, "profile", "", "directory to write the daemon's CPU profile of every PodSandboxStatus measurement to "+
		"(<config>-round<n>-<variant>.pprof; profiling perturbs the figures)")
	flag.Parse()
	log.SetFlags(log.Ltime | log.Lmicroseconds)

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, s); err != nil {
		log.Fatal(err)
	}
}

func run(ctx context.Context, s settings) error {
	configs, err := selectConfigurations(configurations(s.SlowDelay), s.Configs)
	if err != nil {
		return err
	}
	if s.Selected, err = parseBenchmarks(s.Benchmarks); err != nil {
		return err
	}
	if err := s.check(configs); err != nil {
		return err
	}
	report := newReport(s, configs)
	log.Printf("bench: %s; %d pods, configurations %s, %d rounds, %s per measurement", s.Benchmarks, s.Pods, s.Configs, s.Repeats, s.Duration)

	runErr := runRounds(ctx, s, configs, report)
	if runErr == nil && s.Selected.Scale {
		runErr = runScale(ctx, s, configs, report)
	}
	if runErr == nil && s.Selected.Cluster {
		runErr = runCluster(ctx, s, report)
	}
	report.finish()
	if runErr == nil {
		report.printTable(os.Stdout)
		if failed := report.measurementErrors(); failed != "" {
			runErr = errors.New(failed)
		}
	}
	if err := report.write(s.Out); err != nil {
		return errors.Join(runErr, err)
	}
	log.Printf("bench: report written to %s", s.Out)
	return runErr
}

// runRounds sets up every configuration's instance, then runs the configurations round after
// round, and removes the instances.
func runRounds(ctx context.Context, s settings, configs []configuration, report *report) (err error) {
	var instances []*instance
	defer func() {
		for _, in := range instances {
			err = errors.Join(err, in.close())
		}
	}()
	for _, c := range configs {
		if !s.Selected.measures(c) {
			continue
		}
		in, err := newInstance(ctx, s, c, s.Pods)
		if in != nil {
			instances = append(instances, in)
		}
		if err != nil {
			return err
		}
	}
	for r := range s.Repeats {
		for _, in := range rotate(instances, r) {
			if !s.Selected.measuresAlone(in.c) {
				continue
			}
			run, err := in.run(ctx, r+1)
			if err != nil {
				return fmt.Errorf("configuration %s, round %d: %w", in.c.Key, r+1, err)
			}
			report.add(run)
		}
		if !s.Selected.Paired {
			continue
		}
		for _, in := range rotate(instances, r) {
			if !in.c.Paired {
				continue
			}
			// instances[0] is a: the configurations are in canonical order, a first and measured.
			paired, err := runPaired(ctx, instances[0], in, r+1)
			if err != nil {
				return fmt.Errorf("configuration %s paired with %s, round %d: %w", in.c.Key, cfgUpstream, r+1, err)
			}
			report.Paired = append(report.Paired, paired)
		}
	}
	return nil
}

// maxPodsPerInstance is what an instance's /24 holds with room to spare.
const maxPodsPerInstance = 250

func (s settings) check(configs []configuration) error {
	if s.Pods < 16 || s.Pods > 200 {
		return fmt.Errorf("-pods %d: want 16..200 (concurrency 16 needs distinct pods; the CNI subnet is a /24)", s.Pods)
	}
	if extra := max(s.StormPods, s.LifecyclePods, s.CNITracePods); s.Pods+extra > maxPodsPerInstance {
		return fmt.Errorf("-pods %d + %d (-storm-pods, -lifecycle-pods or -cni-trace-pods) exceed the /24 of an instance", s.Pods, extra)
	}
	if s.ScalePods < 1 || s.ScalePods > maxPodsPerInstance {
		return fmt.Errorf("-scale-pods %d: want 1..%d (the subnet of an instance is a /24)", s.ScalePods, maxPodsPerInstance)
	}
	if s.Repeats < 1 || s.Duration <= 0 || s.Bursts < 1 || s.StormPods < 1 || s.LifecyclePods < 1 || s.ScaleRepeats < 1 || s.CNITracePods < 0 {
		return errors.New("-repeats, -duration, -bursts, -storm-pods, -lifecycle-pods and -scale-repeats must be positive, -cni-trace-pods not negative")
	}
	var errs []error
	if s.Knext == "" {
		errs = append(errs, errors.New("-knext is not set (`make build` builds it)"))
	}
	for _, c := range configs {
		if c.Upstream && s.Upstream == "" {
			errs = append(errs, fmt.Errorf("configuration %s needs -upstream (`make upstream` builds it)", c.Key))
		}
		if len(c.Plugins) > 0 && s.Plugin == "" {
			errs = append(errs, fmt.Errorf("configuration %s needs -plugin (go build ./contrib/bench/statusplugin)", c.Key))
		}
		if c.bridged() && s.Bridge == "" {
			errs = append(errs, fmt.Errorf("configuration %s needs -nri-bridge (`make build` builds it)", c.Key))
		}
		if c.BaselineBridge && s.BaseBridge == "" {
			errs = append(errs, fmt.Errorf("configuration %s needs -baseline-nri-bridge", c.Key))
		}
	}
	for _, path := range []string{s.Knext, s.Upstream, s.Plugin, s.Bridge, s.BaseBridge, s.CNITrace} {
		if path == "" {
			continue
		}
		if _, err := os.Stat(path); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// binaryIn returns the path of binary name in the directory environment variable dir names, or ""
// when it is not set.
func binaryIn(dir, name string) string {
	if d := os.Getenv(dir); d != "" {
		return filepath.Join(d, name)
	}
	return ""
}

// selectConfigurations returns the configurations named in list, in the canonical order; the
// baseline upstream must be one of them.
func selectConfigurations(all []configuration, list string) ([]configuration, error) {
	wanted := map[string]bool{}
	for key := range strings.SplitSeq(list, ",") {
		wanted[strings.TrimSpace(key)] = true
	}
	var selected []configuration
	for _, c := range all {
		if wanted[c.Key] {
			selected = append(selected, c)
			delete(wanted, c.Key)
		}
	}
	for key := range wanted {
		var known []string
		for _, c := range all {
			known = append(known, c.Key)
		}
		return nil, fmt.Errorf("-configs: unknown configuration %q (known: %s)", key, strings.Join(known, ", "))
	}
	if len(selected) == 0 || selected[0].Key != cfgUpstream {
		return nil, fmt.Errorf("-configs must include %s: every ratio is to it", cfgUpstream)
	}
	return selected, nil
}

// rotate returns the order of round r: the instances rotated left by r, so that no configuration
// always follows the same one.
func rotate(instances []*instance, r int) []*instance {
	if len(instances) == 0 {
		return nil
	}
	k := r % len(instances)
	return append(append([]*instance{}, instances[k:]...), instances[:k]...)
}
