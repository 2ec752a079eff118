package bench

import (
	"bytes"
	"flag"
	"fmt"
	"html"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/knext-dev/knext/internal/docregion"
)

// docMain is `knext-bench doc`: the tables of a report into the page's regions, the plots and the
// report itself next to it, so that every figure of the page comes from the committed report.
func docMain(args []string) error {
	fs := flag.NewFlagSet("doc", flag.ExitOnError)
	reportPath := fs.String("report", "build/bench/report.json", "the bench's report")
	page := fs.String("page", "docs/performance.md", "the page whose regions <!-- bench:ID --> ... <!-- /bench:ID --> are rewritten")
	out := fs.String("out", "docs/performance", "where the report and the plots (status.svg, lifecycle.svg) go")
	_ = fs.Parse(args) // ExitOnError: a wrong flag exits
	r, err := readReport(*reportPath)
	if err != nil {
		return err
	}
	committed := filepath.Join(*out, "report.json")
	if err := r.write(committed); err != nil {
		return err
	}
	keys := configKeys(r.Configurations)
	for name, svg := range map[string][]byte{
		"status.svg": barChart("PodSandboxStatus p50, ms (log scale)", true, keys, r.p50Columns(statusFigures(variants[:2]), " p50 ms", "%.3f", false)),
		"lifecycle.svg": barChart("Pod start (RunPodSandbox) and removal (StopPodSandbox + RemovePodSandbox) p50, ms", false,
			keys, r.p50Columns(lifecycleFigures(), " ms", "%.1f", false)),
	} {
		if err := os.WriteFile(filepath.Join(*out, name), svg, 0o644); err != nil {
			return err
		}
	}
	link, err := filepath.Rel(filepath.Dir(*page), committed)
	if err != nil {
		return err
	}
	regions := map[string]string{"run": r.runMarkdown(link)}
	for _, t := range r.tables() {
		regions[t.ID] = t.markdown()
	}
	return docregion.FillFile(*page, "bench", regions)
}

// runMarkdown says which run the figures come from (its report at link): date, machine, binaries
// and settings.
func (r *report) runMarkdown(link string) string {
	m, s := r.Machine, r.Settings
	deps := "both daemons link the same versions of every module but containerd and NRI"
	if len(r.DependencyDifferences) > 0 {
		deps = "the daemons link other versions of: " + strings.Join(r.DependencyDifferences, "; ")
	}
	busy := 0
	for _, run := range r.Pairs {
		for _, w := range run.QuietWaits {
			if !w.Quiet {
				busy++
			}
		}
	}
	return fmt.Sprintf("Every figure below comes from [`%s`](%[1]s), the report of the run of %s to %s UTC "+
		"on %d × %s, %s RAM, kernel %s, %s (load average %s at the start); knext `%s`, upstream `%s`; %s. "+
		"Settings: `-benchmarks %s -repeats %d -pods %d -duration %s -lifecycle-pods %d -scale-pods %d -scale-repeats %d -cluster-pods %d`. "+
		"%d timed phases started on a busy machine (the wait for a quiet one gives up after 15 s).",
		link, r.Started.Format("2006-01-02 15:04"), r.Finished.Format("15:04"), m.CPUs, m.CPU, m.Memory,
		m.Kernel, m.Go, m.Load, r.Binaries["knext"], r.Binaries["upstream"], deps, s.Benchmarks, s.Repeats, s.Pods, s.Duration,
		s.LifecyclePods, s.ScalePods, s.ScaleRepeats, s.ClusterPods, busy)
}

// barChart draws the medians of each column (a series, one colour) for each configuration of keys
// (a group of bars) as horizontal bars, on a linear or a logarithmic axis.
func barChart(title string, logScale bool, keys []string, cols []column) []byte {
	const width, left, right, bar, gap, top = 760.0, 170.0, 60.0, 11.0, 10.0, 56.0
	colours := []string{"#4e79a7", "#f28e2b", "#59a14f", "#e15759"}
	var names []string
	var rows [][]float64 // the medians of names[i]
	lo, hi := math.Inf(1), 0.0
	for _, key := range keys {
		var row []float64
		for _, c := range cols {
			v := 0.0
			if s := spread(c.values(key)); s != nil {
				v, lo, hi = s.Median, min(lo, s.Median), max(hi, s.Median)
			}
			row = append(row, v)
		}
		if slices.ContainsFunc(row, func(v float64) bool { return v > 0 }) {
			names, rows = append(names, key), append(rows, row)
		}
	}
	if len(rows) == 0 { // an empty plot, with an axis all the same
		lo, hi = 1, 1
	}
	scale, ticks := linearAxis(hi)
	if logScale {
		scale, ticks = logAxis(lo, hi)
	}
	plot := width - left - right
	height := top + float64(len(rows))*(float64(len(cols))*bar+gap) + 30
	var b bytes.Buffer
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" font-family="sans-serif" font-size="11">`+"\n", width, height)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/><text x="10" y="18" font-size="13" font-weight="bold">%s</text>`+"\n", html.EscapeString(title))
	for i, x := 0, left; i < len(cols); i, x = i+1, x+30+6.5*float64(len(cols[i].header)) {
		fmt.Fprintf(&b, `<rect x="%.0f" y="28" width="10" height="10" fill="%s"/><text x="%.0f" y="37">%s</text>`+"\n", x, colours[i%len(colours)], x+14, html.EscapeString(cols[i].header))
	}
	bottom := height - 30
	for _, t := range ticks {
		x := left + scale(t)*plot
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%.0f" x2="%.1f" y2="%.0f" stroke="#ddd"/><text x="%.1f" y="%.0f" text-anchor="middle">%g</text>`+"\n", x, top-6, x, bottom, x, bottom+14, t)
	}
	y := top
	for j, row := range rows {
		fmt.Fprintf(&b, `<text x="%.0f" y="%.1f" text-anchor="end">%s</text>`+"\n", left-8, y+float64(len(cols))*bar/2+4, html.EscapeString(names[j]))
		for i, v := range row {
			if v > 0 {
				w := max(1, scale(v)*plot)
				label := fmt.Sprintf("%.3g", v)
				if v >= 100 {
					label = fmt.Sprintf("%.0f", v)
				}
				fmt.Fprintf(&b, `<rect x="%.0f" y="%.1f" width="%.1f" height="%.0f" fill="%s"/><text x="%.1f" y="%.1f">%s</text>`+"\n",
					left, y, w, bar-1, colours[i%len(colours)], left+w+3, y+bar-2, label)
			}
			y += bar
		}
		y += gap
	}
	b.WriteString("</svg>\n")
	return b.Bytes()
}

// linearAxis maps 0..hi, rounded up to a step of 1, 2 or 5 times a power of ten, onto 0..1, with
// at most 6 ticks.
func linearAxis(hi float64) (func(float64) float64, []float64) {
	step := math.Pow(10, math.Floor(math.Log10(hi/5)))
	for _, m := range []float64{1, 2, 5, 10} {
		if 5*m*step >= hi {
			step *= m
			break
		}
	}
	n := math.Ceil(hi / step)
	var ticks []float64
	for i := 0.0; i <= n; i++ {
		ticks = append(ticks, i*step)
	}
	return func(v float64) float64 { return v / (n * step) }, ticks
}

// logAxis maps the powers of ten around lo..hi onto 0..1, with a tick at each.
func logAxis(lo, hi float64) (func(float64) float64, []float64) {
	from, to := math.Floor(math.Log10(lo)), math.Ceil(math.Log10(hi))
	to = max(to, from+1)
	var ticks []float64
	for e := from; e <= to; e++ {
		ticks = append(ticks, math.Pow(10, e))
	}
	return func(v float64) float64 { return (math.Log10(v) - from) / (to - from) }, ticks
}
