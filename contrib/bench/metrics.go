package main

import (
	"context"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"

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

// histogram is one latency histogram, its series of a plugin and operation summed: calls,
// seconds, and the cumulative calls of each bucket by its upper bound.
type histogram struct {
	count, sum float64
	buckets    map[float64]float64
}

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
			hs.add(k, histogram{count: float64(h.GetSampleCount()), sum: h.GetSampleSum(), buckets: map[float64]float64{}}, 1)
			for _, b := range h.GetBucket() {
				hs[k].buckets[b.GetUpperBound()] += float64(b.GetCumulativeCount())
			}
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

// add adds sign × h to hs[k].
func (hs histograms) add(k timerKey, h histogram, sign float64) {
	sum := hs[k]
	sum.count, sum.sum = sum.count+sign*h.count, sum.sum+sign*h.sum
	if sum.buckets == nil {
		sum.buckets = map[float64]float64{}
	}
	for bound, calls := range h.buckets {
		sum.buckets[bound] += sign * calls
	}
	hs[k] = sum
}

// plus sums other into hs (the nodes of a cluster).
func (hs histograms) plus(other histograms) histograms {
	for k, h := range other {
		hs.add(k, h, 1)
	}
	return hs
}

// since returns the calls made between from and hs.
func (hs histograms) since(from histograms) histograms {
	delta := histograms{}.plus(hs)
	for k, h := range from {
		delta.add(k, h, -1)
	}
	return delta
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

// bound is the upper bound of the bucket the q-quantile falls into: as finely as the histogram
// tells it.
func (h histogram) bound(q float64) float64 {
	bounds := slices.Sorted(maps.Keys(h.buckets))
	i := slices.IndexFunc(bounds, func(b float64) bool { return h.buckets[b] >= q*h.count })
	if i < 0 || h.count <= 0 {
		return 0
	}
	return bounds[i]
}
