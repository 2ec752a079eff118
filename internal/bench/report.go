package bench

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

// dependencyDifferences lists them (knext's patched modules are built from the workspace).
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
	return slices.DeleteFunc(slices.Clone(r.Pairs), func(run *PairRun) bool { return run.Config != key }), 1
}

// pairValues returns figure f of configuration key over its runs, or with toUpstream each run's
// ratio of key's figure to upstream's.
func (r *report) pairValues(key string, f figure, toUpstream bool) []float64 {
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

// figure is a figure of a pair run on one side (0 upstream's, 1 the configuration's), if measured.
type figure = func(run *PairRun, side int) (float64, bool)

// namedFigure is a figure in one variant (concurrency, verbose, start or removal).
type namedFigure struct {
	name string
	f    figure
}

func statusFigure(v variant, field func(Load) float64) figure {
	return func(run *PairRun, side int) (float64, bool) {
		i := slices.IndexFunc(run.Status, func(s StatusSample) bool { return s.Variant == v })
		if i < 0 || run.Status[i].Sides[side].Calls == 0 {
			return 0, false
		}
		return field(run.Status[i].Sides[side]), true
	}
}

func p50(l Load) float64 { return l.P50Ms }

func statusFigures(vs []variant) (figures []namedFigure) {
	for _, v := range vs {
		figures = append(figures, namedFigure{v.String(), statusFigure(v, p50)})
	}
	return figures
}

// lifecycleFigures are the p50 of pod starts, then of removals (Stop+Remove), at each concurrency.
func lifecycleFigures() (figures []namedFigure) {
	for _, call := range []string{"RunPodSandbox", "Stop+Remove"} {
		for _, width := range lifecycleWidths {
			figures = append(figures, namedFigure{fmt.Sprintf("%s c%d", call, width), func(run *PairRun, side int) (float64, bool) {
				i := slices.IndexFunc(run.Lifecycle[side], func(s LifecycleSample) bool { return s.Concurrency == width })
				if i < 0 {
					return 0, false
				}
				ms := run.Lifecycle[side][i].RunMs
				if call == "Stop+Remove" {
					ms = run.Lifecycle[side][i].StopRemoveMs
				}
				return percentile(ms, 0.5), len(ms) > 0
			}})
		}
	}
	return figures
}

// overheadFigure is, on the configuration's side, its status query beyond upstream's and the raw
// round trip to its plugin at the same concurrency, and upstream's query on upstream's side: its
// ratio to upstream is the runtime's own work for the NRI query, as a share of upstream's query.
func overheadFigure(concurrency int) figure {
	status, ping := statusFigure(variant{Concurrency: concurrency}, p50), pingFigure(concurrency)
	return func(run *PairRun, side int) (float64, bool) {
		up, upOK := status(run, 0)
		if side == 0 {
			return up, upOK
		}
		query, queryOK := status(run, 1)
		rtt, pingOK := ping(run, 1)
		return query - up - rtt, upOK && queryOK && pingOK
	}
}

func pingFigure(concurrency int) figure {
	return func(run *PairRun, side int) (float64, bool) {
		ping, ok := run.Ping[concurrency]
		return ping.P50Ms, ok && side == 1
	}
}

// own is a figure of the configuration's side only: upstream's has no status plugin.
func own(get func(*PairRun) *float64) figure {
	return func(run *PairRun, side int) (float64, bool) {
		if v := get(run); v != nil && side == 1 {
			return *v, true
		}
		return 0, false
	}
}

var burstFigure = own(func(run *PairRun) *float64 { return run.BurstCalls })

func stormFigure(run *PairRun, side int) (float64, bool) {
	return percentile(run.Storm[side], 0.5), len(run.Storm[side]) > 0
}

// targetPart is a target's figure in one variant, with the A/A pair's beside it.
type targetPart struct {
	variant      string
	measured, aa *Spread
}

// targetTable judges each target's figure in each of its variants on the median over the rounds,
// or, everyRound, on the maximum.
func (r *report) targetTable() Table {
	t := Table{ID: "targets", Title: "Targets: per variant, the median over the rounds [min–max], and the A/A pair's",
		Header: []string{"target", "measured", "A/A: upstream-again", "status"}}
	add := func(name string, limit float64, everyRound bool, parts ...targetPart) {
		var measured, aa, missed []string
		status := "not measured"
		for _, p := range parts {
			measured = append(measured, strings.TrimSpace(p.variant+" "+cell(p.measured, "%.2f", true)))
			if p.aa != nil {
				aa = append(aa, strings.TrimSpace(p.variant+" "+cell(p.aa, "%.2f", true)))
			}
			if p.measured != nil {
				if status = "met"; everyRound && p.measured.Max > limit || !everyRound && p.measured.Median > limit {
					missed = append(missed, p.variant)
				}
			}
		}
		if len(missed) > 0 {
			status = strings.TrimSpace("missed " + strings.Join(missed, ", "))
		}
		t.Rows = append(t.Rows, []string{name, strings.Join(measured, "; "), strings.Join(aa, "; "), status})
	}
	// paired are key's ratios to upstream in each variant, with the A/A pair's.
	paired := func(key string, figures ...namedFigure) []targetPart {
		var parts []targetPart
		for _, nf := range figures {
			parts = append(parts, targetPart{nf.name, spread(r.pairValues(key, nf.f, true)), spread(r.pairValues(cfgUpstreamAgain, nf.f, true))})
		}
		return parts
	}
	for _, l := range []struct {
		key, figure string
		limit       float64
		figures     []namedFigure
	}{
		{cfgKnext, "PodSandboxStatus p50", 1.02, statusFigures(variants)},
		{cfgRunPlugin, "PodSandboxStatus p50", 1.02, statusFigures(variants)},
		{cfgOnePlugin, "PodSandboxStatus p50", 1.6, statusFigures(variants)},
		{cfgKnext, "pod start and removal p50", 1.02, lifecycleFigures()},
		{cfgCNILess, "pod start and removal p50", 0.8, lifecycleFigures()},
		{cfgSlowPlugin, "RunPodSandbox p50 during a 16-way status storm", 1.2, []namedFigure{{"", stormFigure}}},
	} {
		add(fmt.Sprintf("(%s) %s ≤ %.2f × (upstream)", l.key, l.figure, l.limit), l.limit, false, paired(l.key, l.figures...)...)
	}
	// No A/A pair: upstream-again has no plugin to make a round trip to.
	add(fmt.Sprintf("(%s) status query beyond upstream's and the raw round trip ≤ 0.20 × (upstream)'s", cfgOnePlugin), 0.2, false,
		paired(cfgOnePlugin, namedFigure{variants[0].String(), overheadFigure(1)}, namedFigure{variants[1].String(), overheadFigure(stormWidth)})...)
	// Across pairs: three plugins against one, each paired with upstream; the slow plugin's
	// absolute p50 against its delay plus one plugin's, where the delay dominates any drift.
	median := func(key string, f figure, toUpstream bool) float64 {
		if s := spread(r.pairValues(key, f, toUpstream)); s != nil {
			return s.Median
		}
		return math.NaN() // no ratio with it is a figure
	}
	across := func(name string, num, den float64) targetPart {
		if q, ok := ratio(num, den); ok && !math.IsNaN(q) {
			return targetPart{variant: name, measured: spread([]float64{q})}
		}
		return targetPart{variant: name}
	}
	var three, slow []targetPart
	for _, nf := range statusFigures(variants) {
		three = append(three, across(nf.name, median(cfgThreePlugins, nf.f, true), median(cfgOnePlugin, nf.f, true)))
		slow = append(slow, across(nf.name, median(cfgSlowPlugin, nf.f, false), float64(slowDelay.Milliseconds())+median(cfgOnePlugin, nf.f, false)))
	}
	add(fmt.Sprintf("(%s) PodSandboxStatus p50 ≤ 1.20 × (%s)", cfgThreePlugins, cfgOnePlugin), 1.2, false, three...)
	add(fmt.Sprintf("(%s) PodSandboxStatus p50 ≤ 1.20 × (%s + (%s))", cfgSlowPlugin, slowDelay, cfgOnePlugin), 1.2, false, slow...)
	var eventCalls []float64
	for _, run := range r.Pairs {
		if run.EventCalls != nil && run.Events >= 4 { // only where the events did arrive
			eventCalls = append(eventCalls, *run.EventCalls)
		}
	}
	add("plugin calls caused by CRI container events = 0 (C7), every round of every plugin configuration", 0, true,
		targetPart{measured: spread(eventCalls)})
	// The median round: on a loaded machine one of 16 queries now and then arrives after the
	// shared round trip has ended, and makes a second one.
	add(fmt.Sprintf("(%s) plugin calls per burst of %d concurrent queries for one pod ≤ 1 (C7)", cfgSlowPlugin, stormWidth), 1, false,
		targetPart{measured: spread(r.pairValues(cfgSlowPlugin, burstFigure, false))})
	return t
}
