package main

import (
	"fmt"
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

// column is a column of a table whose rows are configurations: a figure's values over the rounds
// of the row's configuration, shown as their median, a ratio's with their range.
type column struct {
	header string
	values func(key string) []float64
	format string
	ratio  bool
}

func (r *report) pairColumn(header, format string, f func(*PairRun, int) (float64, bool), toUpstream bool) column {
	return column{header, func(key string) []float64 { return r.pairValues(key, f, toUpstream) }, format, toUpstream}
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
	for _, c := range cols {
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
	var b strings.Builder
	fmt.Fprintf(&b, "%s\n\n", t.Title)
	if len(t.Rows) == 0 {
		b.WriteString("(not measured in this run)\n")
		return b.String()
	}
	b.WriteString("| " + strings.Join(t.Header, " | ") + " |\n|" + strings.Repeat(" --- |", len(t.Header)) + "\n")
	for _, row := range t.Rows {
		b.WriteString("| " + strings.Join(row, " | ") + " |\n")
	}
	return b.String()
}

// statusColumns are the p50 of each variant, each with its ratio to upstream when ratios is set.
func (r *report) statusColumns(vs []variant, ratios bool) []column {
	var cols []column
	for _, v := range vs {
		cols = append(cols, r.pairColumn(v.String()+" p50 ms", "%.3f", statusFigure(v, p50), false))
		if ratios {
			cols = append(cols, r.pairColumn("× upstream", "%.2f", statusFigure(v, p50), true))
		}
	}
	return cols
}

// lifecycleColumns are the p50 of pod starts, then of removals, at each concurrency.
func (r *report) lifecycleColumns(ratios bool) []column {
	var cols []column
	for _, stopRemove := range []bool{false, true} {
		for _, width := range lifecycleWidths {
			cols = append(cols, r.pairColumn(fmt.Sprintf("%s c%d ms", lifecycleCall(stopRemove), width), "%.1f", lifecycleFigure(width, stopRemove), false))
			if ratios {
				cols = append(cols, r.pairColumn("× upstream", "%.2f", lifecycleFigure(width, stopRemove), true))
			}
		}
	}
	return cols
}

func (r *report) tables() []Table {
	keys := configKeys(r.Configurations)
	load := func(header, format string, v variant, field func(Load) float64) column {
		return r.pairColumn(header, format, statusFigure(v, field), false)
	}
	c1, c16 := variants[0], variants[1]
	detail := []column{
		load("c1 p99 ms", "%.3f", c1, func(l Load) float64 { return l.P99Ms }),
		load("c16 p99 ms", "%.3f", c16, func(l Load) float64 { return l.P99Ms }),
		load("c1 calls/s", "%.0f", c1, func(l Load) float64 { return l.PerSecond }),
		load("c16 calls/s", "%.0f", c16, func(l Load) float64 { return l.PerSecond }),
		load("plugin calls per query", "%.2f", c1, func(l Load) float64 { return l.PluginCalls }),
	}
	var overhead []column
	for _, v := range []variant{c1, c16} {
		beyond := r.pairColumn("beyond it and upstream's query, × upstream's", "%.2f", overheadFigure(v.Concurrency), false)
		beyond.ratio = true // a share of upstream's query, of the same pair: shown with its range
		overhead = append(overhead, r.pairColumn(v.String()+" round trip p50 ms", "%.3f", pingFigure(v.Concurrency), false), beyond)
	}
	eventsWithIP := func(run *PairRun) *float64 {
		if run.EventCalls == nil {
			return nil
		}
		n := float64(run.EventsWithIP)
		return &n
	}
	calls := []column{
		r.pairColumn("plugin calls per burst of 16 queries, per plugin", "%.2f", own(func(run *PairRun) *float64 { return run.BurstCalls }), false),
		r.pairColumn("container events with the pod IP", "%.0f", own(eventsWithIP), false),
		r.pairColumn("plugin calls for them", "%.0f", own(func(run *PairRun) *float64 { return run.EventCalls }), false),
		r.pairColumn("RunPodSandbox p50 ms during a 16-way status storm", "%.1f", stormFigure, false),
		r.pairColumn("× upstream", "%.2f", stormFigure, true),
	}
	scale := func(header, format string, f func(ScaleSample) float64, toUpstream bool) column {
		return column{header, func(key string) []float64 { return r.scaleValues(key, f, toUpstream) }, format, toUpstream}
	}
	persisted := func(header string, f func(PersistedBytes) float64) column {
		return column{header, func(key string) []float64 {
			i := slices.IndexFunc(r.Persisted, func(p PersistedBytes) bool { return p.Config == key && f(p) > 0 })
			if i < 0 {
				return nil
			}
			return []float64{f(r.Persisted[i])}
		}, "%.0f", false}
	}
	sweep := func(s ScaleSample) float64 { return s.SweepMs }
	answered := func(s ScaleSample) float64 { return s.AnsweredSeconds }
	cluster := func(header, format string, f func(*ClusterRun) float64, toUpstream bool) column {
		return column{header, func(key string) []float64 { return r.clusterValues(key, f, toUpstream) }, format, toUpstream}
	}
	start := func(c *ClusterRun) float64 { return c.StartP50Ms / 1000 }
	endpoint := func(c *ClusterRun) float64 { return c.EndpointP50Ms }
	return []Table{
		r.targetTable(),
		configTable("status", "PodSandboxStatus p50 in ms, and its paired ratio to upstream's", keys, r.statusColumns(variants, true)...),
		configTable("status-detail", "PodSandboxStatus p99, throughput and plugin calls per query", keys, detail...),
		configTable("overhead", "The raw ttrpc round trip to the status plugin's process, and the query beyond it", keys, overhead...),
		configTable("calls", "Plugin calls outside the timed queries (C7), and pod starts during a status storm (S3)", keys, calls...),
		configTable("lifecycle", "Pod start and removal p50 in ms, and its paired ratio to upstream's", keys, r.lifecycleColumns(true)...),
		r.stepsTable(keys),
		configTable("scale", fmt.Sprintf("%d pods per configuration, median over the restarts", r.Settings.ScalePods), scaleConfigs,
			scale("status sweep ms", "%.1f", sweep, false), scale("× upstream", "%.2f", sweep, true),
			scale("per query p50 ms", "%.3f", func(s ScaleSample) float64 { return s.SweepP50Ms }, false),
			scale("restart: CRI ready s", "%.2f", func(s ScaleSample) float64 { return s.ReadySeconds }, false),
			scale("every pod answered s", "%.2f", answered, false), scale("× upstream", "%.2f", answered, true),
			persisted("sandbox record bytes", func(p PersistedBytes) float64 { return p.SandboxRecord }),
			persisted("of which knext's nri-network", func(p PersistedBytes) float64 { return p.NRINetwork }),
			persisted("nri-bridge's store", func(p PersistedBytes) float64 { return p.Bridge })),
		configTable("cluster", fmt.Sprintf("A Deployment of %d pods on a two-node cluster of each runtime", r.Settings.ClusterPods),
			[]string{"knext", "upstream"},
			cluster("pod Ready with IPs p50 s", "%.1f", start, false), cluster("× upstream", "%.2f", start, true),
			cluster("p99 s", "%.1f", func(c *ClusterRun) float64 { return c.StartP99Ms / 1000 }, false),
			cluster("then in the EndpointSlice p50 ms", "%.0f", endpoint, false), cluster("× upstream", "%.2f", endpoint, true),
			cluster("p99 ms", "%.0f", func(c *ClusterRun) float64 { return c.EndpointP99Ms }, false),
			cluster("network setup per pod ms", "%.0f", func(c *ClusterRun) float64 { return c.NetworkMs }, false),
			cluster("% of the kubelet's RunPodSandbox", "%.0f", func(c *ClusterRun) float64 {
				share, _ := ratio(100*c.NetworkMs, c.RunPodSandboxMs)
				return share
			}, false)),
	}
}

// stepsTable is where a pod's start and removal go, one pod at a time, by containerd's own timers
// of each NRI plugin call and of CNI.
func (r *report) stepsTable(keys []string) Table {
	t := Table{ID: "steps", Title: "Where the time goes: containerd's timers of NRI plugin calls and of CNI, per pod",
		Header: []string{"configuration", "step", "calls per pod, c1", "mean ms, c1", "mean ms, c8"}}
	step := func(width int, name timerKey, perPod bool) func(*PairRun, int) (float64, bool) {
		return func(run *PairRun, side int) (float64, bool) {
			for _, s := range run.Lifecycle[side] {
				i := slices.IndexFunc(s.Timers, func(t Timer) bool { return timerKey{t.Plugin, t.Operation} == name })
				if s.Concurrency != width || i < 0 {
					continue
				}
				if perPod {
					return float64(s.Timers[i].Calls) / float64(len(s.RunMs)), true
				}
				return s.Timers[i].MeanMs, true
			}
			return 0, false
		}
	}
	for _, key := range keys {
		runs, side := r.sidesOf(key)
		var names []timerKey
		for _, run := range runs {
			for _, s := range run.Lifecycle[side] {
				for _, timer := range s.Timers {
					if name := (timerKey{timer.Plugin, timer.Operation}); !slices.Contains(names, name) {
						names = append(names, name)
					}
				}
			}
		}
		slices.SortFunc(names, func(a, b timerKey) int { return strings.Compare(a.plugin+a.operation, b.plugin+b.operation) })
		for _, name := range names {
			row := []string{key, name.plugin + " " + name.operation}
			for _, f := range []func(*PairRun, int) (float64, bool){step(1, name, true), step(1, name, false), step(8, name, false)} {
				row = append(row, cell(spread(r.pairValues(key, f, false)), "%.2f", false))
			}
			t.Rows = append(t.Rows, row)
		}
	}
	return t
}

func (r *report) targetTable() Table {
	t := Table{ID: "targets", Title: "Targets: per variant, the median over the rounds [min–max], and the A/A pair's",
		Header: []string{"target", "measured", "A/A: upstream-again", "status"}}
	for _, target := range r.targets() {
		var measured, aa []string
		for _, p := range target.Parts {
			measured = append(measured, strings.TrimSpace(p.Variant+" "+cell(p.Measured, "%.2f", true)))
			if p.AA != nil {
				aa = append(aa, strings.TrimSpace(p.Variant+" "+cell(p.AA, "%.2f", true)))
			}
		}
		t.Rows = append(t.Rows, []string{target.Name, strings.Join(measured, "; "), strings.Join(aa, "; "), target.status()})
	}
	return t
}
