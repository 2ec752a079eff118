package main

import (
	"debug/buildinfo"
	"encoding/json"
	"fmt"
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

// dependencyDifferences compares the modules linked into the two daemons, but for the patched
// ones (knext's are built from the workspace).
func dependencyDifferences(upstream, knext string) []string {
	up, err := buildinfo.ReadFile(upstream)
	if err != nil {
		return []string{err.Error()}
	}
	kn, err := buildinfo.ReadFile(knext)
	if err != nil {
		return []string{err.Error()}
	}
	versions := map[string][2]string{}
	for side, info := range []*buildinfo.BuildInfo{up, kn} {
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
		i := slices.IndexFunc(run.Ping, func(p PingSample) bool { return p.Concurrency == concurrency })
		if i < 0 || side == 0 || !upOK || !queryOK {
			return 0, false
		}
		return ratio(query-up-run.Ping[i].Load.P50Ms, up)
	}
}

func pingFigure(concurrency int) func(*PairRun, int) (float64, bool) {
	return func(run *PairRun, side int) (float64, bool) {
		i := slices.IndexFunc(run.Ping, func(p PingSample) bool { return p.Concurrency == concurrency })
		if i < 0 || side == 0 {
			return 0, false
		}
		return run.Ping[i].Load.P50Ms, true
	}
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

func stormFigure(run *PairRun, side int) (float64, bool) {
	if s := run.Storm[side]; s != nil {
		return s.RunP50Ms, true
	}
	return 0, false
}

// Target is a figure's limit, judged on the median over the rounds, or on the max.
type Target struct {
	Name     string
	Limit    float64
	Max      bool // judged on the max: every round must meet it
	Measured *Spread
	AA       *Spread // the same figure of upstream-again, the A/A pair
}

func (t Target) status() string {
	switch {
	case t.Measured == nil:
		return "not measured"
	case t.Max && t.Measured.Max <= t.Limit, !t.Max && t.Measured.Median <= t.Limit:
		return "met"
	}
	return "missed"
}

func (r *report) targets() []Target {
	var targets []Target
	toUpstream := func(key string, limit float64, name string, f func(*PairRun, int) (float64, bool)) {
		targets = append(targets, Target{Name: fmt.Sprintf("(%s) %s ≤ %.2f × (upstream)", key, name, limit), Limit: limit,
			Measured: spread(r.pairValues(key, f, true)), AA: spread(r.pairValues(cfgUpstreamAgain, f, true))})
	}
	type limit struct {
		key   string
		limit float64
	}
	for _, l := range []limit{{cfgKnext, 1.02}, {cfgRunPlugin, 1.02}, {cfgOnePlugin, 1.6}} {
		for _, v := range variants {
			toUpstream(l.key, l.limit, "PodSandboxStatus p50, "+v.String(), statusFigure(v, p50))
		}
	}
	for _, l := range []limit{{cfgKnext, 1.02}, {cfgCNILess, 0.8}} {
		for _, width := range lifecycleWidths {
			toUpstream(l.key, l.limit, fmt.Sprintf("RunPodSandbox p50, c%d", width), lifecycleFigure(width, false))
			toUpstream(l.key, l.limit, fmt.Sprintf("StopPodSandbox + RemovePodSandbox p50, c%d", width), lifecycleFigure(width, true))
		}
	}
	toUpstream(cfgSlowPlugin, 1.2, "RunPodSandbox p50 during a 16-way status storm", stormFigure)
	for _, v := range variants[:2] {
		targets = append(targets, Target{Name: fmt.Sprintf("(%s) status query beyond upstream's and the raw round trip ≤ 0.20 × (upstream)'s, %s", cfgOnePlugin, v),
			Limit: 0.2, Measured: spread(r.pairValues(cfgOnePlugin, overheadFigure(v.Concurrency), false))})
	}
	// Across pairs: the rounds of two configurations, each against upstream, by round.
	byRound := func(key string, v variant) map[int]float64 {
		m := map[int]float64{}
		for _, run := range r.Pairs {
			if p, ok := statusFigure(v, p50)(run, 1); ok && run.Config == key {
				m[run.Round] = p
			}
		}
		return m
	}
	for _, v := range variants {
		one, three, slow := byRound(cfgOnePlugin, v), byRound(cfgThreePlugins, v), byRound(cfgSlowPlugin, v)
		var threeToOne, slowToOne []float64
		for round, base := range one {
			if q, ok := ratio(three[round], base); ok && three[round] > 0 {
				threeToOne = append(threeToOne, q)
			}
			if q, ok := ratio(slow[round], base+float64(slowDelay.Milliseconds())); ok && slow[round] > 0 {
				slowToOne = append(slowToOne, q)
			}
		}
		targets = append(targets,
			Target{Name: fmt.Sprintf("(%s) PodSandboxStatus p50 ≤ 1.20 × (%s), %s", cfgThreePlugins, cfgOnePlugin, v), Limit: 1.2, Measured: spread(threeToOne)},
			Target{Name: fmt.Sprintf("(%s) PodSandboxStatus p50 ≤ 1.20 × (%s + (%s)), %s", cfgSlowPlugin, slowDelay, cfgOnePlugin, v), Limit: 1.2, Measured: spread(slowToOne)})
	}
	var eventCalls, burstCalls []float64
	for _, run := range r.Pairs {
		if run.EventCalls != nil && run.Events >= 4 { // only where the events did arrive
			eventCalls = append(eventCalls, float64(*run.EventCalls))
		}
		if run.BurstCalls != nil && run.Config == cfgSlowPlugin {
			burstCalls = append(burstCalls, *run.BurstCalls)
		}
	}
	return append(targets,
		Target{Name: "plugin calls caused by CRI container events = 0 (C7), every round of every plugin configuration", Max: true, Measured: spread(eventCalls)},
		// The median round: on a loaded machine one of 16 queries now and then arrives after the
		// shared round trip has ended, and makes a second one.
		Target{Name: fmt.Sprintf("(%s) plugin calls per burst of %d concurrent queries for one pod ≤ 1 (C7)", cfgSlowPlugin, stormWidth), Limit: 1, Measured: spread(burstCalls)})
}
