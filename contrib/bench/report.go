package main

import (
	"bytes"
	"debug/buildinfo"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
)

// StatusSample is one PodSandboxStatus measurement.
type StatusSample struct {
	variant
	Calls                int        `json:"calls"`
	Errors               int        `json:"errors"`
	FirstError           string     `json:"firstError,omitempty"`
	Seconds              float64    `json:"seconds"`
	PerSecond            float64    `json:"perSecond"`
	P50Ms                float64    `json:"p50Ms"`
	P99Ms                float64    `json:"p99Ms"`
	PluginCalls          int64      `json:"pluginCalls"`          // PodSandboxStatus calls of all status plugins
	PluginCallsPerStatus float64    `json:"pluginCallsPerStatus"` // summed over plugins
	CPU                  CPUPerCall `json:"cpu"`
}

// BurstSample counts the plugin calls of bursts of simultaneous queries for one pod.
type BurstSample struct {
	Bursts                       int     `json:"bursts"`
	Width                        int     `json:"width"`
	PluginCalls                  int64   `json:"pluginCalls"`
	PluginCallsPerBurstPerPlugin float64 `json:"pluginCallsPerBurstPerPlugin"`
	Errors                       int     `json:"errors"`
}

// EventsSample counts the plugin calls of one container's lifecycle (create, start, stop, remove).
type EventsSample struct {
	Events          int   `json:"events"`          // CRI container events received for the container
	EventsWithPodIP int   `json:"eventsWithPodIP"` // of which carried a pod status with an IP
	PluginCalls     int64 `json:"pluginCalls"`
}

// StormSample is RunPodSandbox latency during a status storm.
type StormSample struct {
	Pods            int     `json:"pods"`
	RunP50Ms        float64 `json:"runP50Ms"`
	RunMaxMs        float64 `json:"runMaxMs"`
	StatusCalls     int     `json:"statusCalls"`
	StatusPerSecond float64 `json:"statusPerSecond"`
	StatusP50Ms     float64 `json:"statusP50Ms"`
	StatusErrors    int     `json:"statusErrors"`
	FirstError      string  `json:"firstError,omitempty"`
}

// Run is one configuration in one round.
type Run struct {
	Config       string            `json:"config"`
	Round        int               `json:"round"`
	Load         string            `json:"loadAverage"`  // when the run started
	StartSeconds float64           `json:"startSeconds"` // daemon start until CRI is ready
	Status       []StatusSample    `json:"status"`
	Ping         []PingSample      `json:"ping,omitempty"`
	Bursts       *BurstSample      `json:"bursts,omitempty"`
	Events       *EventsSample     `json:"events,omitempty"`
	Storm        *StormSample      `json:"storm,omitempty"`
	Lifecycle    []LifecycleSample `json:"lifecycle,omitempty"`
	CNI          *CNITrace         `json:"cni,omitempty"`
	// QuietWaits are the waits for a quiet machine before each timed phase.
	QuietWaits []QuietWait `json:"quietWaits"`
}

// PingSample is the raw ttrpc round trip to a status plugin process (package ping).
type PingSample struct {
	Concurrency int `json:"concurrency"`
	// Multiplexed is a round trip over NRI's multiplexer, as containerd reaches its plugins.
	Multiplexed bool `json:"multiplexed"`
	// IdleGapMs, when set, makes this a round trip after an idle gap that long before each call,
	// which each caller spent busy-waiting.
	IdleGapMs float64    `json:"idleGapMs,omitempty"`
	Calls     int        `json:"calls"`
	P50Ms     float64    `json:"p50Ms"`
	P99Ms     float64    `json:"p99Ms"`
	CPU       CPUPerCall `json:"cpu"` // the plugin's and the caller's (with its busy wait)
}

// roundTrip is one kind of the no-op calls made to (knext-1-plugin)'s plugin process.
type roundTrip struct {
	multiplexed bool // over NRI's multiplexer, as containerd reaches its plugins
	// idle: the plugin left idle before each call, as between (knext-1-plugin)'s queries at c1. A Go process
	// idle for a fraction of a millisecond answers later than one called back to back.
	idle bool
}

// roundTrips are the round trips measured, in this order; the first, plain and back to back, is
// the floor the overhead target subtracts, and gives the idle one its gap.
var roundTrips = []roundTrip{{}, {multiplexed: true}, {idle: true}}

func (rt roundTrip) String() string {
	name := "ttrpc"
	if rt.multiplexed {
		name += " over NRI's multiplexer"
	}
	if rt.idle {
		name += " after an idle gap"
	}
	return name
}

func (p PingSample) is(rt roundTrip) bool {
	return p.Multiplexed == rt.multiplexed && (p.IdleGapMs > 0) == rt.idle
}

// LifecycleSample is one pass of pod starts and removals at one concurrency.
type LifecycleSample struct {
	Concurrency       int       `json:"concurrency"`
	Pods              int       `json:"pods"`
	RunMs             []float64 `json:"runMs"`        // RunPodSandbox of each pod
	StopRemoveMs      []float64 `json:"stopRemoveMs"` // StopPodSandbox + RemovePodSandbox of each pod
	RunSeconds        float64   `json:"runSeconds"`   // wall time of the start phase
	StopRemoveSeconds float64   `json:"stopRemoveSeconds"`
	RunP50Ms          float64   `json:"runP50Ms"`
	RunP99Ms          float64   `json:"runP99Ms"`
	StopRemoveP50Ms   float64   `json:"stopRemoveP50Ms"`
	StopRemoveP99Ms   float64   `json:"stopRemoveP99Ms"`
	// Hooks are containerd's NRI plugin and CNI latencies during the pass (its metrics endpoint).
	Hooks []HookLatency `json:"hooks,omitempty"`
	// Bridge is nri-bridge's own account of the pass (its log), CNI-less configurations only.
	Bridge *BridgeTimings `json:"bridge,omitempty"`
}

// HookLatency is the mean latency of one NRI plugin's calls of one operation, or of CNI's setup
// or teardown of a pod (Plugin cniTimer), as containerd measured it (its latency histograms), in
// one phase of a lifecycle pass.
type HookLatency struct {
	Phase     string  `json:"phase"` // "run" or "stop+remove"
	Plugin    string  `json:"plugin"`
	Operation string  `json:"operation"`
	Calls     int     `json:"calls"`
	MeanMs    float64 `json:"meanMs"`
}

// step names the hook in the breakdown.
func (h HookLatency) step() string {
	if h.Plugin == cniTimer {
		return "CNI " + h.Operation + " per call, all plugins (containerd's timer)"
	}
	return "NRI " + h.Operation + " of " + h.Plugin
}

// BridgeTimings are the mean durations of nri-bridge's steps, from its log: storing the
// allocation (durably) and wiring the pod in RunPodSandbox; detaching the pod in StopPodSandbox,
// then deleting its veth (unwired) and releasing its addresses after the hook.
type BridgeTimings struct {
	Setups     int     `json:"setups"`
	Releases   int     `json:"releases"`
	StoredMs   float64 `json:"storedMs"`
	WiredMs    float64 `json:"wiredMs"`
	DetachedMs float64 `json:"detachedMs"`
	UnwiredMs  float64 `json:"unwiredMs"`
	ReleasedMs float64 `json:"releasedMs"`
	Error      string  `json:"error,omitempty"`
}

// CNITrace is a traced pass: every CNI plugin execution timed by cnitrace.
type CNITrace struct {
	Pods            int            `json:"pods"`
	Executions      []CNIExecution `json:"executions"`
	AddPerPodMs     float64        `json:"addPerPodMs"` // plugins containerd ran, per pod
	DelPerPodMs     float64        `json:"delPerPodMs"`
	RunP50Ms        float64        `json:"runP50Ms"` // of the traced pass, wrapper included
	StopRemoveP50Ms float64        `json:"stopRemoveP50Ms"`
}

// CNIExecution is one plugin's executions of one command in a traced pass.
type CNIExecution struct {
	Plugin  string  `json:"plugin"`
	Command string  `json:"command"`
	Nested  bool    `json:"nested"` // run by another plugin, whose time includes it
	Calls   int     `json:"calls"`
	MeanMs  float64 `json:"meanMs"`
}

// Spread is the min, median and max of a figure over the rounds.
type Spread struct {
	Min    float64 `json:"min"`
	Median float64 `json:"median"`
	Max    float64 `json:"max"`
	N      int     `json:"n"`
}

// spread returns nil for no values.
func spread(values []float64) *Spread {
	if len(values) == 0 {
		return nil
	}
	sorted := slices.Clone(values)
	slices.Sort(sorted)
	median := sorted[len(sorted)/2]
	if len(sorted)%2 == 0 {
		median = (sorted[len(sorted)/2-1] + median) / 2
	}
	return &Spread{Min: sorted[0], Median: median, Max: sorted[len(sorted)-1], N: len(sorted)}
}

// StatusSummary is one configuration's PodSandboxStatus figures in one variant, over the rounds.
type StatusSummary struct {
	Config               string  `json:"config"`
	Variant              string  `json:"variant"`
	P50Ms                *Spread `json:"p50Ms"`
	P99Ms                *Spread `json:"p99Ms"`
	PerSecond            *Spread `json:"perSecond"`
	PluginCallsPerStatus *Spread `json:"pluginCallsPerStatus"`
	P50RatioToA          *Spread `json:"p50RatioToA"` // per-round ratios
	P99RatioToA          *Spread `json:"p99RatioToA"`
	PerSecondRatioToA    *Spread `json:"perSecondRatioToA"`
}

// StormSummary is one configuration's RunPodSandbox figures during the storm, over the rounds.
type StormSummary struct {
	Config          string  `json:"config"`
	RunP50Ms        *Spread `json:"runP50Ms"`
	RunMaxMs        *Spread `json:"runMaxMs"`
	RunP50RatioToA  *Spread `json:"runP50RatioToA"`
	StatusPerSecond *Spread `json:"statusPerSecond"`
}

// Target is one figure's limit, judged on the Judged statistic of Measured.
type Target struct {
	Name     string  `json:"name"`
	Limit    float64 `json:"limit"`
	Judged   string  `json:"judged"` // "median" or "max" of Measured
	Measured *Spread `json:"measured,omitempty"`
	Status   string  `json:"status"` // met, missed, not measured
	Note     string  `json:"note,omitempty"`
}

type machine struct {
	CPU       string `json:"cpu"`
	CPUs      int    `json:"cpus"`
	Kernel    string `json:"kernel"`
	Memory    string `json:"memory"`
	Go        string `json:"go"`
	LoadStart string `json:"loadAverageStart"`
	LoadEnd   string `json:"loadAverageEnd"`
}

type report struct {
	Started        time.Time         `json:"started"`
	Finished       time.Time         `json:"finished"`
	Machine        machine           `json:"machine"`
	Settings       settings          `json:"settings"`
	Configurations []configuration   `json:"configurations"`
	Binaries       map[string]string `json:"binaries"` // --version of each daemon
	// DependencyDifferences lists modules linked at different versions into the upstream and knext
	// daemons, other than the patched trees: empty when only knext's patches differ.
	DependencyDifferences []string           `json:"dependencyDifferences"`
	Runs                  []*Run             `json:"runs"`
	Status                []StatusSummary    `json:"status"`
	Storm                 []StormSummary     `json:"storm"`
	Lifecycle             []LifecycleSummary `json:"lifecycle"`
	Steps                 []StepSummary      `json:"lifecycleSteps"`
	Overhead              []OverheadSummary  `json:"statusOverhead"`
	CPU                   []CPUSummary       `json:"cpuPerCall"`
	Scale                 []ScaleSample      `json:"scale"`
	ScaleSummaries        []ScaleSummary     `json:"scaleSummaries"`
	Persisted             []PersistedBytes   `json:"persistedPerPod"`
	Paired                []*PairedRun       `json:"paired"`
	PairedSummaries       []PairedSummary    `json:"pairedSummaries"`
	Cluster               []*ClusterRun      `json:"cluster"`
	ClusterSummaries      []ClusterSummary   `json:"clusterSummaries"`
	Targets               []Target           `json:"targets"`
}

func newReport(s settings, configs []configuration) *report {
	return &report{Started: time.Now().UTC(), Settings: s, Configurations: configs,
		Machine: machine{CPU: cpuModel(), CPUs: runtime.NumCPU(), Kernel: firstLine("/proc/sys/kernel/osrelease"),
			Memory: memTotal(), Go: runtime.Version(), LoadStart: loadAverage()}}
}

func (r *report) add(run *Run) { r.Runs = append(r.Runs, run) }

func (r *report) hasConfig(key string) bool {
	return slices.ContainsFunc(r.Configurations, func(c configuration) bool { return c.Key == key })
}

// finish summarizes the runs and judges the targets.
func (r *report) finish() {
	r.Finished = time.Now().UTC()
	r.Machine.LoadEnd = loadAverage()
	// Every run has the baseline (upstream), so both daemons.
	r.Binaries = map[string]string{"knext": version(r.Settings.Knext), "upstream": version(r.Settings.Upstream)}
	r.DependencyDifferences = dependencyDifferences(r.Settings.Upstream, r.Settings.Knext)
	sel := r.Settings.Selected
	r.ClusterSummaries = summarizeCluster(r.Cluster)
	if sel.Status {
		for _, v := range variants {
			for _, c := range r.Configurations {
				if c.Status {
					r.Status = append(r.Status, r.statusSummary(c.Key, v))
				}
			}
		}
		for _, c := range r.Configurations {
			if c.Storm {
				r.Storm = append(r.Storm, r.stormSummary(c.Key))
			}
		}
		r.Overhead = r.overheadSummaries()
		r.CPU = r.cpuSummaries()
		r.Targets = append(r.targets(), r.statusTargets12()...)
	}
	if sel.Lifecycle {
		for _, width := range lifecycleWidths {
			for _, c := range r.Configurations {
				if c.Lifecycle {
					r.Lifecycle = append(r.Lifecycle, r.lifecycleSummary(c.Key, width))
				}
			}
		}
		r.Steps = r.lifecycleSteps()
		r.Targets = append(r.Targets, r.lifecycleTargets()...)
	}
	if sel.Paired {
		r.PairedSummaries = r.pairedSummaries()
		r.Targets = append(r.Targets, r.pairedTargets()...)
	}
	r.ScaleSummaries = r.scaleSummaries()
}

// perRound returns metric of configuration key in every round that measured it.
func (r *report) perRound(key string, metric func(*Run) (float64, bool)) map[int]float64 {
	values := map[int]float64{}
	for _, run := range r.Runs {
		if run.Config != key {
			continue
		}
		if value, ok := metric(run); ok {
			values[run.Round] = value
		}
	}
	return values
}

func roundValues(m map[int]float64) []float64 {
	var values []float64
	for _, v := range m {
		values = append(values, v)
	}
	return values
}

// pairedRatios returns num/den of every round that has both, so that a slow round (other work on
// the machine) affects both sides of its ratio.
func pairedRatios(num, den map[int]float64) []float64 {
	var ratios []float64
	for round, n := range num {
		if d, ok := den[round]; ok && d > 0 {
			ratios = append(ratios, n/d)
		}
	}
	return ratios
}

func statusMetric(v variant, field func(StatusSample) float64) func(*Run) (float64, bool) {
	return func(run *Run) (float64, bool) {
		for _, s := range run.Status {
			if s.variant == v && s.Calls > 0 {
				return field(s), true
			}
		}
		return 0, false
	}
}

func p50(s StatusSample) float64       { return s.P50Ms }
func p99(s StatusSample) float64       { return s.P99Ms }
func perSecond(s StatusSample) float64 { return s.PerSecond }

func (r *report) statusSummary(key string, v variant) StatusSummary {
	get := func(field func(StatusSample) float64) map[int]float64 {
		return r.perRound(key, statusMetric(v, field))
	}
	return StatusSummary{Config: key, Variant: v.String(),
		P50Ms:                spread(roundValues(get(p50))),
		P99Ms:                spread(roundValues(get(p99))),
		PerSecond:            spread(roundValues(get(perSecond))),
		PluginCallsPerStatus: spread(roundValues(get(func(s StatusSample) float64 { return s.PluginCallsPerStatus }))),
		P50RatioToA:          spread(pairedRatios(get(p50), r.perRound(cfgUpstream, statusMetric(v, p50)))),
		P99RatioToA:          spread(pairedRatios(get(p99), r.perRound(cfgUpstream, statusMetric(v, p99)))),
		PerSecondRatioToA:    spread(pairedRatios(get(perSecond), r.perRound(cfgUpstream, statusMetric(v, perSecond)))),
	}
}

func stormMetric(field func(*StormSample) float64) func(*Run) (float64, bool) {
	return func(run *Run) (float64, bool) {
		if run.Storm == nil || run.Storm.Pods == 0 {
			return 0, false
		}
		return field(run.Storm), true
	}
}

func runP50(s *StormSample) float64 { return s.RunP50Ms }

func (r *report) stormSummary(key string) StormSummary {
	return StormSummary{Config: key,
		RunP50Ms:        spread(roundValues(r.perRound(key, stormMetric(runP50)))),
		RunMaxMs:        spread(roundValues(r.perRound(key, stormMetric(func(s *StormSample) float64 { return s.RunMaxMs })))),
		RunP50RatioToA:  spread(pairedRatios(r.perRound(key, stormMetric(runP50)), r.perRound(cfgUpstream, stormMetric(runP50)))),
		StatusPerSecond: spread(roundValues(r.perRound(key, stormMetric(func(s *StormSample) float64 { return s.StatusPerSecond })))),
	}
}

// judge fills in t's status from its measurement.
func judge(t Target, measured []float64, missing ...string) Target {
	var absent []string
	for _, key := range missing {
		if key != "" {
			absent = append(absent, key)
		}
	}
	t.Measured = spread(measured)
	switch {
	case len(absent) > 0:
		t.Status, t.Note = "not measured", "configuration "+strings.Join(absent, ", ")+" not run"
	case t.Measured == nil:
		t.Status = "not measured"
		if t.Note == "" {
			t.Note = "no run measured it"
		}
	default:
		value := t.Measured.Median
		if t.Judged == "max" {
			value = t.Measured.Max
		}
		t.Status = "missed"
		if value <= t.Limit {
			t.Status = "met"
		}
	}
	return t
}

// aaNote gives, for a target that compares a configuration with (upstream), the A/A ratios of the same
// metric: (upstream-again), a second upstream instance, to (upstream). "" when (upstream-again) did not run.
func (r *report) aaNote(metric func(*Run) (float64, bool)) string {
	aa := spread(pairedRatios(r.perRound(cfgUpstreamAgain, metric), r.perRound(cfgUpstream, metric)))
	if aa == nil {
		return ""
	}
	return fmt.Sprintf("A/A, (upstream-again) / (upstream): median %.3g [%.3g..%.3g]", aa.Median, aa.Min, aa.Max)
}

func (r *report) absent(keys ...string) []string {
	var absent []string
	for _, key := range keys {
		if !r.hasConfig(key) {
			absent = append(absent, "("+key+")")
		}
	}
	return absent
}

func (r *report) targets() []Target {
	var targets []Target
	ratio := func(num, den string, limit float64, v variant) Target {
		t := Target{Name: fmt.Sprintf("(%s) PodSandboxStatus p50 <= %.2f x (%s), %s", num, limit, den, v), Limit: limit, Judged: "median"}
		if den == cfgUpstream {
			t.Note = r.aaNote(statusMetric(v, p50))
		}
		return judge(t, pairedRatios(r.perRound(num, statusMetric(v, p50)), r.perRound(den, statusMetric(v, p50))), r.absent(num, den)...)
	}
	for _, pair := range []struct {
		num, den string
		limit    float64
	}{{cfgKnext, cfgUpstream, 1.05}, {cfgOnePlugin, cfgUpstream, 1.6}, {cfgThreePlugins, cfgOnePlugin, 1.2}} {
		for _, v := range variants {
			targets = append(targets, ratio(pair.num, pair.den, pair.limit, v))
		}
	}
	delayMs := float64(r.Settings.SlowDelay.Nanoseconds()) / 1e6
	for _, v := range variants {
		// "p50 ≈ delay + (knext-1-plugin)'s, not a multiple": judged as (knext-1-slow-plugin) / (delay + (knext-1-plugin)) <= 1.2, i.e. within a
		// fifth of the delay plus (knext-1-plugin)'s p50; serialized plugin calls give about the concurrency.
		t := Target{Name: fmt.Sprintf("(knext-1-slow-plugin) PodSandboxStatus p50 / (%s + (knext-1-plugin) p50) <= 1.2, %s", r.Settings.SlowDelay, v),
			Limit: 1.2, Judged: "median"}
		c := r.perRound(cfgOnePlugin, statusMetric(v, p50))
		for round, value := range c {
			c[round] = value + delayMs
		}
		targets = append(targets, judge(t, pairedRatios(r.perRound(cfgOneSlowPlugin, statusMetric(v, p50)), c), r.absent(cfgOnePlugin, cfgOneSlowPlugin)...))
	}
	if r.hasConfig(cfgThreeSlowPlugins) { // opt-in: judged only when run
		for _, v := range variants {
			targets = append(targets, ratio(cfgThreeSlowPlugins, cfgOneSlowPlugin, 1.2, v))
		}
	}
	storm := Target{Name: "(knext-1-slow-plugin) RunPodSandbox p50 during the 16-way status storm <= 1.2 x (upstream)'s", Limit: 1.2, Judged: "median"}
	stormRatios := pairedRatios(r.perRound(cfgOneSlowPlugin, stormMetric(runP50)), r.perRound(cfgUpstream, stormMetric(runP50)))
	targets = append(targets, judge(storm, stormRatios, r.absent(cfgUpstream, cfgOneSlowPlugin)...))

	// Internal callers: zero plugin calls in every run, and only where events did arrive (else
	// the check proves nothing).
	internal := Target{Name: "(knext-1-plugin)-(knext-1-slow-plugin) plugin calls caused by CRI container events (internal callers) = 0", Limit: 0, Judged: "max"}
	var calls []float64
	for _, run := range r.Runs {
		if run.Events == nil {
			continue
		}
		if run.Events.Events < 4 {
			internal.Note += fmt.Sprintf("(%s) round %d: only %d of 4 container events arrived, not counted. ",
				run.Config, run.Round, run.Events.Events)
			continue
		}
		calls = append(calls, float64(run.Events.PluginCalls))
	}
	var missing []string
	if !r.hasConfig(cfgOnePlugin) && !r.hasConfig(cfgThreePlugins) && !r.hasConfig(cfgOneSlowPlugin) {
		missing = []string{"(knext-1-plugin), (knext-3-plugins), (knext-1-slow-plugin)"}
	}
	internal = judge(internal, calls, missing...)
	internal.Note = strings.TrimSpace(internal.Note)
	targets = append(targets, internal)

	// Judged on the median round: on a loaded machine one of 16 "simultaneous" queries now and then
	// reaches the daemon after the shared round trip has ended, and makes a second one.
	burst := Target{Name: fmt.Sprintf("(knext-1-slow-plugin) plugin calls per burst of %d concurrent queries for one pod <= 1", stormWidth),
		Limit: 1, Judged: "median"}
	bursts := roundValues(r.perRound(cfgOneSlowPlugin, func(run *Run) (float64, bool) {
		if run.Bursts == nil {
			return 0, false
		}
		return run.Bursts.PluginCallsPerBurstPerPlugin, true
	}))
	targets = append(targets, judge(burst, bursts, r.absent(cfgOneSlowPlugin)...))
	return targets
}

// measurementErrors describes failed calls during the measurements ("" when there were none).
func (r *report) measurementErrors() string {
	var lines []string
	for _, run := range r.Runs {
		for _, s := range run.Status {
			if s.Errors > 0 {
				lines = append(lines, fmt.Sprintf("(%s) round %d %s: %d PodSandboxStatus errors, first: %s",
					run.Config, run.Round, s.variant, s.Errors, s.FirstError))
			}
		}
		if run.Bursts != nil && run.Bursts.Errors > 0 {
			lines = append(lines, fmt.Sprintf("(%s) round %d bursts: %d PodSandboxStatus errors", run.Config, run.Round, run.Bursts.Errors))
		}
		if run.Storm != nil && run.Storm.StatusErrors > 0 {
			lines = append(lines, fmt.Sprintf("(%s) round %d storm: %d PodSandboxStatus errors, first: %s",
				run.Config, run.Round, run.Storm.StatusErrors, run.Storm.FirstError))
		}
	}
	return strings.Join(lines, "\n")
}

func (r *report) write(path string) error {
	data, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return os.WriteFile(path, append(data, '\n'), 0o644)
}

// cell formats a spread as "median [min..max]" with format f.
func cell(s *Spread, f string) string {
	if s == nil {
		return "-"
	}
	if s.N == 1 {
		return fmt.Sprintf(f, s.Median)
	}
	return fmt.Sprintf(f+" ["+f+".."+f+"]", s.Median, s.Min, s.Max)
}

func (r *report) printTable(out io.Writer) {
	s := r.Settings
	fmt.Fprintf(out, "\nknext benchmark (%s), %s .. %s\n", s.Benchmarks, r.Started.Format(time.RFC3339), r.Finished.Format(time.RFC3339))
	fmt.Fprintf(out, "machine: %d x %s, %s, kernel %s, %s; load average %s at start, %s at end\n",
		r.Machine.CPUs, r.Machine.CPU, r.Machine.Memory, r.Machine.Kernel, r.Machine.Go, r.Machine.LoadStart, r.Machine.LoadEnd)
	for _, key := range []string{"upstream", "knext"} {
		fmt.Fprintf(out, "%-9s %s\n", key+":", r.Binaries[key])
	}
	if len(r.DependencyDifferences) == 0 {
		fmt.Fprintln(out, "dependencies: the same module versions in both daemons, except the patched containerd and nri")
	} else {
		fmt.Fprintf(out, "dependency versions differing between the daemons: %s\n", strings.Join(r.DependencyDifferences, ", "))
	}
	fmt.Fprintln(out, "configurations:")
	for _, c := range r.Configurations {
		fmt.Fprintf(out, "  (%s) %s\n", c.Key, c.Description)
	}
	fmt.Fprintf(out, "\nrunning pods: %d; rounds: %d, configurations alternating in a rotating order; "+
		"each PodSandboxStatus measurement: %s.\n", s.Pods, s.Repeats, s.Duration)
	fmt.Fprintln(out, "Cells: median [min..max] over the rounds; ratios are per-round ratios to (upstream), same statistics.")
	r.printQuietWaits(out)
	if s.Selected.Status {
		r.printStatus(out)
		r.printOverhead(out)
		r.printCPU(out)
	}
	r.printLifecycle(out)
	r.printPaired(out)
	r.printScale(out)
	if s.Selected.Cluster {
		r.printCluster(out)
	}
	if len(r.Targets) > 0 {
		fmt.Fprintln(out, "\nTargets:")
	}
	for _, t := range r.Targets {
		measured := "-"
		if t.Measured != nil {
			measured = t.Judged + " " + cell(t.Measured, "%.3g")
		}
		line := fmt.Sprintf("  %-12s %s: %s", strings.ToUpper(t.Status), t.Name, measured)
		if t.Note != "" {
			line += " (" + t.Note + ")"
		}
		fmt.Fprintln(out, line)
	}
}

// printQuietWaits says how long the timed phases waited for a quiet machine, and which of them
// started on a busy one.
func (r *report) printQuietWaits(out io.Writer) {
	var waits []float64
	var busy []string
	add := func(config string, round int, quietWaits []QuietWait) {
		for _, w := range quietWaits {
			waits = append(waits, w.Seconds)
			if !w.Quiet {
				busy = append(busy, fmt.Sprintf("(%s) round %d %s (last window %.0f%%)", config, round, w.Phase, 100*w.Busy))
			}
		}
	}
	for _, run := range r.Runs {
		add(run.Config, run.Round, run.QuietWaits)
	}
	for _, run := range r.Paired {
		add(run.Config, run.Round, run.QuietWaits)
	}
	if len(waits) == 0 {
		return
	}
	fmt.Fprintf(out, "Before each of the %d timed phases, a wait for a quiet machine (under %.0f%% of the CPUs busy in %d windows of %s in a row): %s s",
		len(waits), 100*quietBusy, quietWindows, quietWindow, cell(spread(waits), "%.2f"))
	if len(busy) == 0 {
		fmt.Fprintln(out, "; every phase started on a quiet machine.")
		return
	}
	fmt.Fprintf(out, "; not quiet within %s, measured anyway: %s.\n", quietLimit, strings.Join(busy, ", "))
}

func (r *report) printStatus(out io.Writer) {
	w := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "\nvariant\tcfg\tp50 ms\tp99 ms\tcalls/s\tp50 / (upstream)\tp99 / (upstream)\tcalls/s / (upstream)\tplugin calls per status\t")
	for _, st := range r.Status {
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", st.Variant, st.Config,
			cell(st.P50Ms, "%.3f"), cell(st.P99Ms, "%.3f"), cell(st.PerSecond, "%.0f"),
			cell(st.P50RatioToA, "%.2f"), cell(st.P99RatioToA, "%.2f"), cell(st.PerSecondRatioToA, "%.2f"),
			cell(st.PluginCallsPerStatus, "%.2f"))
	}
	w.Flush()

	if len(r.Storm) > 0 {
		fmt.Fprintf(out, "\nRunPodSandbox of %d new pods, one at a time, during a %d-way PodSandboxStatus storm:\n", r.Settings.StormPods, stormWidth)
		w = tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
		fmt.Fprintln(w, "cfg\tRunPodSandbox p50 ms\tmax ms\tp50 / (upstream)\tstatus calls/s during the storm\t")
		for _, st := range r.Storm {
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t\n", st.Config, cell(st.RunP50Ms, "%.1f"), cell(st.RunMaxMs, "%.1f"),
				cell(st.RunP50RatioToA, "%.2f"), cell(st.StatusPerSecond, "%.0f"))
		}
		w.Flush()
	}

	fmt.Fprintf(out, "\nPlugin calls outside PodSandboxStatus measurements (sum over a configuration's plugins):\n")
	w = tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "cfg\tround\tcontainer events (with pod IP)\tplugin calls for them\tplugin calls per burst and plugin\t")
	byConfig := slices.Clone(r.Runs)
	slices.SortStableFunc(byConfig, func(x, y *Run) int { return strings.Compare(x.Config, y.Config) })
	for _, run := range byConfig {
		if run.Events == nil || run.Bursts == nil {
			continue
		}
		fmt.Fprintf(w, "%s\t%d\t%d (%d)\t%d\t%.2f\t\n", run.Config, run.Round, run.Events.Events, run.Events.EventsWithPodIP,
			run.Events.PluginCalls, run.Bursts.PluginCallsPerBurstPerPlugin)
	}
	w.Flush()
}

// version returns a daemon's --version output.
func version(binary string) string {
	out, err := exec.Command(binary, "--version").Output()
	if err != nil {
		return fmt.Sprintf("%s (--version: %v)", binary, err)
	}
	return strings.TrimSpace(string(out))
}

// dependencyDifferences compares the modules linked into two daemons, except the trees knext
// patches (built from the workspace, so "(devel)" in knext's).
func dependencyDifferences(upstream, knext string) []string {
	modules := func(binary string) (map[string]string, error) {
		info, err := buildinfo.ReadFile(binary)
		if err != nil {
			return nil, err
		}
		m := map[string]string{}
		for _, dep := range info.Deps {
			m[dep.Path] = dep.Version
		}
		return m, nil
	}
	up, err := modules(upstream)
	if err != nil {
		return []string{fmt.Sprintf("cannot read %s: %v", upstream, err)}
	}
	kn, err := modules(knext)
	if err != nil {
		return []string{fmt.Sprintf("cannot read %s: %v", knext, err)}
	}
	patched := map[string]bool{"github.com/containerd/containerd/v2": true, "github.com/containerd/nri": true}
	diffs := []string{}
	for path := range mergeKeys(up, kn) {
		if !patched[path] && up[path] != kn[path] {
			diffs = append(diffs, fmt.Sprintf("%s upstream %q knext %q", path, up[path], kn[path]))
		}
	}
	slices.Sort(diffs)
	return diffs
}

func mergeKeys(a, b map[string]string) map[string]bool {
	keys := map[string]bool{}
	for k := range a {
		keys[k] = true
	}
	for k := range b {
		keys[k] = true
	}
	return keys
}

func cpuModel() string {
	data, _ := os.ReadFile("/proc/cpuinfo")
	for line := range strings.SplitSeq(string(data), "\n") {
		if name, ok := strings.CutPrefix(line, "model name"); ok {
			return strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(name), ":"))
		}
	}
	return "unknown CPU"
}

func memTotal() string {
	data, _ := os.ReadFile("/proc/meminfo")
	for line := range strings.SplitSeq(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, "MemTotal:"); ok {
			var kb int64
			fmt.Sscan(strings.TrimSpace(rest), &kb)
			return fmt.Sprintf("%.1f GiB RAM", float64(kb)/(1<<20))
		}
	}
	return "unknown RAM"
}

func firstLine(path string) string {
	data, _ := os.ReadFile(path)
	line, _, _ := bytes.Cut(data, []byte("\n"))
	return string(line)
}
