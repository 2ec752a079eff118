package main

import (
	"slices"
	"strings"
	"testing"
	"time"
)

func TestPercentileMsIsNearestRank(t *testing.T) {
	var samples []time.Duration
	for i := 100; i >= 1; i-- { // unsorted on purpose
		samples = append(samples, time.Duration(i)*time.Millisecond)
	}
	for _, tc := range []struct {
		p    float64
		want float64
	}{{0.5, 50}, {0.99, 99}, {1, 100}, {0.001, 1}} {
		if got := percentileMs(samples, tc.p); got != tc.want {
			t.Errorf("percentileMs(1..100 ms, %v) = %v, want %v", tc.p, got, tc.want)
		}
	}
	if got := percentileMs(nil, 0.5); got != 0 {
		t.Errorf("percentileMs(none) = %v, want 0", got)
	}
}

func TestSpread(t *testing.T) {
	if got := spread([]float64{3, 1, 2}); *got != (Spread{Min: 1, Median: 2, Max: 3, N: 3}) {
		t.Errorf("spread(3, 1, 2) = %+v", *got)
	}
	if got := spread([]float64{4, 1, 2, 3}); got.Median != 2.5 {
		t.Errorf("spread(4, 1, 2, 3).Median = %v, want 2.5", got.Median)
	}
	if spread(nil) != nil {
		t.Error("spread(none) is not nil")
	}
}

func TestPairedRatiosUseRoundsPresentOnBothSides(t *testing.T) {
	got := spread(pairedRatios(map[int]float64{1: 2, 2: 6, 3: 5}, map[int]float64{1: 1, 2: 3, 4: 9}))
	if *got != (Spread{Min: 2, Median: 2, Max: 2, N: 2}) {
		t.Errorf("paired ratios = %+v, want rounds 1 and 2 only, both 2", *got)
	}
}

// runs builds runs of configuration key with a c1 PodSandboxStatus p50 per round.
func runs(key string, p50s ...float64) []*Run {
	var out []*Run
	for i, p50 := range p50s {
		out = append(out, &Run{Config: key, Round: i + 1,
			Status: []StatusSample{{variant: variants[0], Calls: 100, P50Ms: p50}}})
	}
	return out
}

// target returns r's target named name.
func target(t *testing.T, r *report, name string) Target {
	t.Helper()
	var found []Target
	for _, target := range slices.Concat(r.targets(), r.statusTargets12(), r.lifecycleTargets()) {
		if target.Name == name {
			found = append(found, target)
		}
	}
	if len(found) == 1 {
		return found[0]
	}
	t.Fatalf("%d targets named %q", len(found), name)
	return Target{}
}

func TestTargetsJudgeMedianOfPerRoundRatios(t *testing.T) {
	configs := configurations(50 * time.Millisecond) // all, f included
	r := &report{Configurations: configs, Settings: settings{SlowDelay: 50 * time.Millisecond}}
	// Round 2 is slow for both a and b: per-round ratios 1.0, 1.02, 1.2 -> median 1.02 (met),
	// while the ratio of the medians (0.12/0.1) would be 1.2 (missed).
	r.Runs = append(runs(cfgUpstream, 0.10, 0.50, 0.10), runs(cfgKnext, 0.10, 0.51, 0.12)...)
	r.Runs = append(r.Runs, runs(cfgOnePlugin, 0.2, 0.2, 0.2)...)
	r.Runs = append(r.Runs, runs(cfgOneSlowPlugin, 50.2, 50.2, 80)...)

	if got := target(t, r, "(knext) PodSandboxStatus p50 <= 1.05 x (upstream), c1"); got.Status != "met" || got.Measured.Median != 1.02 {
		t.Errorf("(knext) target = %+v (measured %+v), want met at median 1.02", got, got.Measured)
	}
	if got := target(t, r, "(knext-1-plugin) PodSandboxStatus p50 <= 1.60 x (upstream), c1"); got.Status != "missed" {
		t.Errorf("(knext-1-plugin) target = %+v, want missed (ratios 2, 0.4, 2)", got)
	}
	// (knext-1-slow-plugin) / (50 ms + (knext-1-plugin)): 1, 1, 1.59 -> median 1: met.
	if got := target(t, r, "(knext-1-slow-plugin) PodSandboxStatus p50 / (50ms + (knext-1-plugin) p50) <= 1.2, c1"); got.Status != "met" || got.Measured.Max < 1.5 {
		t.Errorf("(knext-1-slow-plugin) target = %+v (measured %+v), want met with the slow round as max", got, got.Measured)
	}
	if got := target(t, r, "(knext-3-plugins) PodSandboxStatus p50 <= 1.20 x (knext-1-plugin), c1"); got.Status != "not measured" || got.Note == "" {
		t.Errorf("(knext-3-plugins) target without (knext-3-plugins) runs = %+v, want not measured, saying why", got)
	}
	if got := target(t, r, "(knext-3-slow-plugins) PodSandboxStatus p50 <= 1.20 x (knext-1-slow-plugin), c1"); got.Status != "not measured" {
		t.Errorf("(knext-3-slow-plugins) target with f selected but not run = %+v, want not measured", got)
	}
	r.Configurations = configs[:3]
	if got := target(t, r, "(knext-3-plugins) PodSandboxStatus p50 <= 1.20 x (knext-1-plugin), c1"); got.Status != "not measured" || !strings.Contains(got.Note, "(knext-3-plugins)") {
		t.Errorf("(knext-3-plugins) target with (knext-3-plugins) not selected = %+v, want not measured naming (knext-3-plugins)", got)
	}
}

func TestInternalCallerTargetNeedsEventsAndZeroCalls(t *testing.T) {
	r := &report{Configurations: configurations(50 * time.Millisecond)}
	r.Runs = []*Run{
		{Config: cfgOnePlugin, Round: 1, Events: &EventsSample{Events: 4, PluginCalls: 0}},
		{Config: cfgOneSlowPlugin, Round: 1, Events: &EventsSample{Events: 2, PluginCalls: 7}}, // incomplete: not counted
	}
	got := target(t, r, "(knext-1-plugin)-(knext-1-slow-plugin) plugin calls caused by CRI container events (internal callers) = 0")
	if got.Status != "met" || got.Measured.N != 1 || !strings.Contains(got.Note, "only 2 of 4") {
		t.Errorf("internal-caller target = %+v, want met on the one complete run, noting the incomplete one", got)
	}
	r.Runs = append(r.Runs, &Run{Config: cfgThreePlugins, Round: 1, Events: &EventsSample{Events: 4, PluginCalls: 1}})
	if got := target(t, r, "(knext-1-plugin)-(knext-1-slow-plugin) plugin calls caused by CRI container events (internal callers) = 0"); got.Status != "missed" {
		t.Errorf("internal-caller target with one plugin call = %+v, want missed", got)
	}
	r.Runs = nil
	if got := target(t, r, "(knext-1-plugin)-(knext-1-slow-plugin) plugin calls caused by CRI container events (internal callers) = 0"); got.Status != "not measured" {
		t.Errorf("internal-caller target without runs = %+v, want not measured", got)
	}
}

func TestBurstTargetJudgesTheMedianRound(t *testing.T) {
	r := &report{Configurations: configurations(50 * time.Millisecond)}
	r.Runs = []*Run{
		{Config: cfgOneSlowPlugin, Round: 1, Bursts: &BurstSample{PluginCallsPerBurstPerPlugin: 1}},
		{Config: cfgOneSlowPlugin, Round: 2, Bursts: &BurstSample{PluginCallsPerBurstPerPlugin: 1.05}}, // one late query
		{Config: cfgOneSlowPlugin, Round: 3, Bursts: &BurstSample{PluginCallsPerBurstPerPlugin: 1}},
	}
	name := "(knext-1-slow-plugin) plugin calls per burst of 16 concurrent queries for one pod <= 1"
	if got := target(t, r, name); got.Status != "met" || got.Measured.Max != 1.05 {
		t.Errorf("burst target = %+v (measured %+v), want met, showing the max 1.05", got, got.Measured)
	}
	r.Runs[2].Bursts.PluginCallsPerBurstPerPlugin = 2 // no sharing at all in two rounds
	r.Runs[0].Bursts.PluginCallsPerBurstPerPlugin = 16
	if got := target(t, r, name); got.Status != "missed" {
		t.Errorf("burst target without sharing = %+v, want missed", got)
	}
}

func TestSelectConfigurations(t *testing.T) {
	all := configurations(50 * time.Millisecond)
	got, err := selectConfigurations(all, "knext-1-slow-plugin, upstream,knext")
	if err != nil || len(got) != 3 || got[0].Key != cfgUpstream || got[1].Key != cfgKnext || got[2].Key != cfgOneSlowPlugin {
		t.Errorf("select knext-1-slow-plugin,upstream,knext = %v, %v; want them in canonical order", got, err)
	}
	if _, err := selectConfigurations(all, "knext,knext-1-plugin"); err == nil {
		t.Error("a selection without the baseline upstream was accepted")
	}
	if _, err := selectConfigurations(all, "upstream,x"); err == nil || !strings.Contains(err.Error(), `"x"`) {
		t.Errorf("unknown configuration x: error %v, want one naming it", err)
	}
}

func TestRotateStartsEachRoundElsewhere(t *testing.T) {
	instances := []*instance{{c: configuration{Key: cfgUpstream}}, {c: configuration{Key: cfgKnext}}, {c: configuration{Key: cfgOnePlugin}}}
	keys := func(in []*instance) string {
		var s []string
		for _, i := range in {
			s = append(s, i.c.Key)
		}
		return strings.Join(s, " ")
	}
	for r, want := range []string{"upstream knext knext-1-plugin", "knext knext-1-plugin upstream", "knext-1-plugin upstream knext", "upstream knext knext-1-plugin"} {
		if got := keys(rotate(instances, r)); got != want {
			t.Errorf("round %d order %s, want %s", r, got, want)
		}
	}
	if keys(instances) != "upstream knext knext-1-plugin" {
		t.Error("rotate modified its argument")
	}
	if got := rotate(nil, 3); got != nil {
		t.Errorf("rotate of no instances = %v", got)
	}
}

func TestTargetsAgainstUpstreamCarryTheAAFigure(t *testing.T) {
	r := &report{Configurations: configurations(50 * time.Millisecond), Settings: settings{SlowDelay: 50 * time.Millisecond}}
	r.Runs = append(runs(cfgUpstream, 4, 4, 4), runs(cfgKnext, 4, 5, 6)...)
	name := "(knext) PodSandboxStatus p50 <= 1.02 x (upstream), c1"
	if got := target(t, r, name); got.Note != "" {
		t.Errorf("without (upstream-again) runs, %s has note %q, want none", name, got.Note)
	}
	r.Runs = append(r.Runs, runs(cfgUpstreamAgain, 3, 5, 4)...)
	got := target(t, r, name)
	if want := "A/A, (upstream-again) / (upstream): median 1 [0.75..1.25]"; got.Note != want {
		t.Errorf("%s has note %q, want %q", name, got.Note, want)
	}
	if got.Status != "missed" || got.Measured.Median != 1.25 {
		t.Errorf("%s = %+v (measured %+v): the A/A figure must not change the judgement of (knext)", name, got, got.Measured)
	}
}
