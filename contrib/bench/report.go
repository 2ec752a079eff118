package main

import (
	"debug/buildinfo"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/procfs"
)

// report is the bench's JSON report: the machine, the settings and every raw measurement. The
// page's tables and plots are computed from it (tables, doc.go).
type report struct {
	Started        time.Time         `json:"started"`
	Finished       time.Time         `json:"finished"`
	Machine        machine           `json:"machine"`
	Settings       settings          `json:"settings"`
	Configurations []configuration   `json:"configurations"`
	Binaries       map[string]string `json:"binaries"` // --version of each daemon
	// DependencyDifferences are the modules linked at other versions into the two daemons than
	// the patched ones: none, when the daemons differ by knext's patches only.
	DependencyDifferences []string         `json:"dependencyDifferences"`
	Pairs                 []*PairRun       `json:"pairs"`
	Scale                 []ScaleSample    `json:"scale"`
	Persisted             []PersistedBytes `json:"persistedPerPod"`
	Cluster               []*ClusterRun    `json:"cluster"`
}

type machine struct {
	CPU    string `json:"cpu"`
	CPUs   int    `json:"cpus"`
	Kernel string `json:"kernel"`
	Memory string `json:"memory"`
	Go     string `json:"go"`
	Load   string `json:"loadAverageAtStart"`
}

func newReport(s settings, configs []configuration) *report {
	m := machine{CPUs: runtime.NumCPU(), Go: runtime.Version()}
	if fs, err := procfs.NewDefaultFS(); err == nil {
		if cpus, err := fs.CPUInfo(); err == nil && len(cpus) > 0 {
			m.CPU = cpus[0].ModelName
		}
		if mem, err := fs.Meminfo(); err == nil && mem.MemTotal != nil {
			m.Memory = fmt.Sprintf("%.1f GiB", float64(*mem.MemTotal)/(1<<20))
		}
		if load, err := fs.LoadAvg(); err == nil {
			m.Load = fmt.Sprintf("%.2f %.2f %.2f", load.Load1, load.Load5, load.Load15)
		}
	}
	if release, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = strings.TrimSpace(string(release))
	}
	r := &report{Started: time.Now().UTC(), Machine: m, Settings: s, Configurations: configs, Binaries: map[string]string{}}
	for key, binary := range map[string]string{"knext": s.Knext, "upstream": s.Upstream} {
		out, err := exec.Command(binary, "--version").Output()
		r.Binaries[key] = strings.TrimSpace(string(out))
		if err != nil {
			r.Binaries[key] = fmt.Sprintf("%s --version: %v", binary, err)
		}
	}
	r.DependencyDifferences = dependencyDifferences(s.Upstream, s.Knext)
	return r
}

// dependencyDifferences lists the modules linked at other versions into the two daemons, but the
// patched ones (knext's are built from the workspace).
func dependencyDifferences(upstream, knext string) []string {
	versions := map[string][2]string{}
	for side, binary := range []string{upstream, knext} {
		info, err := buildinfo.ReadFile(binary)
		if err != nil {
			return []string{err.Error()}
		}
		for _, dep := range info.Deps {
			v := versions[dep.Path]
			v[side] = dep.Version
			versions[dep.Path] = v
		}
	}
	diffs := []string{}
	for path, v := range versions {
		if path != "github.com/containerd/containerd/v2" && path != "github.com/containerd/nri" && v[0] != v[1] {
			diffs = append(diffs, fmt.Sprintf("%s: upstream %q, knext %q", path, v[0], v[1]))
		}
	}
	slices.Sort(diffs)
	return diffs
}

func (r *report) write(path string) error {
	data, err := json.MarshalIndent(r, "", " ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return os.WriteFile(path, append(data, '\n'), 0o644)
}

func readReport(path string) (*report, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	r := &report{}
	return r, json.Unmarshal(data, r)
}

// sidesOf returns the runs that measured configuration key, and its side in them: side 1 of its
// own runs, or for upstream side 0 of every run.
func (r *report) sidesOf(key string) ([]*PairRun, int) {
	if key == cfgUpstream {
		return r.Pairs, 0
	}
	var runs []*PairRun
	for _, run := range r.Pairs {
		if run.Config == key {
			runs = append(runs, run)
		}
	}
	return runs, 1
}

// pairValues returns figure f of configuration key over its runs, or with toUpstream each run's
// ratio of key's figure to upstream's.
func (r *report) pairValues(key string, f func(run *PairRun, side int) (float64, bool), toUpstream bool) []float64 {
	runs, side := r.sidesOf(key)
	var values []float64
	for _, run := range runs {
		v, ok := f(run, side)
		if toUpstream {
			base, baseOK := f(run, 0)
			q, qOK := ratio(v, base)
			v, ok = q, ok && qOK && baseOK && side == 1
		}
		if ok {
			values = append(values, v)
		}
	}
	return values
}

// roundValues returns f of each sample of key, or with toUpstream its ratio to upstream's sample of
// the same round: the scale and cluster parts measure one configuration at a time.
func roundValues[S any](samples []S, keyRound func(S) (string, int), key string, f func(S) float64, toUpstream bool) []float64 {
	base := map[int]float64{}
	for _, s := range samples {
		if k, round := keyRound(s); k == cfgUpstream {
			base[round] = f(s)
		}
	}
	var values []float64
	for _, s := range samples {
		k, round := keyRound(s)
		v, ok := f(s), k == key
		if toUpstream {
			v, ok = ratio(v, base[round])
			ok = ok && k == key && key != cfgUpstream
		}
		if ok {
			values = append(values, v)
		}
	}
	return values
}

func (r *report) scaleValues(key string, f func(ScaleSample) float64, toUpstream bool) []float64 {
	return roundValues(r.Scale, func(s ScaleSample) (string, int) { return s.Config, s.Round }, key, f, toUpstream)
}

// clusterValues calls knext's cluster knext and upstream's upstream, as the configurations.
func (r *report) clusterValues(key string, f func(*ClusterRun) float64, toUpstream bool) []float64 {
	return roundValues(r.Cluster, func(c *ClusterRun) (string, int) { return c.Runtime, c.Round }, key, f, toUpstream)
}

// The figures of a pair run, by side.

func statusFigure(v variant, field func(Load) float64) func(*PairRun, int) (float64, bool) {
	return func(run *PairRun, side int) (float64, bool) {
		i := slices.IndexFunc(run.Status, func(s StatusSample) bool { return s.Variant == v })
		if i < 0 || run.Status[i].Sides[side].Calls == 0 {
			return 0, false
		}
		return field(run.Status[i].Sides[side]), true
	}
}

func p50(l Load) float64 { return l.P50Ms }

// overheadFigure is a status query beyond upstream's and the raw round trip to its plugin at the
// same concurrency, as a share of upstream's: the runtime's own work for the NRI query.
func overheadFigure(concurrency int) func(*PairRun, int) (float64, bool) {
	status := statusFigure(variant{Concurrency: concurrency}, p50)
	return func(run *PairRun, side int) (float64, bool) {
		up, upOK := status(run, 0)
		query, queryOK := status(run, 1)
		ping, pingOK := pingFigure(concurrency)(run, side)
		if !upOK || !queryOK || !pingOK {
			return 0, false
		}
		return ratio(query-up-ping, up)
	}
}

func pingFigure(concurrency int) func(*PairRun, int) (float64, bool) {
	return func(run *PairRun, side int) (float64, bool) {
		ping, ok := run.Ping[concurrency]
		return ping.P50Ms, ok && side == 1
	}
}

func lifecycleCall(stopRemove bool) string {
	if stopRemove {
		return "Stop+Remove"
	}
	return "RunPodSandbox"
}

// lifecycleFigure is the p50 of RunPodSandbox, or of StopPodSandbox + RemovePodSandbox.
func lifecycleFigure(width int, stopRemove bool) func(*PairRun, int) (float64, bool) {
	return func(run *PairRun, side int) (float64, bool) {
		i := slices.IndexFunc(run.Lifecycle[side], func(s LifecycleSample) bool { return s.Concurrency == width })
		if i < 0 {
			return 0, false
		}
		s := run.Lifecycle[side][i]
		if stopRemove {
			return percentile(s.StopRemoveMs, 0.5), len(s.StopRemoveMs) > 0
		}
		return percentile(s.RunMs, 0.5), len(s.RunMs) > 0
	}
}

// own is a figure of the configuration's side only: upstream's has no status plugin.
func own(get func(*PairRun) *float64) func(*PairRun, int) (float64, bool) {
	return func(run *PairRun, side int) (float64, bool) {
		if v := get(run); v != nil && side == 1 {
			return *v, true
		}
		return 0, false
	}
}

func stormFigure(run *PairRun, side int) (float64, bool) {
	return percentile(run.Storm[side], 0.5), len(run.Storm[side]) > 0
}

// Target is a limit of a figure in each of its variants (Parts), judged on the median over the
// rounds, or with Max on every round.
type Target struct {
	Name  string
	Limit float64
	Max   bool
	Parts []TargetPart
}

// TargetPart is a target's figure in one variant, with the A/A pair's beside it.
type TargetPart struct {
	Variant      string
	Measured, AA *Spread
}

func (t Target) status() string {
	var measured, missed []string
	for _, p := range t.Parts {
		if p.Measured == nil {
			continue
		}
		if measured = append(measured, p.Variant); t.Max && p.Measured.Max > t.Limit || !t.Max && p.Measured.Median > t.Limit {
			missed = append(missed, p.Variant)
		}
	}
	switch {
	case len(measured) == 0:
		return "not measured"
	case len(missed) > 0:
		return strings.TrimSpace("missed " + strings.Join(missed, ", "))
	}
	return "met"
}

func (r *report) targets() []Target {
	var targets []Target
	add := func(name string, limit float64, parts ...TargetPart) {
		targets = append(targets, Target{Name: name, Limit: limit, Parts: parts})
	}
	paired := func(key, variant string, f func(*PairRun, int) (float64, bool)) TargetPart {
		return TargetPart{variant, spread(r.pairValues(key, f, true)), spread(r.pairValues(cfgUpstreamAgain, f, true))}
	}
	type limit struct {
		key   string
		limit float64
	}
	for _, l := range []limit{{cfgKnext, 1.02}, {cfgRunPlugin, 1.02}, {cfgOnePlugin, 1.6}} {
		var parts []TargetPart
		for _, v := range variants {
			parts = append(parts, paired(l.key, v.String(), statusFigure(v, p50)))
		}
		add(fmt.Sprintf("(%s) PodSandboxStatus p50 ≤ %.2f × (upstream)", l.key, l.limit), l.limit, parts...)
	}
	for _, l := range []limit{{cfgKnext, 1.02}, {cfgCNILess, 0.8}} {
		var parts []TargetPart
		for _, stopRemove := range []bool{false, true} {
			for _, width := range lifecycleWidths {
				parts = append(parts, paired(l.key, fmt.Sprintf("%s c%d", lifecycleCall(stopRemove), width), lifecycleFigure(width, stopRemove)))
			}
		}
		add(fmt.Sprintf("(%s) pod start and removal p50 ≤ %.2f × (upstream)", l.key, l.limit), l.limit, parts...)
	}
	add(fmt.Sprintf("(%s) RunPodSandbox p50 during a 16-way status storm ≤ 1.20 × (upstream)", cfgSlowPlugin), 1.2, paired(cfgSlowPlugin, "", stormFigure))
	var overhead, three, slow []TargetPart
	for _, v := range variants[:2] {
		overhead = append(overhead, TargetPart{Variant: v.String(), Measured: spread(r.pairValues(cfgOnePlugin, overheadFigure(v.Concurrency), false))})
	}
	add(fmt.Sprintf("(%s) status query beyond upstream's and the raw round trip ≤ 0.20 × (upstream)'s", cfgOnePlugin), 0.2, overhead...)
	// Across pairs: three plugins against one, each paired with upstream; the slow plugin's
	// absolute p50 against its delay plus one plugin's, where the delay dominates any drift.
	median := func(key string, v variant, toUpstream bool) float64 {
		s := spread(r.pairValues(key, statusFigure(v, p50), toUpstream))
		if s == nil {
			return math.NaN() // no ratio with it is a figure
		}
		return s.Median
	}
	across := func(v variant, num, den float64) TargetPart {
		part := TargetPart{Variant: v.String()}
		if q, ok := ratio(num, den); ok && !math.IsNaN(q) {
			part.Measured = spread([]float64{q})
		}
		return part
	}
	for _, v := range variants {
		three = append(three, across(v, median(cfgThreePlugins, v, true), median(cfgOnePlugin, v, true)))
		slow = append(slow, across(v, median(cfgSlowPlugin, v, false), float64(slowDelay.Milliseconds())+median(cfgOnePlugin, v, false)))
	}
	add(fmt.Sprintf("(%s) PodSandboxStatus p50 ≤ 1.20 × (%s)", cfgThreePlugins, cfgOnePlugin), 1.2, three...)
	add(fmt.Sprintf("(%s) PodSandboxStatus p50 ≤ 1.20 × (%s + (%s))", cfgSlowPlugin, slowDelay, cfgOnePlugin), 1.2, slow...)
	var eventCalls, burstCalls []float64
	for _, run := range r.Pairs {
		if run.EventCalls != nil && run.Events >= 4 { // only where the events did arrive
			eventCalls = append(eventCalls, *run.EventCalls)
		}
		if run.BurstCalls != nil && run.Config == cfgSlowPlugin {
			burstCalls = append(burstCalls, *run.BurstCalls)
		}
	}
	targets = append(targets, Target{Name: "plugin calls caused by CRI container events = 0 (C7), every round of every plugin configuration",
		Max: true, Parts: []TargetPart{{Measured: spread(eventCalls)}}})
	// The median round: on a loaded machine one of 16 queries now and then arrives after the
	// shared round trip has ended, and makes a second one.
	add(fmt.Sprintf("(%s) plugin calls per burst of %d concurrent queries for one pod ≤ 1 (C7)", cfgSlowPlugin, stormWidth), 1,
		TargetPart{Measured: spread(burstCalls)})
	return targets
}
