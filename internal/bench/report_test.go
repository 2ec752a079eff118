package bench

import (
	"encoding/xml"
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

// target returns the row of the target table named name.
func target(t *testing.T, r *report, name string) []string {
	t.Helper()
	rows := r.targetTable().Rows
	if i := slices.IndexFunc(rows, func(row []string) bool { return row[0] == name }); i >= 0 {
		return rows[i]
	}
	t.Fatalf("no target %q", name)
	return nil
}

func TestTargetsJudgeTheMedianOfPairedRatiosAndShowTheAAPair(t *testing.T) {
	r := testReport()
	name := "(knext) PodSandboxStatus p50 ≤ 1.02 × (upstream)"
	if got, want := target(t, r, name), []string{name, "c1 1.01 [1.01–1.10]; c16 –; c1 verbose –; c16 verbose –", "c1 0.90", "met"}; !slices.Equal(got, want) {
		t.Errorf("status target = %q, want %q", got, want)
	}
	r.Pairs[0].Status[0].Sides[1].P50Ms = 0.2 // ratios 2, 1.01, 1.1: median 1.1
	events := "plugin calls caused by CRI container events = 0 (C7), every round of every plugin configuration"
	for _, c := range []struct {
		change       func()
		target, want string
	}{
		{nil, name, "missed c1"},
		{nil, "(cniless) pod start and removal p50 ≤ 0.80 × (upstream)", "not measured"}, // cniless did not run
		{func() { r.Pairs = append(r.Pairs, &PairRun{Config: cfgOnePlugin, Events: 4, EventCalls: new(1.0)}) }, events, "missed"},
		{func() { r.Pairs[len(r.Pairs)-1].Events = 2 }, events, "not measured"}, // the events did not all arrive: no proof
	} {
		if c.change != nil {
			c.change()
		}
		if got := target(t, r, c.target)[3]; got != c.want {
			t.Errorf("%s: %s, want %s", c.target, got, c.want)
		}
	}
}

func TestPluginsAreJudgedAgainstOnePlugin(t *testing.T) {
	r := &report{Pairs: []*PairRun{
		pair(cfgOnePlugin, 1, [2]float64{2, 10}, [2]float64{}), pair(cfgSlowPlugin, 1, [2]float64{0.1, 84}, [2]float64{}),
		pair(cfgOnePlugin, 2, [2]float64{10, 40}, [2]float64{}), pair(cfgThreePlugins, 2, [2]float64{0.1, 0.5}, [2]float64{}),
	}}
	// 84 / (50 + the median of 10 and 40), 5 / the median of 5 and 4 (the paired ratios); no c16.
	for name, want := range map[string][]string{
		"(knext-1-slow-plugin) PodSandboxStatus p50 ≤ 1.20 × (50ms + (knext-1-plugin))": {"c1 1.12; c16 –; c1 verbose –; c16 verbose –", "", "met"},
		"(knext-3-plugins) PodSandboxStatus p50 ≤ 1.20 × (knext-1-plugin)":              {"c1 1.11; c16 –; c1 verbose –; c16 verbose –", "", "met"},
	} {
		if got := target(t, r, name); !slices.Equal(got[1:], want) {
			t.Errorf("%s: %q, want %q", name, got[1:], want)
		}
	}
}

func TestTablesShowEveryMeasuredConfiguration(t *testing.T) {
	overhead := pair(cfgOnePlugin, 1, [2]float64{0.2, 0.5}, [2]float64{})
	overhead.Ping = map[int]Load{1: {P50Ms: 0.25}}
	scale := []ScaleSample{{Config: cfgUpstream, Round: 1, SweepMs: 100}, {Config: cfgUpstream, Round: 2, SweepMs: 200},
		{Config: cfgOnePlugin, Round: 1, SweepMs: 150}, {Config: cfgOnePlugin, Round: 2, SweepMs: 500}}
	none := []string{"–", "–", "–", "–", "–", "–"}
	for _, c := range []struct {
		r    *report
		id   string
		want [][]string
	}{
		// upstream: every pair's side 0 (0.1, 0.5, 0.1, 0.1); the others' ratios paired by round, with their range.
		{testReport(), "status", [][]string{append([]string{"upstream", "0.100", "–"}, none...),
			append([]string{"knext", "0.110", "1.01 [1.01–1.10]"}, none...), append([]string{"upstream-again", "0.090", "0.90"}, none...)}},
		// CNI's setup at 2 calls per pod and its median time over the rounds; nothing at c8.
		{testReport(), "steps", [][]string{{"upstream", "CNI set_up_pod", "2.00", "50.00", "–"},
			{"knext", "CNI set_up_pod", "2.00", "55.00", "–"}, {"upstream-again", "CNI set_up_pod", "2.00", "50.00", "–"}}},
		// (0.5 - 0.2 - 0.25) / 0.2; nothing at c16.
		{&report{Configurations: configurations(), Pairs: []*PairRun{overhead}}, "overhead", [][]string{{cfgOnePlugin, "0.250", "0.25", "–", "–"}}},
		// A sweep against upstream's of the same round: 1.5 and 2.5; no ratio of upstream to itself.
		{&report{Scale: scale}, "scale", [][]string{{"upstream", "150.0", "–", "0.000", "0.00", "0.00", "–", "–", "–", "–"},
			{"knext-1-plugin", "325.0", "2.00 [1.50–2.50]", "0.000", "0.00", "0.00", "–", "–", "–", "–"}}},
	} {
		tables := c.r.tables()
		i := slices.IndexFunc(tables, func(t Table) bool { return t.ID == c.id })
		if got := tables[i].Rows; !slices.EqualFunc(got, c.want, slices.Equal) {
			t.Errorf("%s rows = %q, want %q", c.id, got, c.want)
		}
	}
	if md := testReport().tables()[1].markdown(); !strings.Contains(md, "| configuration | c1 p50 ms | × upstream |") || !strings.Contains(md, "| knext | 0.110 | 1.01 [1.01–1.10] |") {
		t.Errorf("markdown:\n%s", md)
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
