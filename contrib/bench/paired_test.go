package main

import (
	"slices"
	"testing"
	"time"
)

func TestSideOfAlternatesABBAAndSwapsEachRound(t *testing.T) {
	for round, want := range map[int][]int{1: {0, 1, 1, 0, 0, 1, 1, 0}, 2: {1, 0, 0, 1, 1, 0, 0, 1}, 3: {0, 1, 1, 0, 0, 1, 1, 0}} {
		var got []int
		for k := range 8 {
			got = append(got, sideOf(k, round))
		}
		if !slices.Equal(got, want) {
			t.Errorf("round %d: sides of slices 0..7 = %v, want %v", round, got, want)
		}
	}
}

// pairedRuns builds paired rounds of configuration key with the given c1 status and c8
// RunPodSandbox ratios.
func pairedRuns(key string, status, run8 []float64) []*PairedRun {
	var out []*PairedRun
	for i := range status {
		out = append(out, &PairedRun{Config: key, Round: i + 1,
			Status:    []PairedStatus{{variant: variants[0], Ratio: status[i]}},
			Lifecycle: []PairedLifecycle{{Concurrency: 8, RunRatio: run8[i]}}})
	}
	return out
}

func TestPairedTargetsJudgeBAndShowTheAAPair(t *testing.T) {
	r := &report{Configurations: configurations(50 * time.Millisecond), Settings: settings{SlowDelay: 50 * time.Millisecond}}
	r.Paired = append(pairedRuns(cfgKnext, []float64{1.0, 1.5, 1.01}, []float64{1.25, 1.25, 1.5}),
		pairedRuns(cfgUpstreamAgain, []float64{0.75, 1, 1.25}, []float64{1, 1, 1})...)
	targets := map[string]Target{}
	for _, target := range r.pairedTargets() {
		targets[target.Name] = target
	}
	status := targets["(knext) PodSandboxStatus p50, c1 <= 1.02 x (upstream), paired"]
	if status.Status != "met" || status.Measured.Median != 1.01 || status.Note != "A/A, (upstream-again) / (upstream) paired: median 1 [0.75..1.25]" {
		t.Errorf("paired c1 status target = %+v (measured %+v), want met at median 1.01 with the A/A figure", status, status.Measured)
	}
	if run := targets["(knext) RunPodSandbox p50, c8 <= 1.02 x (upstream), paired"]; run.Status != "missed" || run.Measured.Median != 1.25 {
		t.Errorf("paired c8 RunPodSandbox target = %+v, want missed at median 1.25", run)
	}
	if stop := targets["(knext) StopPodSandbox + RemovePodSandbox p50, c1 <= 1.02 x (upstream), paired"]; stop.Status != "not measured" {
		t.Errorf("paired Stop+Remove c1 target without that figure = %+v, want not measured", stop)
	}
	if _, ok := targets["(cniless) PodSandboxStatus p50, c1 <= 0.80 x (upstream), paired"]; ok {
		t.Error("a paired status target for (cniless): (cniless) is paired for its pod lifecycle only")
	}
	r.Paired = append(r.Paired, pairedRuns(cfgCNILess, []float64{0}, []float64{0.75})...)
	if got := r.pairedTargets(); !slices.ContainsFunc(got, func(t Target) bool {
		return t.Name == "(cniless) RunPodSandbox p50, c8 <= 0.80 x (upstream), paired" && t.Status == "met"
	}) {
		t.Errorf("paired targets %+v: want (cniless) RunPodSandbox c8 met at 0.75", got)
	}
	r.Paired = r.Paired[:len(r.Paired)-1]
	summaries := r.pairedSummaries()
	if len(summaries) != 4 { // c1 status and c8 RunPodSandbox, for b and u
		t.Errorf("paired summaries = %+v, want 4", summaries)
	}
}

func TestPairedBenchmarkMeasuresAAndThePairedConfigurations(t *testing.T) {
	b, err := parseBenchmarks("paired")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range configurations(50 * time.Millisecond) {
		want := c.Key == cfgUpstream || c.Key == cfgKnext || c.Key == cfgCNILess || c.Key == cfgUpstreamAgain
		if got := b.measures(c); got != want {
			t.Errorf("-benchmarks paired measures (%s): %v, want %v", c.Key, got, want)
		}
		if b.measuresAlone(c) {
			t.Errorf("-benchmarks paired measures (%s) on its own", c.Key)
		}
	}
}
