package main

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
)

// LifecycleSummary is one configuration's pod lifecycle figures at one concurrency, over the
// rounds (per-round percentiles and ratios), and over every pod of every round (pooled).
type LifecycleSummary struct {
	Config                string  `json:"config"`
	Concurrency           int     `json:"concurrency"`
	RunP50Ms              *Spread `json:"runP50Ms"`
	RunP99Ms              *Spread `json:"runP99Ms"`
	StopRemoveP50Ms       *Spread `json:"stopRemoveP50Ms"`
	StopRemoveP99Ms       *Spread `json:"stopRemoveP99Ms"`
	RunP50RatioToA        *Spread `json:"runP50RatioToA"`
	RunP99RatioToA        *Spread `json:"runP99RatioToA"`
	StopRemoveP50RatioToA *Spread `json:"stopRemoveP50RatioToA"`
	StopRemoveP99RatioToA *Spread `json:"stopRemoveP99RatioToA"`
	Pods                  int     `json:"pods"` // pooled: every measured pod of every round
	PooledRunP50Ms        float64 `json:"pooledRunP50Ms"`
	PooledRunP99Ms        float64 `json:"pooledRunP99Ms"`
	PooledStopRemoveP50Ms float64 `json:"pooledStopRemoveP50Ms"`
	PooledStopRemoveP99Ms float64 `json:"pooledStopRemoveP99Ms"`
}

// lifecycleMetric returns field of configuration key's lifecycle pass at concurrency width.
func lifecycleMetric(width int, field func(LifecycleSample) float64) func(*Run) (float64, bool) {
	return func(run *Run) (float64, bool) {
		for _, s := range run.Lifecycle {
			if s.Concurrency == width && s.Pods > 0 {
				return field(s), true
			}
		}
		return 0, false
	}
}

func runP50Life(s LifecycleSample) float64        { return s.RunP50Ms }
func runP99Life(s LifecycleSample) float64        { return s.RunP99Ms }
func stopRemoveP50Life(s LifecycleSample) float64 { return s.StopRemoveP50Ms }
func stopRemoveP99Life(s LifecycleSample) float64 { return s.StopRemoveP99Ms }

func (r *report) lifecycleSummary(key string, width int) LifecycleSummary {
	get := func(k string, field func(LifecycleSample) float64) map[int]float64 {
		return r.perRound(k, lifecycleMetric(width, field))
	}
	ratio := func(field func(LifecycleSample) float64) *Spread {
		return spread(pairedRatios(get(key, field), get(cfgUpstream, field)))
	}
	sum := LifecycleSummary{Config: key, Concurrency: width,
		RunP50Ms: spread(roundValues(get(key, runP50Life))), RunP99Ms: spread(roundValues(get(key, runP99Life))),
		StopRemoveP50Ms: spread(roundValues(get(key, stopRemoveP50Life))), StopRemoveP99Ms: spread(roundValues(get(key, stopRemoveP99Life))),
		RunP50RatioToA: ratio(runP50Life), RunP99RatioToA: ratio(runP99Life),
		StopRemoveP50RatioToA: ratio(stopRemoveP50Life), StopRemoveP99RatioToA: ratio(stopRemoveP99Life)}
	var runs, removals []float64
	for _, run := range r.Runs {
		if run.Config != key {
			continue
		}
		for _, s := range run.Lifecycle {
			if s.Concurrency == width {
				runs, removals = append(runs, s.RunMs...), append(removals, s.StopRemoveMs...)
			}
		}
	}
	sum.Pods = len(runs)
	sum.PooledRunP50Ms, sum.PooledRunP99Ms = percentile(runs, 0.5), percentile(runs, 0.99)
	sum.PooledStopRemoveP50Ms, sum.PooledStopRemoveP99Ms = percentile(removals, 0.5), percentile(removals, 0.99)
	return sum
}

// StepSummary is one step of where a configuration's pod lifecycle time goes, over the rounds.
type StepSummary struct {
	Config      string  `json:"config"`
	Concurrency int     `json:"concurrency"` // 0: a traced pass (one pod at a time)
	Phase       string  `json:"phase"`       // "run" or "stop+remove"
	Step        string  `json:"step"`
	Source      string  `json:"source"` // where the figure comes from
	PerPod      *Spread `json:"perPod"` // calls or executions per pod
	MeanMs      *Spread `json:"meanMs"` // per call
}

// lifecycleSteps collects, per configuration, the parts of a pod's start and removal the
// benchmark can see: NRI plugin calls and CNI operations (containerd's metrics), nri-bridge's
// steps (its log) and CNI plugin executions (cnitrace).
func (r *report) lifecycleSteps() []StepSummary {
	type key struct {
		config      string
		concurrency int
		phase, step string
		source      string
	}
	perPod, mean := map[key]map[int]float64{}, map[key]map[int]float64{}
	var order []key
	add := func(k key, round int, calls float64, meanMs float64) {
		if perPod[k] == nil {
			perPod[k], mean[k] = map[int]float64{}, map[int]float64{}
			order = append(order, k)
		}
		perPod[k][round], mean[k][round] = calls, meanMs
	}
	for _, run := range r.Runs {
		for _, s := range run.Lifecycle {
			for _, h := range s.Hooks {
				add(key{run.Config, s.Concurrency, h.Phase, h.step(), "containerd metrics"},
					run.Round, float64(h.Calls)/float64(s.Pods), h.MeanMs)
			}
			if b := s.Bridge; b != nil && b.Error == "" {
				const src = "nri-bridge log"
				add(key{run.Config, s.Concurrency, "run", "nri-bridge: store the allocation (durable)", src}, run.Round, 1, b.StoredMs)
				add(key{run.Config, s.Concurrency, "run", "nri-bridge: wire the pod (netlink)", src}, run.Round, 1, b.WiredMs)
				add(key{run.Config, s.Concurrency, "stop+remove", "nri-bridge: detach the pod (netlink)", src}, run.Round, 1, b.DetachedMs)
				add(key{run.Config, s.Concurrency, "stop+remove", "nri-bridge: delete the veth (after the hook)", src}, run.Round, 1, b.UnwiredMs)
				add(key{run.Config, s.Concurrency, "stop+remove", "nri-bridge: release the allocation (after the hook)", src}, run.Round, 1, b.ReleasedMs)
			}
		}
		if t := run.CNI; t != nil {
			const src = "cnitrace"
			for _, e := range t.Executions {
				phase := "run"
				if e.Command != "ADD" {
					phase = "stop+remove"
				}
				step := "CNI " + e.Plugin + " " + e.Command
				if e.Nested {
					step += " (inside its parent's)"
				}
				add(key{run.Config, 0, phase, step, src}, run.Round, float64(e.Calls)/float64(t.Pods), e.MeanMs)
			}
			add(key{run.Config, 0, "run", "CNI ADD per pod, all plugins", src}, run.Round, 1, t.AddPerPodMs)
			add(key{run.Config, 0, "stop+remove", "CNI DEL per pod, all plugins", src}, run.Round, 1, t.DelPerPodMs)
		}
	}
	var steps []StepSummary
	for _, k := range order {
		steps = append(steps, StepSummary{Config: k.config, Concurrency: k.concurrency, Phase: k.phase, Step: k.step,
			Source: k.source, PerPod: spread(roundValues(perPod[k])), MeanMs: spread(roundValues(mean[k]))})
	}
	slices.SortStableFunc(steps, func(a, b StepSummary) int {
		if c := strings.Compare(a.Config, b.Config); c != 0 {
			return c
		}
		if a.Concurrency != b.Concurrency {
			return a.Concurrency - b.Concurrency
		}
		return strings.Compare(b.Phase, a.Phase) // run before stop+remove
	})
	return steps
}

// OverheadSummary is what configuration (knext-1-plugin)'s status query costs beyond upstream's query and
// the raw ttrpc round trip to its plugin: the runtime's own work for the NRI query.
type OverheadSummary struct {
	Variant   string  `json:"variant"`
	PingP50Ms *Spread `json:"pingP50Ms"`
	// MultiplexedPingP50Ms is the round trip over NRI's multiplexer: not the floor, the share
	// of NRI's transport in the overhead.
	MultiplexedPingP50Ms *Spread `json:"multiplexedPingP50Ms"`
	OverheadMs           *Spread `json:"overheadMs"` // (knext-1-plugin) p50 - (upstream) p50 - round trip p50, per round
	FractionOfA          *Spread `json:"fractionOfA"`
	// IdlePingP50Ms is the round trip after an idle gap (c1 without verbose only: its gap is
	// that variant's), and IdleFractionOfA the overhead beyond it: shown, not judged.
	IdlePingP50Ms   *Spread `json:"idlePingP50Ms,omitempty"`
	IdleFractionOfA *Spread `json:"idleFractionOfA,omitempty"`
}

// pingP50 is the p50 of round trip rt per round at the concurrency of variant v.
func (r *report) pingP50(v variant, rt roundTrip) map[int]float64 {
	return r.perRound(cfgOnePlugin, func(run *Run) (float64, bool) {
		for _, p := range run.Ping {
			if p.Concurrency == v.Concurrency && p.is(rt) && p.Calls > 0 {
				return p.P50Ms, true
			}
		}
		return 0, false
	})
}

// statusOverhead returns, per round, (knext-1-plugin) p50 - (upstream) p50 - round trip rt's p50 and that as a
// fraction of (upstream)'s p50.
func (r *report) statusOverhead(v variant, rt roundTrip) (overheadMs, fraction []float64) {
	a, c, rtt := r.perRound(cfgUpstream, statusMetric(v, p50)), r.perRound(cfgOnePlugin, statusMetric(v, p50)), r.pingP50(v, rt)
	for round, cp50 := range c {
		ap50, okA := a[round]
		ping, okP := rtt[round]
		if !okA || !okP || ap50 <= 0 {
			continue
		}
		o := cp50 - ap50 - ping
		overheadMs, fraction = append(overheadMs, o), append(fraction, o/ap50)
	}
	return overheadMs, fraction
}

func (r *report) overheadSummaries() []OverheadSummary {
	var out []OverheadSummary
	for _, v := range variants {
		overhead, fraction := r.statusOverhead(v, roundTrip{})
		if len(overhead) == 0 {
			continue
		}
		summary := OverheadSummary{Variant: v.String(), PingP50Ms: spread(roundValues(r.pingP50(v, roundTrip{}))),
			MultiplexedPingP50Ms: spread(roundValues(r.pingP50(v, roundTrip{multiplexed: true}))), OverheadMs: spread(overhead),
			FractionOfA: spread(fraction)}
		if !v.Verbose {
			_, idleFraction := r.statusOverhead(v, roundTrip{idle: true})
			summary.IdlePingP50Ms, summary.IdleFractionOfA = spread(roundValues(r.pingP50(v, roundTrip{idle: true}))), spread(idleFraction)
		}
		out = append(out, summary)
	}
	return out
}

// lifecycleTargets are the pod lifecycle targets, judged on the median of the
// per-round ratios.
func (r *report) lifecycleTargets() []Target {
	var targets []Target
	phases := []struct {
		name  string
		field func(LifecycleSample) float64
	}{{"RunPodSandbox", runP50Life}, {"StopPodSandbox + RemovePodSandbox", stopRemoveP50Life}}
	for _, pair := range []struct {
		key   string
		limit float64
	}{{cfgKnext, 1.02}, {cfgCNILess, 0.8}} {
		for _, phase := range phases {
			for _, width := range lifecycleWidths {
				metric := lifecycleMetric(width, phase.field)
				t := Target{Name: fmt.Sprintf("(%s) %s p50 <= %.2f x (upstream), c%d", pair.key, phase.name, pair.limit, width),
					Limit: pair.limit, Judged: "median", Note: r.aaNote(metric)}
				ratios := pairedRatios(r.perRound(pair.key, metric), r.perRound(cfgUpstream, metric))
				targets = append(targets, judge(t, ratios, r.absent(pair.key, cfgUpstream)...))
			}
		}
	}
	return targets
}

// statusTargets12 are the status targets of (knext-1-plugin)'s overhead beyond the raw round trip and of (knext)
// at 1.02, judged on the median over the rounds.
func (r *report) statusTargets12() []Target {
	var targets []Target
	for _, v := range variants {
		t := Target{Name: fmt.Sprintf("(knext-1-plugin) PodSandboxStatus runtime-side overhead beyond the raw round trip <= 0.20 x (upstream)'s query, %s", v),
			Limit: 0.2, Judged: "median"}
		_, fraction := r.statusOverhead(v, roundTrip{})
		targets = append(targets, judge(t, fraction, r.absent(cfgUpstream, cfgOnePlugin)...))
	}
	// No plugin, or one that is never asked (S10): the status query costs what upstream's does.
	for _, key := range []string{cfgKnext, cfgOneRunPlugin} {
		for _, v := range variants {
			t := Target{Name: fmt.Sprintf("(%s) PodSandboxStatus p50 <= 1.02 x (upstream), %s", key, v), Limit: 1.02, Judged: "median",
				Note: r.aaNote(statusMetric(v, p50))}
			targets = append(targets, judge(t, pairedRatios(r.perRound(key, statusMetric(v, p50)), r.perRound(cfgUpstream, statusMetric(v, p50))),
				r.absent(cfgUpstream, key)...))
		}
	}
	return targets
}

func (r *report) printLifecycle(out io.Writer) {
	if len(r.Lifecycle) == 0 {
		return
	}
	fmt.Fprintf(out, "\nPod lifecycle: %d new pods per configuration, round and concurrency (next to the %d running ones); "+
		"RunPodSandbox, then StopPodSandbox + RemovePodSandbox of each.\n", r.Settings.LifecyclePods, r.Settings.Pods)
	fmt.Fprintln(out, "Cells: median [min..max] over the rounds of the per-round figure; pooled: over every pod of every round.")
	w := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "call\tconc\tcfg\tp50 ms\tp99 ms\tp50 / (upstream)\tp99 / (upstream)\tpooled p50 ms\tpooled p99 ms\tpods\t")
	for _, phase := range []string{"RunPodSandbox", "Stop+Remove"} {
		for _, s := range r.Lifecycle {
			p50, p99, r50, r99, pp50, pp99 := s.RunP50Ms, s.RunP99Ms, s.RunP50RatioToA, s.RunP99RatioToA, s.PooledRunP50Ms, s.PooledRunP99Ms
			if phase != "RunPodSandbox" {
				p50, p99, r50, r99 = s.StopRemoveP50Ms, s.StopRemoveP99Ms, s.StopRemoveP50RatioToA, s.StopRemoveP99RatioToA
				pp50, pp99 = s.PooledStopRemoveP50Ms, s.PooledStopRemoveP99Ms
			}
			fmt.Fprintf(w, "%s\tc%d\t%s\t%s\t%s\t%s\t%s\t%.1f\t%.1f\t%d\t\n", phase, s.Concurrency, s.Config,
				cell(p50, "%.1f"), cell(p99, "%.1f"), cell(r50, "%.2f"), cell(r99, "%.2f"), pp50, pp99, s.Pods)
		}
	}
	w.Flush()

	if len(r.Steps) == 0 {
		return
	}
	fmt.Fprintln(out, "\nWhere the time goes (per round: mean per call; calls per pod), median [min..max] over the rounds.")
	fmt.Fprintln(out, "conc 0: a separate traced pass, one pod at a time, every CNI plugin run through the cnitrace wrapper.")
	w = tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "cfg\tconc\tphase\tstep\tcalls per pod\tmean ms\tsource\t")
	for _, s := range r.Steps {
		fmt.Fprintf(w, "%s\t%d\t%s\t%s\t%s\t%s\t%s\t\n", s.Config, s.Concurrency, s.Phase, s.Step,
			cell(s.PerPod, "%.2f"), cell(s.MeanMs, "%.2f"), s.Source)
	}
	w.Flush()
}

func (r *report) printOverhead(out io.Writer) {
	if len(r.Overhead) == 0 {
		return
	}
	fmt.Fprintln(out, "\n(knext-1-plugin)'s status query beyond the raw ttrpc round trip to its plugin process (a no-op call of the same"+
		" process, same concurrency, same round): overhead = (knext-1-plugin) p50 - (upstream) p50 - round trip p50. At c1 the plugin idles"+
		" between (knext-1-plugin)'s queries; the round trip after an idle gap (the caller busy-waits (knext-1-plugin)'s p50 less the round trip's"+
		" before each call) and the overhead beyond it are shown, not judged.")
	w := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "variant\tround trip p50 ms\toverhead ms\toverhead / (upstream) p50\tround trip over NRI's multiplexer p50 ms\t"+
		"round trip after an idle gap p50 ms\toverhead beyond it / (upstream) p50\t")
	for _, o := range r.Overhead {
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", o.Variant, cell(o.PingP50Ms, "%.3f"), cell(o.OverheadMs, "%.3f"),
			cell(o.FractionOfA, "%.2f"), cell(o.MultiplexedPingP50Ms, "%.3f"), cell(o.IdlePingP50Ms, "%.3f"), cell(o.IdleFractionOfA, "%.2f"))
	}
	w.Flush()
}
