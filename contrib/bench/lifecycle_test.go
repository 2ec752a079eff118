package main

import (
	"bufio"
	"math"
	"strings"
	"testing"
	"time"
)

// containerd's metrics endpoint, trimmed: an NRI plugin's two operations and CNI's setup of pods;
// buckets and other metrics ignored.
const metricsText = `# HELP containerd_nri_plugin_latency_seconds NRI plugin operation latency
# TYPE containerd_nri_plugin_latency_seconds histogram
containerd_nri_plugin_latency_seconds_bucket{operation="RunPodSandbox",plugin="10-bridge",le="0.005"} 3
containerd_nri_plugin_latency_seconds_sum{operation="RunPodSandbox",plugin="10-bridge"} 0.03
containerd_nri_plugin_latency_seconds_count{operation="RunPodSandbox",plugin="10-bridge"} 4
containerd_nri_plugin_latency_seconds_sum{operation="PodSandboxStatus",plugin="10-bridge"} 0.002
containerd_nri_plugin_latency_seconds_count{operation="PodSandboxStatus",plugin="10-bridge"} 4
containerd_nri_plugin_invocations_total{error="",operation="RunPodSandbox",plugin="10-bridge",status="success"} 4
containerd_cri_network_plugin_operations_duration_seconds_seconds_bucket{operation_type="set_up_pod",le="0.025"} 2
containerd_cri_network_plugin_operations_duration_seconds_seconds_sum{operation_type="set_up_pod"} 0.1
containerd_cri_network_plugin_operations_duration_seconds_seconds_count{operation_type="set_up_pod"} 4
containerd_cri_network_plugin_operations_total_total{operation_type="set_up_pod"} 4
`

func TestLatenciesAreDeltasPerPluginAndOperation(t *testing.T) {
	before, err := parseLatencies(strings.NewReader(metricsText))
	if err != nil {
		t.Fatal(err)
	}
	after, err := parseLatencies(strings.NewReader(strings.NewReplacer(
		`RunPodSandbox",plugin="10-bridge"} 0.03`, `RunPodSandbox",plugin="10-bridge"} 0.09`,
		`RunPodSandbox",plugin="10-bridge"} 4`, `RunPodSandbox",plugin="10-bridge"} 10`,
		`set_up_pod"} 0.1`, `set_up_pod"} 0.3`, `set_up_pod"} 4`, `set_up_pod"} 14`).Replace(metricsText)))
	if err != nil {
		t.Fatal(err)
	}
	got := after.since(before)
	// 6 more calls taking 60 ms in all, 10 CNI setups taking 200 ms; PodSandboxStatus unchanged, so
	// not listed.
	if len(got) != 2 || got[0].Plugin != "10-bridge" || got[0].Operation != "RunPodSandbox" || got[0].Calls != 6 ||
		math.Abs(got[0].MeanMs-10) > 1e-9 ||
		got[1].Plugin != cniTimer || got[1].Operation != "set_up_pod" || got[1].Calls != 10 || math.Abs(got[1].MeanMs-20) > 1e-9 {
		t.Errorf("since = %+v, want 6 RunPodSandbox calls of 10-bridge at 10 ms, then 10 CNI set_up_pod at 20 ms", got)
	}
	if got[1].step() != "CNI set_up_pod per call, all plugins (containerd's timer)" || got[0].step() != "NRI RunPodSandbox of 10-bridge" {
		t.Errorf("steps %q, %q", got[0].step(), got[1].step())
	}
	if _, err := parseLatencies(strings.NewReader(`containerd_nri_plugin_latency_seconds_sum{plugin="x"} 1` + "\n")); err == nil {
		t.Error("a series without an operation label was accepted")
	}
}

func TestHookLatenciesSplitThePhases(t *testing.T) {
	k := latencyKey{"10-bridge", "RunPodSandbox"}
	s := latencyKey{"10-bridge", "StopPodSandbox"}
	st := latencyKey{"10-bridge", "PodSandboxStatus"}
	// Between the phases, the benchmark's own status queries: in neither phase.
	afterRun := latencies{k: {2, 0.01}}
	beforeRemove := latencies{k: {2, 0.01}, st: {2, 0.001}}
	hooks := hookLatencies(latencies{}, afterRun, beforeRemove, latencies{k: {2, 0.01}, st: {2, 0.001}, s: {2, 0.004}})
	if len(hooks) != 2 || hooks[0].Phase != "run" || hooks[0].Operation != "RunPodSandbox" ||
		hooks[1].Phase != "stop+remove" || hooks[1].Operation != "StopPodSandbox" || math.Abs(hooks[1].MeanMs-2) > 1e-9 {
		t.Errorf("hooks = %+v, want RunPodSandbox in run, StopPodSandbox (2 ms) in stop+remove, nothing else", hooks)
	}
	if hookLatencies(nil, nil, nil, nil) != nil {
		t.Error("hooks without metrics are not nil")
	}
}

func TestBridgeTimingsFromItsLog(t *testing.T) {
	log := `time="x" level=info msg="nri-bridge: pod knext-test/p1 (sandbox 1): eth0 [10.0.0.2/24] via nbr1 (stored 4ms, wired 2.5ms)"
time="x" level=info msg="nri-bridge: pod knext-test/p2 (sandbox 2): eth0 [10.0.0.3/24] via nbr2 (stored 2ms, wired 500µs)"
time="x" level=info msg="nri-bridge: pod knext-test/p1 (sandbox 1): released [10.0.0.2/24] (detached 300µs, unwired 10ms, released 1ms)"
time="x" level=info msg="nri-bridge: synchronized: 2 pods from the runtime, 2 allocations kept"
`
	got := parseBridgeTimings(bufio.NewScanner(strings.NewReader(log)), 2)
	if got.Setups != 2 || got.StoredMs != 3 || got.WiredMs != 1.5 || got.Releases != 1 || got.DetachedMs != 0.3 ||
		got.UnwiredMs != 10 || got.ReleasedMs != 1 {
		t.Errorf("timings = %+v, want 2 setups (3 ms, 1.5 ms) and 1 release (0.3 ms, 10 ms, 1 ms)", got)
	}
	if !strings.Contains(got.Error, "1 releases for 2 pods") {
		t.Errorf("error %q, want the missing release named", got.Error)
	}
}

func TestCNITraceCountsOnlyWhatContainerdRan(t *testing.T) {
	trace := strings.Join([]string{
		"loopback ADD 0 2000000 0 c1",
		"host-local ADD 1 3000000 0 c1",
		"bridge ADD 0 10000000 0 c1",
		"portmap ADD 0 1000000 0 c1",
		"bridge DEL 0 4000000 0 c1",
		"bridge DEL 0 2000000 0 c1",
	}, "\n")
	got, err := parseCNITrace(bufio.NewScanner(strings.NewReader(trace)), 1)
	if err != nil {
		t.Fatal(err)
	}
	// host-local ran inside bridge: its 3 ms are part of bridge's 10 ms.
	if got.AddPerPodMs != 13 || got.DelPerPodMs != 6 {
		t.Errorf("per pod ADD %v ms, DEL %v ms; want 13 and 6", got.AddPerPodMs, got.DelPerPodMs)
	}
	var bridgeDel *CNIExecution
	for i, e := range got.Executions {
		if e.Plugin == "bridge" && e.Command == "DEL" {
			bridgeDel = &got.Executions[i]
		}
		if e.Plugin == "host-local" && !e.Nested {
			t.Errorf("host-local not marked nested: %+v", e)
		}
	}
	if bridgeDel == nil || bridgeDel.Calls != 2 || bridgeDel.MeanMs != 3 {
		t.Errorf("bridge DEL = %+v, want 2 calls of 3 ms", bridgeDel)
	}
	if _, err := parseCNITrace(bufio.NewScanner(strings.NewReader("bridge ADD 0 100 1 c1")), 1); err == nil ||
		!strings.Contains(err.Error(), "bridge ADD exited with 1") {
		t.Errorf("failed plugin: error %v, want one naming it", err)
	}
}

// lifecycleRuns builds runs of configuration key with run and stop+remove p50s per round, at
// both concurrencies.
func lifecycleRuns(key string, run, stopRemove []float64) []*Run {
	var out []*Run
	for i := range run {
		r := &Run{Config: key, Round: i + 1}
		for _, width := range lifecycleWidths {
			s := LifecycleSample{Concurrency: width, Pods: 2, RunMs: []float64{run[i], run[i]},
				StopRemoveMs: []float64{stopRemove[i], stopRemove[i]}}
			s.summarize()
			r.Lifecycle = append(r.Lifecycle, s)
		}
		out = append(out, r)
	}
	return out
}

func TestLifecycleTargetsJudgePerRoundRatios(t *testing.T) {
	r := &report{Configurations: configurations(50 * time.Millisecond)}
	r.Runs = append(lifecycleRuns(cfgUpstream, []float64{100, 200, 100}, []float64{100, 100, 100}),
		lifecycleRuns(cfgKnext, []float64{101, 202, 110}, []float64{103, 103, 103})...)
	r.Runs = append(r.Runs, lifecycleRuns(cfgCNILess, []float64{70, 160, 90}, []float64{70, 70, 70})...)

	// b run: 1.01, 1.01, 1.10 -> median 1.01 (met); b stop+remove 1.03 (missed).
	if got := target(t, r, "(knext) RunPodSandbox p50 <= 1.02 x (upstream), c1"); got.Status != "met" || got.Measured.Median != 1.01 {
		t.Errorf("(knext) run target = %+v (measured %+v), want met at 1.01", got, got.Measured)
	}
	if got := target(t, r, "(knext) StopPodSandbox + RemovePodSandbox p50 <= 1.02 x (upstream), c8"); got.Status != "missed" {
		t.Errorf("(knext) stop+remove target = %+v, want missed at 1.03", got)
	}
	// g run: 0.7, 0.8, 0.9 -> median 0.8 (met: the limit is inclusive).
	if got := target(t, r, "(cniless) RunPodSandbox p50 <= 0.80 x (upstream), c8"); got.Status != "met" || got.Measured.Max != 0.9 {
		t.Errorf("(cniless) run target = %+v (measured %+v), want met at median 0.8, max 0.9", got, got.Measured)
	}
	sum := r.lifecycleSummary(cfgCNILess, 1)
	if sum.Pods != 6 || sum.PooledRunP50Ms != 90 || sum.PooledRunP99Ms != 160 || sum.RunP50Ms.Median != 90 {
		t.Errorf("summary = %+v, want 6 pooled pods, pooled p50 90, p99 160", sum)
	}
	r.Configurations = configurations(50 * time.Millisecond)[:2]
	if got := target(t, r, "(cniless) RunPodSandbox p50 <= 0.80 x (upstream), c1"); got.Status != "not measured" {
		t.Errorf("(cniless) target without (cniless) = %+v, want not measured", got)
	}
}

func TestStatusOverheadIsBeyondUpstreamAndTheRoundTrip(t *testing.T) {
	r := &report{Configurations: configurations(50 * time.Millisecond)}
	r.Runs = append(runs(cfgUpstream, 0.2, 0.2, 0.4), runs(cfgOnePlugin, 0.5, 0.3, 0.6)...)
	for i, ping := range []float64{0.25, 0.05, 0.15} {
		// The multiplexed round trip and the one after an idle gap are shown, never subtracted
		// by the target: they are not the floor. Listed first, they must not be taken for it.
		r.Runs[3+i].Ping = []PingSample{{Concurrency: 1, IdleGapMs: 0.5, Calls: 10, P50Ms: ping + 0.05},
			{Concurrency: 1, Multiplexed: true, Calls: 10, P50Ms: 10}, {Concurrency: 1, Calls: 10, P50Ms: ping}}
	}
	for _, run := range r.Runs { // c1 verbose: the plain round trip applies, the idle one's gap does not
		run.Status = append(run.Status, StatusSample{variant: variant{1, true}, Calls: 100, P50Ms: 1 + run.Status[0].P50Ms})
	}
	// Overheads 0.05, 0.05, 0.05 ms over (upstream) 0.2, 0.2, 0.4: fractions 0.25, 0.25, 0.125.
	name := "(knext-1-plugin) PodSandboxStatus runtime-side overhead beyond the raw round trip <= 0.20 x (upstream)'s query, c1"
	got := target(t, r, name)
	if got.Status != "missed" || math.Abs(got.Measured.Median-0.25) > 1e-9 || math.Abs(got.Measured.Min-0.125) > 1e-9 {
		t.Errorf("overhead target = %+v (measured %+v), want missed at median 0.25", got, got.Measured)
	}
	o := r.overheadSummaries()
	if len(o) != 2 || o[1].Variant != "c1 verbose" || o[1].PingP50Ms.Median != 0.15 || o[1].IdlePingP50Ms != nil || o[1].IdleFractionOfA != nil {
		t.Errorf("overhead summaries = %+v, want c1 verbose second, with the plain round trip and without the idle one", o)
	}
	if len(o) == 0 || o[0].Variant != "c1" || math.Abs(o[0].OverheadMs.Median-0.05) > 1e-9 ||
		o[0].MultiplexedPingP50Ms.Median != 10 || o[0].PingP50Ms.Median != 0.15 {
		t.Errorf("overhead summaries = %+v, want c1 first, 0.05 ms, plain round trip 0.15 ms and multiplexed 10 ms", o)
	} else if idle := o[0]; math.Abs(idle.IdlePingP50Ms.Median-0.2) > 1e-9 || math.Abs(idle.IdleFractionOfA.Max) > 1e-9 ||
		math.Abs(idle.IdleFractionOfA.Min) > 1e-9 {
		// 0.05 ms slower after the gap: no overhead beyond it in any round.
		t.Errorf("overhead beyond the round trip after an idle gap = %+v, %+v, want 0.2 ms and 0", idle.IdlePingP50Ms, idle.IdleFractionOfA)
	}
}

func TestScaleSummaryRatiosPairRounds(t *testing.T) {
	r := &report{Settings: settings{ScalePods: 200}}
	r.Scale = []ScaleSample{
		{Config: cfgUpstream, Round: 1, SweepMs: 100, AnsweredSeconds: 2},
		{Config: cfgUpstream, Round: 2, SweepMs: 200, AnsweredSeconds: 2},
		{Config: cfgOnePlugin, Round: 1, SweepMs: 150, AnsweredSeconds: 3},
		{Config: cfgOnePlugin, Round: 2, SweepMs: 300, AnsweredSeconds: 1},
	}
	got := r.scaleSummaries()
	if len(got) != 2 || got[1].Config != cfgOnePlugin || got[1].SweepRatioToA.Median != 1.5 || got[1].AnsweredRatioToA.Min != 0.5 {
		t.Errorf("scale summaries = %+v, want (knext-1-plugin) sweep ratio 1.5, answered ratios 1.5 and 0.5", got)
	}
}

func TestParseBenchmarks(t *testing.T) {
	b, err := parseBenchmarks("lifecycle, scale")
	if err != nil || b.Status || !b.Lifecycle || !b.Scale {
		t.Errorf("parse lifecycle,scale = %+v, %v", b, err)
	}
	if _, err := parseBenchmarks("status,speed"); err == nil || !strings.Contains(err.Error(), `"speed"`) {
		t.Errorf("unknown benchmark: error %v, want one naming it", err)
	}
	g := configurations(time.Second)[6]
	if !b.measures(g) || (benchmarks{Status: true}).measures(g) {
		t.Error("g is measured by the lifecycle benchmark only")
	}
}
