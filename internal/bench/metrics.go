package bench

import (
	"context"
	"fmt"
	"io"
	"net/http"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Plugin names of the histograms that have no plugin label.
const (
	cniTimer     = "CNI"
	kubeletTimer = "kubelet"
)

// latencyMetrics are the latency histograms the bench reads from containerd's and the kubelet's
// metrics, by name: the label that names the plugin, or its fixed name; the label that names the
// operation.
var latencyMetrics = map[string][3]string{
	// Every NRI plugin call (docs/design.md S8): lifecycle hooks and PodSandboxStatus.
	"containerd_nri_plugin_latency_seconds": {"plugin", "", "operation"},
	// CRI's CNI setup and teardown of a pod; go-metrics appends _seconds to the timer's name.
	"containerd_cri_network_plugin_operations_duration_seconds_seconds": {"", cniTimer, "operation_type"},
	"kubelet_runtime_operations_duration_seconds":                       {"", kubeletTimer, "operation_type"},
}

type timerKey struct{ plugin, operation string }

// histogram is one latency histogram, its series of a plugin and operation summed: calls and
// seconds. Its buckets are too coarse for quantiles of fast calls: the kubelet's first ends at 5 ms.
type histogram struct{ count, sum float64 }

// histograms are the latencyMetrics at one moment, by plugin and operation.
type histograms map[timerKey]histogram

func parseHistograms(r io.Reader) (histograms, error) {
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(r)
	if err != nil {
		return nil, err
	}
	hs := histograms{}
	for name, labels := range latencyMetrics {
		for _, series := range families[name].GetMetric() {
			k := timerKey{plugin: labels[1]}
			for _, l := range series.GetLabel() {
				switch l.GetName() {
				case labels[0]:
					k.plugin = l.GetValue()
				case labels[2]:
					k.operation = l.GetValue()
				}
			}
			h := series.GetHistogram()
			hs.add(histograms{k: {count: float64(h.GetSampleCount()), sum: h.GetSampleSum()}}, 1)
		}
	}
	return hs, nil
}

func fetchHistograms(ctx context.Context, url string) (histograms, error) {
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
	return parseHistograms(resp.Body)
}

// add adds sign × other to hs (the nodes of a cluster, or a difference) and returns hs.
func (hs histograms) add(other histograms, sign float64) histograms {
	for k, h := range other {
		hs[k] = histogram{count: hs[k].count + sign*h.count, sum: hs[k].sum + sign*h.sum}
	}
	return hs
}

// since returns the calls made between from and hs.
func (hs histograms) since(from histograms) histograms {
	return histograms{}.add(hs, 1).add(from, -1)
}

// pluginCalls counts the calls of operation to every plugin but CNI and the kubelet.
func (hs histograms) pluginCalls(operation string) int {
	n := 0.0
	for k, h := range hs {
		if k.operation == operation && k.plugin != cniTimer && k.plugin != kubeletTimer {
			n += h.count
		}
	}
	return int(n)
}

// mean is the mean latency in seconds, 0 without calls.
func (h histogram) mean() float64 {
	if h.count <= 0 {
		return 0
	}
	return h.sum / h.count
}
