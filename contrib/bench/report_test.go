package main

import (
	"encoding/xml"
	"math"
	"slices"
	"strings"
	"testing"
)

// pair builds a round of configuration key against upstream with c1 status p50s [upstream, key]
// and c1 RunPodSandbox times.
func pair(key string, round int, status [2]float64, run [2]float64) *PairRun {
	p := &PairRun{Config: key, Round: round, Status: []StatusSample{{Variant: variants[0],
		Sides: [2]Load{{Calls: 10, P50Ms: status[0]}, {Calls: 10, P50Ms: status[1]}}}}}
	for side := range 2 {
		p.Lifecycle[side] = []LifecycleSample{{Concurrency: 1, RunMs: []float64{run[side]}, StopRemoveMs: []float64{1},
			Timers: []Timer{{Plugin: cniTimer, Operation: "set_up_pod", Calls: 2, MeanMs: run[side] / 2}}}}
	}
	return p
}

func testReport() *report {
	return &report{Configurations: configurations(), Pairs: []*PairRun{
		// Round 2 is slow on both sides: the per-round ratios stay 1.01, 1.01, 1.10.
		pair(cfgKnext, 1, [2]float64{0.10, 0.101}, [2]float64{100, 101}),
		pair(cfgKnext, 2, [2]float64{0.50, 0.505}, [2]float64{200, 202}),
		pair(cfgKnext, 3, [2]float64{0.10, 0.110}, [2]float64{100, 110}),
		pair(cfgUpstreamAgain, 1, [2]float64{0.10, 0.09}, [2]float64{100, 100}),
	}}
}

func target(t *testing.T, r *report, name string) Target {
	t.Helper()
	for _, target := range r.targets() {
		if target.Name == name {
			return target
		}
	}
	t.Fatalf("no target %q", name)
	return Target{}
}

func TestTargetsJudgeTheMedianOfPairedRatiosAndShowTheAAPair(t *testing.T) {
	r := testReport()
	name := "(knext) PodSandboxStatus p50 ≤ 1.02 × (upstream)"
	c1 := target(t, r, name).Parts[0]
	if got := target(t, r, name); got.status() != "met" || c1.Variant != "c1" || c1.Measured.N != 3 || math.Abs(c1.Measured.Median-1.01) > 1e-9 ||
		c1.AA == nil || math.Abs(c1.AA.Median-0.9) > 1e-9 {
		t.Errorf("status target %s, c1 measured %+v, A/A %+v; want met at 1.01 of 3 rounds, A/A 0.9", got.status(), c1.Measured, c1.AA)
	}
	r.Pairs[0].Status[0].Sides[1].P50Ms = 0.2 // ratios 2, 1.01, 1.1: median 1.1
	if got := target(t, r, name); got.status() != "missed c1" {
		t.Errorf("status target with a median of 1.1 at c1: %s", got.status())
	}
	if got := target(t, r, "(cniless) pod start and removal p50 ≤ 0.80 × (upstream)"); got.status() != "not measured" {
		t.Errorf("a target of a configuration that did not run is %s", got.status())
	}
	calls := 1.0
	r.Pairs = append(r.Pairs, &PairRun{Config: cfgOnePlugin, Events: 4, EventCalls: &calls})
	events := "plugin calls caused by CRI container events = 0 (C7), every round of every plugin configuration"
	if got := target(t, r, events); got.status() != "missed" {
		t.Errorf("one plugin call for container events: %q, want missed", got.status())
	}
	r.Pairs[len(r.Pairs)-1].Events = 2 // the events did not all arrive: the round proves nothing
	if got := target(t, r, events); got.status() != "not measured" {
		t.Errorf("without every event: %s, want not measured", got.status())
	}
}

func TestPluginsAreJudgedAgainstOnePlugin(t *testing.T) {
	r := &report{Pairs: []*PairRun{
		pair(cfgOnePlugin, 1, [2]float64{0.1, 0.5}, [2]float64{}), pair(cfgSlowPlugin, 1, [2]float64{0.1, 55.55}, [2]float64{}),
		pair(cfgOnePlugin, 2, [2]float64{0.2, 0.8}, [2]float64{}), pair(cfgThreePlugins, 2, [2]float64{0.1, 0.5}, [2]float64{}),
	}}
	// 55.55 / (50 + the median of 0.5 and 0.8), 5 / the median of 5 and 4 (the paired ratios); no c16.
	slow := target(t, r, "(knext-1-slow-plugin) PodSandboxStatus p50 ≤ 1.20 × (50ms + (knext-1-plugin))").Parts
	three := target(t, r, "(knext-3-plugins) PodSandboxStatus p50 ≤ 1.20 × (knext-1-plugin)")
	if slow[0].Measured == nil || math.Abs(slow[0].Measured.Median-55.55/50.65) > 1e-9 || slow[1].Measured != nil ||
		three.Parts[0].Measured == nil || math.Abs(three.Parts[0].Measured.Median-5/4.5) > 1e-9 || three.status() != "met" {
		t.Errorf("slow plugin %+v, three plugins %+v (%s)", slow, three.Parts, three.status())
	}
}

func TestTablesShowEveryMeasuredConfiguration(t *testing.T) {
	r := testReport()
	var status, steps Table
	for _, table := range r.tables() {
		switch table.ID {
		case "status":
			status = table
		case "steps":
			steps = table
		}
	}
	if len(status.Rows) != 3 || status.Rows[0][0] != cfgUpstream || status.Rows[1][0] != cfgKnext {
		t.Fatalf("status rows = %v, want upstream, knext and upstream-again", status.Rows)
	}
	// upstream: every pair's side 0 (0.1, 0.5, 0.1, 0.1); knext: its ratios with their range.
	if status.Rows[0][1] != "0.100" || status.Rows[0][2] != "–" || status.Rows[1][2] != "1.01 [1.01–1.10]" {
		t.Errorf("status rows = %v", status.Rows)
	}
	if len(steps.Rows) != 3 || steps.Rows[1][1] != "CNI set_up_pod" || steps.Rows[1][2] != "2.00" || steps.Rows[1][3] != "55.00" {
		t.Errorf("steps = %v, want CNI set_up_pod of knext at 2 calls per pod, a median of 55 ms", steps.Rows)
	}
	if md := status.markdown(); !strings.Contains(md, "| configuration | c1 p50 ms | × upstream |") || !strings.Contains(md, "| knext | 0.110 | 1.01 [1.01–1.10] |") {
		t.Errorf("markdown:\n%s", md)
	}
}

func TestScaleRatiosPairTheRounds(t *testing.T) {
	samples := []ScaleSample{
		{Config: cfgUpstream, Round: 1, SweepMs: 100}, {Config: cfgUpstream, Round: 2, SweepMs: 200},
		{Config: cfgOnePlugin, Round: 1, SweepMs: 150}, {Config: cfgOnePlugin, Round: 2, SweepMs: 500},
	}
	sweep := roundColumns(samples, func(s ScaleSample) (string, int) { return s.Config, s.Round })("", "", func(s ScaleSample) float64 { return s.SweepMs })
	if got := spread(sweep.figure(cfgOnePlugin, true)); got.Min != 1.5 || got.Max != 2.5 {
		t.Errorf("sweep ratios = %+v, want 1.5 and 2.5", got)
	}
	if got := sweep.figure(cfgUpstream, true); got != nil {
		t.Errorf("upstream's ratio to itself = %v, want none", got)
	}
}

func TestFillRegionsReplacesEveryRegion(t *testing.T) {
	page := "# P\n<!-- bench:a -->\nold\n<!-- /bench:a -->\ntext\n<!-- bench:b -->\n<!-- /bench:b -->\n"
	got, err := fillRegions(page, map[string]string{"a": "A\n", "b": "B"})
	if want := "# P\n<!-- bench:a -->\nA\n<!-- /bench:a -->\ntext\n<!-- bench:b -->\nB\n<!-- /bench:b -->\n"; err != nil || got != want {
		t.Errorf("fillRegions = %q, %v; want %q", got, err, want)
	}
	if _, err := fillRegions(page, map[string]string{"a": "A", "b": "B", "c": "C"}); err == nil {
		t.Error("content without a region was dropped silently")
	}
}

func TestBarChartIsAnSVGWithABarPerFigure(t *testing.T) {
	r := testReport()
	for _, logScale := range []bool{false, true} {
		svg := barChart("p50", logScale, configKeys(r.Configurations), r.p50Columns(statusFigures(variants[:1]), " p50 ms", "%.3f", false))
		var doc struct {
			Rects []struct{} `xml:"rect"`
		}
		if err := xml.Unmarshal(svg, &doc); err != nil {
			t.Fatalf("not XML: %v\n%s", err, svg)
		}
		// The background, a legend entry, a bar for each of upstream, knext and upstream-again.
		if len(doc.Rects) != 5 {
			t.Errorf("log %v: %d rects, want 5:\n%s", logScale, len(doc.Rects), svg)
		}
	}
	if scale, ticks := linearAxis(7); len(ticks) != 5 || ticks[4] != 8 || scale(4) != 0.5 {
		t.Errorf("linear axis up to 7: ticks %v", ticks)
	}
	if scale, ticks := logAxis(0.2, 60); len(ticks) != 4 || ticks[0] != 0.1 || scale(1) < 0.333 || scale(1) > 0.334 {
		t.Errorf("log axis of 0.2..60: ticks %v", ticks)
	}
}

func TestOverheadIsTheQueryBeyondUpstreamsAndTheRoundTrip(t *testing.T) {
	run := pair(cfgOnePlugin, 1, [2]float64{0.2, 0.5}, [2]float64{})
	run.Ping = map[int]Load{1: {P50Ms: 0.25}}
	r := &report{Configurations: configurations(), Pairs: []*PairRun{run}}
	for _, table := range r.tables() {
		// (0.5 - 0.2 - 0.25) / 0.2; nothing at c16.
		if want := []string{cfgOnePlugin, "0.250", "0.25", "–", "–"}; table.ID == "overhead" && !slices.Equal(table.Rows[0], want) {
			t.Errorf("overhead rows = %v, want %v", table.Rows, want)
		}
	}
}
