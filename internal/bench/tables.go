package bench

import (
	"fmt"
	"maps"
	"slices"
	"strings"
)

// Table is one of the report's tables, printed after a run and written into docs/performance.md.
type Table struct {
	ID     string // its region in the page: <!-- bench:ID --> ... <!-- /bench:ID -->
	Title  string
	Header []string
	Rows   [][]string
}

// column is a column of a table whose rows are configurations: the median of a figure over the
// row's rounds; with ratio, of each round's ratio to upstream's, with its range.
type column struct {
	header, format string
	figure         func(key string, toUpstream bool) []float64
	ratio          bool
}

// timesUpstream, after a column, is the ratio to upstream's of that column's figure.
var timesUpstream = column{header: "× upstream", format: "%.2f", ratio: true}

func (c column) values(key string) []float64 { return c.figure(key, c.ratio) }

func (r *report) pairColumn(header, format string, f figure) column {
	return column{header: header, format: format, figure: func(key string, toUpstream bool) []float64 { return r.pairValues(key, f, toUpstream) }}
}

// roundColumns makes columns of the parts that measure one configuration at a time (scale,
// cluster): a sample's ratio is to upstream's sample of the same round.
func roundColumns[S any](samples []S, keyRound func(S) (string, int)) func(header, format string, f func(S) float64) column {
	return func(header, format string, f func(S) float64) column {
		return column{header: header, format: format, figure: func(key string, toUpstream bool) []float64 {
			base := map[int]float64{}
			for _, s := range samples {
				if k, round := keyRound(s); k == cfgUpstream {
					base[round] = f(s)
				}
			}
			var values []float64
			for _, s := range samples {
				k, round := keyRound(s)
				switch q, ok := ratio(f(s), base[round]); {
				case k != key: // another configuration's
				case !toUpstream:
					values = append(values, f(s))
				case ok && key != cfgUpstream:
					values = append(values, q)
				}
			}
			return values
		}}
	}
}

func cell(s *Spread, format string, withRange bool) string {
	switch {
	case s == nil:
		return "–"
	case withRange && s.N > 1:
		return fmt.Sprintf(format+" ["+format+"–"+format+"]", s.Median, s.Min, s.Max)
	}
	return fmt.Sprintf(format, s.Median)
}

// configTable has a row for each configuration of keys with any figure.
func configTable(id, title string, keys []string, cols ...column) Table {
	t := Table{ID: id, Title: title, Header: []string{"configuration"}}
	var previous func(key string, toUpstream bool) []float64
	for i, c := range cols {
		if c.figure == nil { // timesUpstream
			cols[i].figure = previous
		}
		previous = cols[i].figure
		t.Header = append(t.Header, c.header)
	}
	for _, key := range keys {
		row, empty := []string{key}, true
		for _, c := range cols {
			s := spread(c.values(key))
			row, empty = append(row, cell(s, c.format, c.ratio)), empty && s == nil
		}
		if !empty {
			t.Rows = append(t.Rows, row)
		}
	}
	return t
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

// p50Columns are a column of each figure, with its ratio to upstream's when ratios is set.
func (r *report) p50Columns(figures []namedFigure, unit, format string, ratios bool) (cols []column) {
	for _, nf := range figures {
		cols = append(cols, r.pairColumn(nf.name+unit, format, nf.f))
		if ratios {
			cols = append(cols, timesUpstream)
		}
	}
	return cols
}

func (r *report) tables() []Table {
	keys := configKeys(r.Configurations)
	c1, c16 := variants[0], variants[1]
	load := func(header, format string, v variant, field func(Load) float64) column {
		return r.pairColumn(header, format, statusFigure(v, field))
	}
	p99 := func(l Load) float64 { return l.P99Ms }
	perSecond := func(l Load) float64 { return l.PerSecond }
	var overhead []column
	for _, v := range variants[:2] {
		beyond := r.pairColumn("beyond it and upstream's query, × upstream's", "%.2f", overheadFigure(v.Concurrency))
		beyond.ratio = true
		overhead = append(overhead, r.pairColumn(v.String()+" round trip p50 ms", "%.3f", pingFigure(v.Concurrency)), beyond)
	}
	scale := roundColumns(r.Scale, func(s ScaleSample) (string, int) { return s.Config, s.Round })
	persisted := func(header string, f func(PersistedBytes) float64) column {
		return column{header: header, format: "%.0f", figure: func(key string, _ bool) []float64 {
			i := slices.IndexFunc(r.Persisted, func(p PersistedBytes) bool { return p.Config == key && f(p) > 0 })
			if i < 0 {
				return nil
			}
			return []float64{f(r.Persisted[i])}
		}}
	}
	// Its rows are the clusters' runtimes, knext and upstream, under the configurations' names.
	cluster := roundColumns(r.Cluster, func(c *ClusterRun) (string, int) { return c.Runtime, c.Round })
	return []Table{
		r.targetTable(),
		configTable("status", "PodSandboxStatus p50 in ms, and its paired ratio to upstream's", keys,
			r.p50Columns(statusFigures(variants), " p50 ms", "%.3f", true)...),
		configTable("status-detail", "PodSandboxStatus p99, throughput and plugin calls per query", keys,
			load("c1 p99 ms", "%.3f", c1, p99), load("c16 p99 ms", "%.3f", c16, p99),
			load("c1 calls/s", "%.0f", c1, perSecond), load("c16 calls/s", "%.0f", c16, perSecond),
			load("plugin calls per query", "%.2f", c1, func(l Load) float64 { return l.PluginCalls })),
		configTable("overhead", "The raw ttrpc round trip to the status plugin's process, and the query beyond it", keys, overhead...),
		configTable("calls", "Plugin calls outside the timed queries (C7), and pod starts during a status storm (S3)", keys,
			r.pairColumn("plugin calls per burst of 16 queries, per plugin", "%.2f", burstFigure),
			r.pairColumn("container events with the pod IP", "%.0f", func(run *PairRun, side int) (float64, bool) {
				return float64(run.EventsWithIP), run.EventCalls != nil && side == 1 // where the events were measured
			}),
			r.pairColumn("plugin calls for them", "%.0f", own(func(run *PairRun) *float64 { return run.EventCalls })),
			r.pairColumn("RunPodSandbox p50 ms during a 16-way status storm", "%.1f", stormFigure), timesUpstream),
		configTable("lifecycle", "Pod start and removal p50 in ms, and its paired ratio to upstream's", keys,
			r.p50Columns(lifecycleFigures(), " ms", "%.1f", true)...),
		r.stepsTable(keys),
		configTable("scale", fmt.Sprintf("%d pods per configuration, median over the restarts", r.Settings.ScalePods), scaleConfigs,
			scale("status sweep ms", "%.1f", func(s ScaleSample) float64 { return s.SweepMs }), timesUpstream,
			scale("per query p50 ms", "%.3f", func(s ScaleSample) float64 { return s.SweepP50Ms }),
			scale("restart: CRI ready s", "%.2f", func(s ScaleSample) float64 { return s.ReadySeconds }),
			scale("every pod answered s", "%.2f", func(s ScaleSample) float64 { return s.AnsweredSeconds }), timesUpstream,
			persisted("sandbox record bytes", func(p PersistedBytes) float64 { return p.SandboxRecord }),
			persisted("of which knext's nri-network", func(p PersistedBytes) float64 { return p.NRINetwork }),
			persisted("nri-bridge's store", func(p PersistedBytes) float64 { return p.Bridge })),
		configTable("cluster", fmt.Sprintf("A Deployment of %d pods on a two-node cluster of each runtime", r.Settings.ClusterPods),
			[]string{"knext", "upstream"},
			cluster("pod Ready with IPs p50 s", "%.1f", func(c *ClusterRun) float64 { return c.StartP50Ms / 1000 }), timesUpstream,
			cluster("p99 s", "%.1f", func(c *ClusterRun) float64 { return c.StartP99Ms / 1000 }),
			cluster("then in the EndpointSlice p50 ms", "%.0f", func(c *ClusterRun) float64 { return c.EndpointP50Ms }), timesUpstream,
			cluster("p99 ms", "%.0f", func(c *ClusterRun) float64 { return c.EndpointP99Ms }),
			cluster("network setup per pod ms", "%.0f", func(c *ClusterRun) float64 { return c.NetworkMs }),
			cluster("% of the kubelet's RunPodSandbox", "%.0f", func(c *ClusterRun) float64 {
				share, _ := ratio(100*c.NetworkMs, c.RunPodSandboxMs)
				return share
			})),
	}
}

// stepsTable is where a pod's start and removal go, one pod at a time, by containerd's own timers
// of each NRI plugin call and of CNI.
func (r *report) stepsTable(keys []string) Table {
	t := Table{ID: "steps", Title: "Where the time goes: containerd's timers of NRI plugin calls and of CNI, per pod",
		Header: []string{"configuration", "step", "calls per pod, c1", "mean ms, c1", "mean ms, c8"}}
	for _, key := range keys {
		runs, side := r.sidesOf(key)
		steps := map[timerKey][3][]float64{} // calls per pod at c1, mean ms at c1 and at c8, per round
		for _, run := range runs {
			for _, s := range run.Lifecycle[side] {
				seen := map[timerKey]bool{} // a step's first reading in a sample: of the starts
				for _, timer := range s.Timers {
					name := timerKey{timer.Plugin, timer.Operation}
					v := steps[name]
					switch {
					case seen[name]:
					case s.Concurrency == 1:
						v[0], v[1] = append(v[0], float64(timer.Calls)/float64(len(s.RunMs))), append(v[1], timer.MeanMs)
					case s.Concurrency == 8:
						v[2] = append(v[2], timer.MeanMs)
					}
					steps[name], seen[name] = v, true
				}
			}
		}
		names := slices.SortedFunc(maps.Keys(steps), func(a, b timerKey) int { return strings.Compare(a.plugin+a.operation, b.plugin+b.operation) })
		for _, name := range names {
			row := []string{key, name.plugin + " " + name.operation}
			for _, values := range steps[name] {
				row = append(row, cell(spread(values), "%.2f", false))
			}
			t.Rows = append(t.Rows, row)
		}
	}
	return t
}
