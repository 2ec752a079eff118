package bench

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/knext-dev/knext/internal/docregion"
)

// docMain is `knext-bench doc -report FILES`, run in the repository: the reports' tables, verdicts
// and prose into docs/performance.md's regions, the plots and the reports themselves into
// docs/performance, so that every figure and verdict of the page comes from a committed report.
func docMain(args []string) error {
	fs := flag.NewFlagSet("doc", flag.ExitOnError)
	paths := fs.String("report", "build/bench/report.json,build/bench/cluster.json", "the reports, comma-separated, each of other parts")
	_ = fs.Parse(args) // ExitOnError: a wrong flag exits
	var reports []*report
	for path := range strings.SplitSeq(*paths, ",") {
		r, err := readReport(path)
		if err != nil {
			return err
		}
		reports = append(reports, r)
	}
	regions, plots, err := render(reports, "performance")
	if err != nil {
		return err
	}
	for _, r := range reports {
		err = errors.Join(err, r.write(filepath.Join("docs", "performance", r.file)))
	}
	for name, svg := range plots {
		err = errors.Join(err, os.WriteFile(filepath.Join("docs", "performance", name), svg, 0o644))
	}
	if err != nil {
		return err
	}
	return docregion.FillFile(filepath.Join("docs", "performance.md"), "bench", regions)
}

// render returns the page's regions and plots (by file name) for reports (at least one), whose
// directory is at dir from the page.
func render(reports []*report, dir string) (map[string]string, map[string][]byte, error) {
	regions := map[string]string{}
	var runs []string
	for _, r := range reports {
		runs = append(runs, r.runMarkdown(dir))
	}
	r, err := merged(reports)
	if err != nil {
		return nil, nil, err
	}
	s, err := parseSamples(r.Results)
	if err != nil {
		return nil, nil, err
	}
	for _, t := range s.tables(r.Settings) {
		regions[t.ID] = t.markdown()
	}
	regions["run"] = strings.Join(runs, "\n\n")
	regions["summary"] = s.summaryMarkdown(r)
	rowsOf := func(p pairing, metrics []string, limit float64) (rows []plotRow) {
		for _, m := range metrics {
			rows = append(rows, plotRow{fmt.Sprintf("(%s) %s", p.config, m), s.ratio(m, p), s.ratio(m, aaPair), limit})
		}
		return rows
	}
	var targetRows, statusRows []plotRow
	for _, t := range targets {
		targetRows = append(targetRows, rowsOf(t.p, t.metrics, t.limit)...)
	}
	for _, p := range statusPairs[:len(statusPairs)-1] { // the last is the A/A pair
		statusRows = append(statusRows, rowsOf(p, statusMetrics, 0)...)
	}
	plots := map[string][]byte{}
	for _, p := range []struct {
		id, title string
		rows      []plotRow
	}{
		{"targets", "Targets: ratio to the base (median, 95% interval), the A/A pair's interval (grey), the limit (red)", targetRows},
		{"status", "PodSandboxStatus p50: ratio to upstream's, the A/A pair's interval (grey)", statusRows},
		{"cluster", "Cluster: knext's ratio to upstream's, the A/A pair's interval (grey)", rowsOf(pairing{cfgUpstream, cfgKnext}, clusterFigures, 0)},
	} {
		if plots[p.id+".svg"], err = ratioPlot(p.title, p.rows); err != nil {
			return nil, nil, fmt.Errorf("%s: %w", p.id, err)
		}
		regions[p.id] = fmt.Sprintf("![%s](%s/%s.svg)\n\n%s", p.title, dir, p.id, regions[p.id])
	}
	return regions, plots, nil
}

// summaryMarkdown is the page's short answer: each target's verdict with its figures, and how
// many rounds the load made the bench measure again.
func (s samples) summaryMarkdown(r *report) string {
	rows, verdicts := s.targetRows()
	var lines []string
	for k, t := range targets {
		var parts []string
		for _, row := range rows[k] {
			parts = append(parts, fmt.Sprintf("%s %s, A/A %s: %s", row[1], row[2], row[3], row[5]))
		}
		line := fmt.Sprintf("- **%s**, (%s) ≤ %.2f × (%s): **%s**.", t.what, t.p.config, t.limit, t.p.base, verdicts[k])
		if verdicts[k] != notMeasured {
			line += " " + strings.Join(parts, "; ") + "."
		}
		lines = append(lines, line)
	}
	loadLine := fmt.Sprintf("- **The load**: %d rounds were discarded and measured again because other processes used "+
		"more than %.0f%% of the CPUs during one of their phases.", r.Redone, 100*r.Settings.MaxLoad)
	if r.KeptLoaded > 0 {
		loadLine += fmt.Sprintf(" %d rounds were kept loaded after %d attempts each.", r.KeptLoaded, r.Settings.MaxRedos+1)
	}
	return strings.Join(append(lines, loadLine), "\n")
}

// runMarkdown says which run the figures come from (its report in dir): date, machine, binaries,
// settings and the load.
func (r *report) runMarkdown(dir string) string {
	m, s := r.Machine, r.Settings
	deps := "both daemons link the same versions of every module but containerd and NRI"
	if len(r.DependencyDifferences) > 0 {
		deps = "the daemons link other versions of: " + strings.Join(r.DependencyDifferences, "; ")
	}
	var loads []float64
	notQuiet := 0
	for _, p := range r.Phases {
		loads = append(loads, p.Load)
		if p.QuietWait >= r.Settings.QuietWait.Seconds() {
			notQuiet++
		}
	}
	quiet := ""
	if slices.Contains(r.parts(), "cluster") {
		quiet = fmt.Sprintf(" (beyond the %.0f%% of the CPUs the cluster measured used idle)", 100*r.ClusterIdle)
	}
	return fmt.Sprintf("The figures of the parts %s come from [`%s`](%s/%s), the report of the run of %s to %s UTC (%.0f min) "+
		"on %d × %s, %s RAM, kernel %s, %s; knext `%s`, upstream `%s`; %s. "+
		"Settings: `-benchmarks %s -repeats %d -pods %d -duration %s -lifecycle-pods %d -scale-pods %d -cluster-nodes %d "+
		"-cluster-pods %d -node-pods %d -max-load %.2f -max-redos %d -quiet-wait %s`. "+
		"Of its %d timed phases, %d started before the machine was quiet%s; the share of the CPUs other processes used during a "+
		"phase was %.0f%% at the median and %.0f%% at most.",
		strings.Join(r.parts(), ", "), r.file, dir, r.file, r.Started.Format("2006-01-02 15:04"), r.Finished.Format("15:04"), r.Finished.Sub(r.Started).Minutes(), m.CPUs, m.CPU, m.Memory,
		m.Kernel, m.Go, r.Binaries["knext"], r.Binaries["upstream"], deps, s.Benchmarks, s.Repeats, s.Pods, s.Duration,
		s.LifecyclePods, s.ScalePods, s.ClusterNodes, s.ClusterPods, s.NodePods, s.MaxLoad, s.MaxRedos, s.QuietWait,
		len(r.Phases), notQuiet, quiet, 100*quantile(loads, 0.5), 100*quantile(loads, 1))
}
