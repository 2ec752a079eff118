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

// nriLatencyMetric is containerd's histogram of NRI plugin calls (internal/nri/metrics.go), with
// the labels plugin and operation, served on the metrics endpoint ([metrics] address).
const nriLatencyMetric = "containerd_nri_plugin_latency_seconds"

type nriKey struct{ plugin, operation string }

// nriTotals are a histogram's count and sum of seconds.
type nriTotals struct{ count, seconds float64 }

// nriLatencies are the NRI plugin latency histograms at one moment, per plugin and operation.
type nriLatencies map[nriKey]nriTotals

// since returns the calls between from and l, per plugin and operation, in a stable order.
func (l nriLatencies) since(from nriLatencies) []HookLatency {
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

// fetchNRILatencies reads the NRI plugin latencies from containerd's metrics endpoint.
func fetchNRILatencies(ctx context.Context, address string) (nriLatencies, error) {
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
	return parseNRILatencies(resp.Body)
}

// parseNRILatencies reads the _count and _sum series of nriLatencyMetric from the Prometheus
// text format.
func parseNRILatencies(r io.Reader) (nriLatencies, error) {
	l := nriLatencies{}
	lines := bufio.NewScanner(r)
	lines.Buffer(make([]byte, 0, 64*1024), 1024*1024)
	for lines.Scan() {
		line := lines.Text()
		rest, ok := strings.CutPrefix(line, nriLatencyMetric+"_")
		if !ok {
			continue
		}
		series, labelsAndValue, ok := strings.Cut(rest, "{")
		if !ok || (series != "count" && series != "sum") {
			continue
		}
		labels, value, ok := strings.Cut(labelsAndValue, "} ")
		if !ok {
			return nil, fmt.Errorf("metrics line %q: no value", line)
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(value), 64)
		if err != nil {
			return nil, fmt.Errorf("metrics line %q: %w", line, err)
		}
		k, err := nriLabels(labels)
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
	}
	return l, lines.Err()
}

// nriLabels reads the plugin and operation labels of a series (name="value",...).
func nriLabels(labels string) (nriKey, error) {
	var k nriKey
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
		case "plugin":
			k.plugin = value
		case "operation":
			k.operation = value
		}
		labels = strings.TrimPrefix(rest[end+2:], ",")
	}
	if k.plugin == "" || k.operation == "" {
		return k, fmt.Errorf("no plugin or operation label")
	}
	return k, nil
}
