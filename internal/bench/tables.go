package bench

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"strings"

	"golang.org/x/perf/benchmath"
)

// Table is one of the report's tables, printed after a run and written into docs/performance.md.
type Table struct {
	ID     string // its region in the page: <!-- bench:ID --> ... <!-- /bench:ID -->
	Title  string
	Header []string
	Rows   [][]string
}

func (t Table) markdown() string {
	if len(t.Rows) == 0 {
		return t.Title + "\n\n(not measured in this run)\n"
	}
	lines := []string{t.Title, "", "| " + strings.Join(t.Header, " | ") + " |", "|" + strings.Repeat(" --- |", len(t.Header))}
	for _, row := range t.Rows {
		lines = append(lines, "| "+strings.Join(row, " | ")+" |")
	}
	return strings.Join(lines, "\n") + "\n"
}

// aaPair is every metric's A/A pair: upstream again against upstream, in the same rounds.
var aaPair = pairing{cfgUpstream, cfgUpstreamAgain}

// target is a limit on the median ratio of a configuration to its base in each of its metrics.
type target struct {
	what    string // what it tells a user
	p       pairing
	metrics []string
	limit   float64
}

var (
	statusMetrics    = []string{"Status/c1", "Status/c16", "Status/c1-verbose", "Status/c16-verbose"}
	lifecycleMetrics = []string{"RunPodSandbox/c1", "RunPodSandbox/c8", "StopRemove/c1", "StopRemove/c8"}
	targets          = []target{
		{"Cost when unused: PodSandboxStatus", pairing{cfgUpstream, cfgKnext}, statusMetrics, 1.02},
		{"Cost when unused: pod start and removal", pairing{cfgUpstream, cfgKnext}, lifecycleMetrics, 1.02},
		{"A plugin that reports IPs at RunPodSandbox, never asked again: PodSandboxStatus", pairing{cfgUpstream, cfgRunPlugin},
			statusMetrics, 1.02},
		{"CNI-less pod start against the floor (a plugin that answers an IP and wires nothing)",
			pairing{cfgCNILessPlugin, cfgCNILess}, lifecycleMetrics[:2], 1.03},
		{"CNI-less stop and removal", pairing{cfgUpstream, cfgCNILess}, lifecycleMetrics[2:], 0.7},
		{"Cluster: pods Ready with their IPs", pairing{cfgUpstream, cfgKnext}, clusterFigures[:2], 1},
		{"Cluster: then in the EndpointSlice", pairing{cfgUpstream, cfgKnext}, clusterFigures[2:4], 1},
	}
)

// Verdicts.
const (
	met         = "met"
	missed      = "missed"
	unresolved  = "unresolved"
	notMeasured = "not measured"
)

// finite tells whether s is a summary with a finite interval.
func finite(s *benchmath.Summary) bool {
	return s != nil && !math.IsInf(s.Lo, 0) && !math.IsInf(s.Hi, 0)
}

// judge judges ratio against limit on its interval widened by how far the A/A pair's own interval
// reaches from 1 on either side: met when all of it is within the limit, missed when all of it
// is beyond, unresolved otherwise (the machine cannot tell), and without a finite A/A interval.
func judge(ratio, aa *benchmath.Summary, limit float64) string {
	switch {
	case ratio == nil:
		return notMeasured
	case !finite(ratio) || !finite(aa):
		return unresolved
	case ratio.Hi+max(0, 1-aa.Lo) <= limit:
		return met
	case ratio.Lo-max(0, aa.Hi-1) > limit:
		return missed
	}
	return unresolved
}

// overall is a target's verdict: missed if any metric's is, theirs if all agree, else unresolved.
func overall(verdicts []string) string {
	switch {
	case slices.Contains(verdicts, missed):
		return missed
	case slices.ContainsFunc(verdicts, func(v string) bool { return v != verdicts[0] }):
		return unresolved
	}
	return verdicts[0]
}

// cell is a ratio's median and 95% interval; ∞ where too few values bound it.
func cell(s *benchmath.Summary) string {
	if s == nil {
		return "–"
	}
	return strings.NewReplacer("+Inf", "∞", "-Inf", "-∞").Replace(fmt.Sprintf("%.2f [%.2f–%.2f]", s.Center, s.Lo, s.Hi))
}

// pValue is benchmath's test of whether config's ratios to base in metric differ from the A/A
// pair's (Mann-Whitney U): its p-value and the sizes of the two samples; "–" without values.
func (s samples) pValue(metric string, p pairing) string {
	x, y := s[pairName(metric, aaPair)][ratioUnit], s[pairName(metric, p)][ratioUnit]
	if len(x) == 0 || len(y) == 0 {
		return "–"
	}
	c := benchmath.AssumeNothing.Compare(benchmath.NewSample(slices.Clone(x), &benchmath.DefaultThresholds),
		benchmath.NewSample(slices.Clone(y), &benchmath.DefaultThresholds))
	return fmt.Sprintf("%.3f (n=%d+%d)", c.P, c.N1, c.N2)
}

// targetRows are, for each target, a row per metric: the ratio, the A/A pair's, benchmath's test
// of whether they differ, and the verdict; and each target's overall verdict.
func (s samples) targetRows() (rows [][][]string, verdicts []string) {
	for _, t := range targets {
		var vs []string
		var own [][]string
		name := fmt.Sprintf("%s: (%s) ≤ %.2f × (%s)", t.what, t.p.config, t.limit, t.p.base) // on its first row only
		for _, m := range t.metrics {
			ratio, aa := s.ratio(m, t.p), s.ratio(m, aaPair)
			v := judge(ratio, aa, t.limit)
			vs, own = append(vs, v), append(own, []string{name, m, cell(ratio), cell(aa), s.pValue(m, t.p), v})
			name = ""
		}
		rows, verdicts = append(rows, own), append(verdicts, overall(vs))
	}
	return rows, verdicts
}

// column is a metric of a pairing table: the configuration's median, scaled, and its ratio to the
// base's unless absolute.
type column struct {
	metric, header string
	scale          float64
	format, unit   string // unit: sec/op unless set
	absolute       bool
}

// pairTable has a row for each pairing with measurements: the configuration's median figure of
// each column and its ratio to the base's with its interval; and first a row of the first
// pairing's base, against nothing ("–").
func (s samples) pairTable(id, title string, pairs []pairing, cols []column) Table {
	t := Table{ID: id, Title: title, Header: []string{"configuration", "against"}}
	for _, c := range cols {
		if t.Header = append(t.Header, c.header); !c.absolute {
			t.Header = append(t.Header, "× base [95% CI]")
		}
	}
	for _, p := range slices.Concat([]pairing{{"–", pairs[0].base}}, pairs) {
		cells, empty := []string{p.config, p.base}, true
		for _, c := range cols {
			cells = append(cells, "–")
			if abs := s.absolute(c.metric, p.config, cmp.Or(c.unit, secPerOp)); abs != nil {
				cells[len(cells)-1], empty = fmt.Sprintf(c.format, c.scale*abs.Center), false
			}
			if !c.absolute {
				cells = append(cells, cell(s.ratio(c.metric, p)))
			}
		}
		if !empty {
			t.Rows = append(t.Rows, cells)
		}
	}
	return t
}

func (s samples) tables(c settings) []Table {
	targetRows, _ := s.targetRows()
	// columns are the metrics' medians in ms, headed by their name without the part's prefix.
	columns := func(prefix, suffix, format string, metrics ...string) (cols []column) {
		for _, m := range metrics {
			cols = append(cols, column{metric: m, header: strings.TrimPrefix(m, prefix) + suffix, scale: 1e3, format: format})
		}
		return cols
	}
	seconds := func(metric, header, format string) column {
		return column{metric: metric, header: header + " s", scale: 1, format: format}
	}
	statusCols := append(columns("Status/", " p50 ms", "%.3f", statusMetrics...), column{metric: "PluginCalls/c1",
		header: "plugin calls per query", scale: 1, format: "%.2f", unit: "calls/op", absolute: true})
	clusterCols := append(columns("Cluster/", " ms", "%.0f", clusterFigures[:4]...),
		seconds("Cluster/update", "update", "%.1f"), seconds("Cluster/fill", "fill", "%.1f"))
	nodeCols := append(columns("Cluster/", " ms", "%.2f", clusterFigures[6:11]...), column{metric: "Cluster/network-share",
		header: "% of RunPodSandbox", scale: 100, format: "%.0f", unit: "share"})
	clusterPairs := []pairing{{cfgUpstream, cfgKnext}, aaPair}
	return []Table{
		{ID: "targets", Title: "Targets: the median ratio over every paired measurement, its 95% interval, the A/A pair's, " +
			"and benchmath's p-value that the two differ", Header: []string{"target", "metric", "ratio [95% CI]", "A/A [95% CI]", "p (vs A/A)", "verdict"},
			Rows: slices.Concat(targetRows...)},
		s.pairTable("status", "PodSandboxStatus p50 in ms, and the paired ratio to the base", statusPairs, statusCols),
		s.pairTable("lifecycle", "Pod start and removal p50 in ms, and the paired ratio to the base", lifecyclePairs,
			columns("", " ms", "%.1f", lifecycleMetrics...)),
		s.pairTable("scale", fmt.Sprintf("%d pods per configuration, each restarted once a round", c.ScalePods), scalePairs, []column{
			{metric: "ScaleSweep", header: "status sweep ms", scale: 1e3, format: "%.1f"},
			seconds("RestartReady", "restart: CRI ready", "%.2f"), seconds("RestartAnswered", "every pod answered", "%.2f")}),
		s.pairTable("cluster", fmt.Sprintf("A Deployment of %d pods on %d-node clusters: a new template rolled out (per pod, p50 "+
			"and p99; the update until complete), and the fill of one node to %d pods", c.ClusterPods, c.ClusterNodes, c.NodePods),
			clusterPairs, clusterCols),
		s.pairTable("cluster-endpoints", "The rollout's pods from Ready to their endpoints (p50, as above), taken apart at the start of "+
			"the controller-manager's sync of the EndpointSlices that published them: the p50 of the waits until it started, and "+
			"from then until the IPs were seen", clusterPairs, columns("Cluster/", " ms", "%.0f", clusterFigures[2], endpointFigures[0], endpointFigures[1])),
		s.pairTable("cluster-node", fmt.Sprintf("The node filled to %d pods: PodSandboxStatus by the kubelet's histogram (its mean) and over "+
			"CRI (p50, p99); the network's setup per pod and its share of the kubelet's RunPodSandbox", c.NodePods), clusterPairs, nodeCols),
	}
}
