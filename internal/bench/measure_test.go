package bench

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/procfs"
)

func TestStatistics(t *testing.T) {
	var values []float64
	for i := 100; i >= 1; i-- { // 1..100, unsorted on purpose
		values = append(values, float64(i))
	}
	from := procfs.CPUStat{User: 10, System: 10, Idle: 100, Iowait: 10}
	to := procfs.CPUStat{User: 13, System: 11, Idle: 104, Iowait: 11, SoftIRQ: 1}
	for _, c := range []struct {
		what      string
		got, want any
	}{
		{"percentile(1..100, 0.5)", percentile(values, 0.5), 50.0},
		{"percentile(1..100, 0.99)", percentile(values, 0.99), 99.0},
		{"percentile(1..100, 1)", percentile(values, 1), 100.0},
		{"percentile(1..100, 0.001)", percentile(values, 0.001), 1.0},
		{"percentile of nothing", percentile(nil, 0.5), 0.0},
		{"spread(3, 1, 2)", *spread([]float64{3, 1, 2}), Spread{Min: 1, Median: 2, Max: 3, N: 3}},
		{"median of 4, 1, 2, 3", spread([]float64{4, 1, 2, 3}).Median, 2.5},
		{"spread of nothing", spread(nil), (*Spread)(nil)},
		{"ratio(3, 2)", fmt.Sprint(ratio(3, 2)), "1.5 true"},
		{"ratio(3, 0)", fmt.Sprint(ratio(3, 0)), "0 false"},
		{"busy share, idle and I/O wait left out", busyShare(from, to), 0.5}, // 5 of 10 s
		{"busy share of no time", busyShare(from, from), 0.0},
	} {
		if c.got != c.want {
			t.Errorf("%s = %v, want %v", c.what, c.got, c.want)
		}
	}
}

// containerd's metrics, trimmed: an NRI plugin's two operations and CNI's setup of pods.
const metricsText = `# TYPE containerd_nri_plugin_latency_seconds histogram
containerd_nri_plugin_latency_seconds_bucket{operation="RunPodSandbox",plugin="10-bridge",le="+Inf"} 4
containerd_nri_plugin_latency_seconds_sum{operation="RunPodSandbox",plugin="10-bridge"} 0.03
containerd_nri_plugin_latency_seconds_count{operation="RunPodSandbox",plugin="10-bridge"} 4
containerd_nri_plugin_latency_seconds_bucket{operation="PodSandboxStatus",plugin="10-status",le="+Inf"} 4
containerd_nri_plugin_latency_seconds_sum{operation="PodSandboxStatus",plugin="10-status"} 0.002
containerd_nri_plugin_latency_seconds_count{operation="PodSandboxStatus",plugin="10-status"} 4
# TYPE containerd_cri_network_plugin_operations_duration_seconds_seconds histogram
containerd_cri_network_plugin_operations_duration_seconds_seconds_bucket{operation_type="set_up_pod",le="+Inf"} 4
containerd_cri_network_plugin_operations_duration_seconds_seconds_sum{operation_type="set_up_pod"} 0.1
containerd_cri_network_plugin_operations_duration_seconds_seconds_count{operation_type="set_up_pod"} 4
# TYPE containerd_nri_plugin_invocations_total counter
containerd_nri_plugin_invocations_total{operation="RunPodSandbox",plugin="10-bridge"} 4
`

func TestTimersAreDeltasPerPluginAndOperation(t *testing.T) {
	before, beforeErr := parseTimers(strings.NewReader(metricsText))
	after, afterErr := parseTimers(strings.NewReader(strings.NewReplacer(
		`plugin="10-bridge"} 0.03`, `plugin="10-bridge"} 0.09`, `plugin="10-bridge"} 4`, `plugin="10-bridge"} 10`,
		`"set_up_pod"} 0.1`, `"set_up_pod"} 0.3`, `"set_up_pod"} 4`, `"set_up_pod"} 14`).Replace(metricsText)))
	if err := errors.Join(beforeErr, afterErr); err != nil {
		t.Fatal(err)
	}
	// 6 more calls taking 60 ms, 10 CNI setups taking 200 ms; the status calls unchanged, not listed.
	got := after.since(before)
	if len(got) != 2 || got[0] != (Timer{"10-bridge", "RunPodSandbox", 6, got[0].MeanMs}) || math.Abs(got[0].MeanMs-10) > 1e-9 ||
		got[1].Plugin != cniTimer || got[1].Operation != "set_up_pod" || got[1].Calls != 10 || math.Abs(got[1].MeanMs-20) > 1e-9 {
		t.Errorf("since = %+v, want 6 RunPodSandbox calls of 10-bridge at 10 ms, then 10 CNI set_up_pod at 20 ms", got)
	}
	after.add(before) // two nodes
	if got := pluginCalls(after.since(timers{}), "PodSandboxStatus"); got != 8 {
		t.Errorf("status calls of two nodes = %d, want 8", got)
	}
	if _, err := parseTimers(strings.NewReader("not metrics {")); err == nil {
		t.Error("malformed metrics were accepted")
	}
}

func TestLoadRecordsEveryCallUntilItsDeadline(t *testing.T) {
	failure := errors.New("odd call")
	ms, seconds, err := load(t.Context(), 4, 20*time.Millisecond, func(_ context.Context, i int) error {
		if i%2 == 1 {
			return failure
		}
		return nil
	})
	var failed, calls int
	if _, scanErr := fmt.Sscanf(fmt.Sprint(err), "%d of %d calls failed", &failed, &calls); scanErr != nil || !errors.Is(err, failure) ||
		len(ms) == 0 || calls != failed+len(ms) || len(ms)-failed > 4 || failed-len(ms) > 4 || seconds < 0.02 {
		t.Errorf("load = %d calls in %.3f s, error %v; want as many failed, give or take a worker's last call", len(ms), seconds, err)
	}
}

func TestSideOfAlternatesAndSwapsEachRound(t *testing.T) {
	for round, want := range map[int]string{1: "01100110", 2: "10011001"} {
		var got strings.Builder
		for k := range 8 {
			got.WriteByte(byte('0' + sideOf(k, round)))
		}
		if got.String() != want {
			t.Errorf("round %d: sides %s, want %s", round, got.String(), want)
		}
	}
}
