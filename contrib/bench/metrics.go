package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
)

// latencyMetric is a histogram of containerd's metrics endpoint (the metrics server plugin's address) that the
// lifecycle breakdown reads, and the labels that name a plugin and an operation in its series.
type latencyMetric struct {
	name           string
	pluginLabel    string // "": the series have no plugin label and are attributed to plugin
	plugin         string
	operationLabel string // "": the series have no operation label and are attributed to operation
	operation      string
}

// cniTimer names the CNI plugins of a pod's network together: containerd times a pod's CNI
// setup and teardown as one operation, whatever plugins its conflist chains.
const cniTimer = "CNI"

var latencyMetrics = []latencyMetric{
	// NRI plugin calls (internal/nri/metrics.go).
	{name: "containerd_nri_plugin_latency_seconds", pluginLabel: "plugin", operationLabel: "operation"},
	// CRI's CNI setup and teardown of a pod (internal/cri/server/metrics.go); go-metrics appends
	// _seconds to the timer's name.
	{name: "containerd_cri_network_plugin_operations_duration_seconds_seconds", plugin: cniTimer, operationLabel: "operation_type"},
	// The kubelet's CRI calls and its pod start SLI (the cluster part reads a node's kubelet too).
	{name: "kubelet_runtime_operations_duration_seconds", plugin: kubeletTimer, operationLabel: "operation_type"},
	{name: "kubelet_pod_start_sli_duration_seconds", plugin: kubeletTimer, operation: "pod_start"},
}

// kubeletTimer names the kubelet's own histograms.
const kubeletTimer = "kubelet"

type latencyKey struct{ plugin, operation string }

// latencyTotals are a histogram's count and sum of seconds.
type latencyTotals struct{ count, seconds float64 }

// latencies are the latency histograms at one moment, per plugin and operation.
type latencies map[latencyKey]latencyTotals

// since returns the calls between from and l, per plugin and operation, in a stable order.
func (l latencies) since(from latencies) []HookLatency {
	var hooks []HookLatency
	for k, t := range l {
		calls := t.count - from[k].count
		if calls <= 0 {
			continue
		}
		hooks = append(hooks, HookLatency{Plugin: k.plugin, Operation: k.operation, Calls: int(calls),
			MeanMs: (t.seconds - from[k].seconds) / calls * 1000})
	}
	slices.SortFunc(hooks, func(a, b HookLatency) int {
		return strings.Compare(a.Plugin+" "+a.Operation, b.Plugin+" "+b.Operation)
	})
	return hooks
}

// fetchLatencies reads the latencyMetrics from containerd's metrics endpoint.
func fetchLatencies(ctx context.Context, address string) (latencies, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+address+"/v1/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("containerd metrics on %s: %w", address, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("containerd metrics on %s: %s", address, resp.Status)
	}
	return parseLatencies(resp.Body)
}

// parseLatencies reads the _count and _sum series of the latencyMetrics from the Prometheus text
// format.
func parseLatencies(r io.Reader) (latencies, error) {
	l := latencies{}
	lines := bufio.NewScanner(r)
	lines.Buffer(make([]byte, 0, 64*1024), 1024*1024)
	for lines.Scan() {
		line := lines.Text()
		for _, m := range latencyMetrics {
			rest, ok := strings.CutPrefix(line, m.name+"_")
			if !ok {
				continue
			}
			series, labelsAndValue, ok := strings.Cut(rest, "{")
			labels, value := "", ""
			if ok {
				if labels, value, ok = strings.Cut(labelsAndValue, "} "); !ok {
					return nil, fmt.Errorf("metrics line %q: no value", line)
				}
			} else if series, value, ok = strings.Cut(rest, " "); !ok {
				continue
			}
			if series != "count" && series != "sum" {
				continue
			}
			v, err := strconv.ParseFloat(strings.TrimSpace(value), 64)
			if err != nil {
				return nil, fmt.Errorf("metrics line %q: %w", line, err)
			}
			k, err := m.key(labels)
			if err != nil {
				return nil, fmt.Errorf("metrics line %q: %w", line, err)
			}
			t := l[k]
			if series == "count" {
				t.count = v
			} else {
				t.seconds = v
			}
			l[k] = t
			break
		}
	}
	return l, lines.Err()
}

// key reads the plugin and operation of a series from its labels (name="value",...).
func (m latencyMetric) key(labels string) (latencyKey, error) {
	k := latencyKey{plugin: m.plugin, operation: m.operation}
	for labels != "" {
		name, rest, ok := strings.Cut(labels, "=")
		if !ok || !strings.HasPrefix(rest, `"`) {
			return k, fmt.Errorf("malformed labels %q", labels)
		}
		end := strings.Index(rest[1:], `"`)
		if end < 0 {
			return k, fmt.Errorf("unterminated label value in %q", labels)
		}
		value := rest[1 : end+1]
		switch name {
		case m.pluginLabel:
			k.plugin = value
		case m.operationLabel:
			k.operation = value
		}
		labels = strings.TrimPrefix(rest[end+2:], ",")
	}
	if k.plugin == "" || k.operation == "" {
		return k, fmt.Errorf("no plugin or operation label")
	}
	return k, nil
}
