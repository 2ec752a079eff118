package bench

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/prometheus/procfs"
)

// latencyMetric is a latency histogram the bench reads from containerd's or the kubelet's
// metrics, and how its series name a plugin and an operation: by a label, or fixed.
type latencyMetric struct {
	name                string
	pluginLabel, plugin string
	opLabel, operation  string
}

// Plugin names of the histograms that have no plugin label.
const (
	cniTimer     = "CNI"
	kubeletTimer = "kubelet"
)

var latencyMetrics = []latencyMetric{
	// Every NRI plugin call (docs/design.md S8): lifecycle hooks and PodSandboxStatus.
	{name: "containerd_nri_plugin_latency_seconds", pluginLabel: "plugin", opLabel: "operation"},
	// CRI's CNI setup and teardown of a pod; go-metrics appends _seconds to the timer's name.
	{name: "containerd_cri_network_plugin_operations_duration_seconds_seconds", plugin: cniTimer, opLabel: "operation_type"},
	{name: "kubelet_runtime_operations_duration_seconds", plugin: kubeletTimer, opLabel: "operation_type"},
	{name: "kubelet_pod_start_sli_duration_seconds", plugin: kubeletTimer, operation: "pod_start"},
}

type timerKey struct{ plugin, operation string }

// timers are the latencyMetrics at one moment: per plugin and operation, calls and seconds.
type timers map[timerKey][2]float64

// Timer is the calls of one operation of one plugin between two readings, and their mean.
type Timer struct {
	Plugin    string  `json:"plugin"`
	Operation string  `json:"operation"`
	Calls     int     `json:"calls"`
	MeanMs    float64 `json:"meanMs"`
}

func parseTimers(r io.Reader) (timers, error) {
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(r)
	if err != nil {
		return nil, err
	}
	t := timers{}
	for _, m := range latencyMetrics {
		for _, series := range families[m.name].GetMetric() {
			k := timerKey{m.plugin, m.operation}
			for _, l := range series.GetLabel() {
				switch l.GetName() {
				case m.pluginLabel:
					k.plugin = l.GetValue()
				case m.opLabel:
					k.operation = l.GetValue()
				}
			}
			h := series.GetHistogram()
			t[k] = [2]float64{t[k][0] + float64(h.GetSampleCount()), t[k][1] + h.GetSampleSum()}
		}
	}
	return t, nil
}

func fetchTimers(ctx context.Context, url string) (timers, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("metrics %s: %s", url, resp.Status)
	}
	return parseTimers(resp.Body)
}

// add sums other into t (the nodes of a cluster).
func (t timers) add(other timers) {
	for k, v := range other {
		t[k] = [2]float64{t[k][0] + v[0], t[k][1] + v[1]}
	}
}

// since returns the calls made between from and t, sorted by plugin and operation.
func (t timers) since(from timers) []Timer {
	var out []Timer
	for k, v := range t {
		if calls := v[0] - from[k][0]; calls > 0 {
			out = append(out, Timer{k.plugin, k.operation, int(calls), (v[1] - from[k][1]) / calls * 1000})
		}
	}
	slices.SortFunc(out, func(a, b Timer) int {
		return strings.Compare(a.Plugin+" "+a.Operation, b.Plugin+" "+b.Operation)
	})
	return out
}

// pluginCalls counts the calls of operation to every plugin but CNI and the kubelet.
func pluginCalls(ts []Timer, operation string) int {
	n := 0
	for _, t := range ts {
		if t.Operation == operation && t.Plugin != cniTimer && t.Plugin != kubeletTimer {
			n += t.Calls
		}
	}
	return n
}

// busyShare is the share of the machine's CPUs busy between two /proc/stat readings.
func busyShare(from, to procfs.CPUStat) float64 {
	busy := func(c procfs.CPUStat) float64 { return c.User + c.Nice + c.System + c.IRQ + c.SoftIRQ + c.Steal }
	total := busy(to) + to.Idle + to.Iowait - busy(from) - from.Idle - from.Iowait
	share, _ := ratio(busy(to)-busy(from), total)
	return share
}
