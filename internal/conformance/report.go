package conformance

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/knext-dev/knext/internal/compare"
)

// outcome is one spec's result in one configuration.
type outcome struct {
	state   string // passed, failed or skipped
	message string // first line of the failure or skip message
}

// result is one configuration's run: the first run of every spec, then the reruns of the specs
// that differed from the first configuration.
type result struct {
	config   configuration
	specs    map[string]outcome   // by full spec text
	reruns   []map[string]outcome // each rerun's specs (those not rerun are there as skipped)
	err      error                // the configuration could not run, or a rerun could not
	duration time.Duration
}

// readReruns reads the reports of reruns 1..n from the configuration's result directory.
func (r *result) readReruns(dir string, n int) {
	for run := 1; run <= n; run++ {
		specs, err := readReport(rerunReport(dir, run))
		r.err = errors.Join(r.err, err)
		r.reruns = append(r.reruns, specs)
	}
}

// runs is r's runs as package compare reads them.
func (r *result) runs() []compare.Run {
	runs := []compare.Run{outcomes(r.specs)}
	for _, specs := range r.reruns {
		runs = append(runs, outcomes(specs))
	}
	return runs
}

func outcomes(specs map[string]outcome) compare.Run {
	run := compare.Run{}
	for name, o := range specs {
		run[name] = map[string]compare.Outcome{"passed": compare.Pass, "failed": compare.Fail, "skipped": compare.Skip}[o.state]
	}
	return run
}

func (r *result) count(state string) int {
	n := 0
	for _, o := range r.specs {
		if o.state == state {
			n++
		}
	}
	return n
}

func (r *result) summary() string {
	if r.err != nil {
		return "did not run: " + r.err.Error()
	}
	return fmt.Sprintf("%d passed, %d failed, %d skipped", r.count("passed"), r.count("failed"), r.count("skipped"))
}

// ginkgoReport is the part of Ginkgo v2's JSON report (-ginkgo.json-report) read here.
type ginkgoReport struct {
	SpecReports []struct {
		ContainerHierarchyTexts []string
		LeafNodeText            string
		LeafNodeType            string
		State                   string
		Failure                 *struct{ Message string }
	}
}

// readReport returns the outcome of every spec (It node) of a critest JSON report, and of every
// suite node that did not pass. Ginkgo's panicked, timedout, interrupted and aborted count as
// failed, pending as skipped.
func readReport(path string) (map[string]outcome, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var reports []ginkgoReport
	if err := json.Unmarshal(data, &reports); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	specs := map[string]outcome{}
	for _, report := range reports {
		for _, s := range report.SpecReports {
			name := strings.Join(append(slices.Clone(s.ContainerHierarchyTexts), s.LeafNodeText), " ")
			if s.LeafNodeType != "It" {
				// Suite set-up and reporting nodes count only when they fail: a failed
				// BeforeSuite leaves every spec skipped.
				if s.State == "passed" {
					continue
				}
				name = strings.TrimSpace("[" + s.LeafNodeType + "] " + name)
			}
			o := outcome{state: "failed"}
			switch s.State {
			case "passed":
				o.state = "passed"
			case "skipped", "pending":
				o.state = "skipped"
			}
			if s.Failure != nil {
				o.message = summarize(s.Failure.Message)
			}
			if o.state == "skipped" && o.message == "" {
				o.message = notSelected
			}
			specs[name] = o
		}
	}
	if len(specs) == 0 {
		return nil, fmt.Errorf("%s: no specs", path)
	}
	return specs, nil
}

// notSelected is the message of a spec skipped because -ginkgo.skip or -ginkgo.focus left it out.
const notSelected = "not selected (-ginkgo.skip or -ginkgo.focus)"

// discrepancyPrefix starts critest's skip message for the races it probes in the runtime and
// skips when the runtime loses them (v1.37.0: containerd losing containers created around a late
// NRI plugin's Synchronize). Upstream containerd passes or skips such a spec by chance; knext
// must pass it (its NRI bounds a plugin's Synchronize by the registration timeout), so a knext
// configuration that hits one fails the verdict.
const discrepancyPrefix = "spec discrepancy:"

// summarize returns the first three lines of a Ginkgo failure or skip message on one line,
// leaving out Gomega's dumps of Go values ("<*url.Error | 0x...>:", "{", "Op: ...").
func summarize(message string) string {
	var lines []string
	for line := range strings.SplitSeq(message, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "<") || strings.ContainsAny(line[:1], "{}") ||
			strings.Contains(line, ": <") || strings.HasSuffix(line, ",") {
			continue
		}
		if lines = append(lines, line); len(lines) == 3 {
			break
		}
	}
	return strings.Join(lines, " ")
}

// comparison holds the results of all configurations, each judged against the first one's
// (package compare: a spec that differs is rerun in every configuration before it is judged).
type comparison struct {
	results []*result
	// judged holds, for each configuration after the first that ran, the result of every spec.
	judged  map[string][]compare.Result
	failed  []string // failed in every configuration's first run, sorted
	skipped []string // skipped in every configuration's first run, sorted
}

func compareResults(results []*result) comparison {
	c := comparison{results: results, judged: map[string][]compare.Result{}}
	for _, r := range results[1:] {
		if r.err == nil && results[0].err == nil {
			c.judged[r.config.name] = compare.Comparison{Knext: r.runs(), Upstream: results[0].runs()}.Judge()
		}
	}
	names := map[string]bool{}
	for _, r := range results {
		for name := range r.specs {
			names[name] = true
		}
	}
	for name := range names {
		states := map[string]bool{}
		for _, r := range results {
			if r.err == nil {
				states[r.specs[name].state] = true // a spec a configuration lacks counts as state ""
			}
		}
		switch {
		case len(states) == 1 && states["failed"]:
			c.failed = append(c.failed, name)
		case len(states) == 1 && states["skipped"]:
			c.skipped = append(c.skipped, name)
		}
	}
	slices.Sort(c.failed)
	slices.Sort(c.skipped)
	return c
}

// differing returns the specs whose first run differs between a configuration and the first one,
// sorted: those to rerun.
func (c comparison) differing() []string {
	var names []string
	for _, r := range c.results[1:] {
		if r.err == nil && c.results[0].err == nil {
			names = append(names, compare.Comparison{Knext: r.runs(), Upstream: c.results[0].runs()}.Differing()...)
		}
	}
	slices.Sort(names)
	return slices.Compact(names)
}

// verdicts returns the verdict of each configuration after the first on a spec that differs,
// by configuration name; nil for a spec that differs nowhere.
func (c comparison) verdicts(name string) map[string]compare.Result {
	var verdicts map[string]compare.Result
	for config, results := range c.judged {
		i, found := slices.BinarySearchFunc(results, name, func(r compare.Result, name string) int { return strings.Compare(r.Name, name) })
		if found && results[i].Verdict != compare.Same {
			if verdicts == nil {
				verdicts = map[string]compare.Result{}
			}
			verdicts[config] = results[i]
		}
	}
	return verdicts
}

// selected returns the specs with the given verdict in some configuration, sorted.
func (c comparison) selected(verdict compare.Verdict) []string {
	var names []string
	for _, results := range c.judged {
		for _, r := range compare.Select(results, verdict) {
			names = append(names, r.Name)
		}
	}
	slices.Sort(names)
	return slices.Compact(names)
}

func (c comparison) print(w io.Writer) {
	fmt.Fprintf(w, "%-10s", "")
	for _, r := range c.results {
		fmt.Fprintf(w, " %15s", r.config.name)
	}
	fmt.Fprintln(w)
	for _, state := range []string{"passed", "failed", "skipped", "flaky"} {
		fmt.Fprintf(w, "%-10s", state)
		for i, r := range c.results {
			cell := "-"
			switch {
			case r.err == nil && state != "flaky":
				cell = fmt.Sprint(r.count(state))
			case i > 0 && c.judged[r.config.name] != nil:
				cell = fmt.Sprint(len(compare.Select(c.judged[r.config.name], compare.Flaky)))
			}
			fmt.Fprintf(w, " %15s", cell)
		}
		fmt.Fprintln(w)
	}
	if c.results[0].duration > 0 {
		fmt.Fprintf(w, "%-10s", "duration")
		for _, r := range c.results {
			fmt.Fprintf(w, " %15s", r.duration.Round(time.Second))
		}
		fmt.Fprintln(w)
	}
	for _, r := range c.results {
		fmt.Fprintf(w, "  %s: %s\n", r.config.name, r.config.title)
		if r.err != nil {
			fmt.Fprintf(w, "    did not run: %v\n", r.err)
		}
	}

	if differing := c.differing(); len(differing) == 0 {
		fmt.Fprintln(w, "\nNo spec differs between the configurations.")
	} else {
		fmt.Fprintf(w, "\n%d spec(s) differ from %s in the first run; with every run (the first, then the reruns), "+
			"passes and verdict against %[2]s:\n", len(differing), c.results[0].config.name)
		for _, name := range differing {
			c.printRuns(w, name)
		}
	}
	for _, s := range []struct {
		verdict compare.Verdict
		title   string
	}{
		{compare.Fixed, "Fixed (better than %s in every run)"},
		{compare.Flaky, "FLAKY (the difference from %s did not hold in every run; does not fail)"},
		{compare.Regression, "REGRESSIONS (worse than %s in every run)"},
	} {
		if names := c.selected(s.verdict); len(names) > 0 {
			fmt.Fprintf(w, "\n"+s.title+":\n", c.results[0].config.name)
			for _, name := range names {
				for _, config := range slices.Sorted(maps.Keys(c.verdicts(name))) {
					if r := c.verdicts(name)[config]; r.Verdict == s.verdict {
						fmt.Fprintf(w, "  %s\n    %s: %s\n", name, config, c.passes(config, r))
					}
				}
			}
		}
	}
	if len(c.failed) > 0 {
		fmt.Fprintf(w, "\nFailed in every configuration (%d):\n", len(c.failed))
		for _, name := range c.failed {
			fmt.Fprintf(w, "  %s\n    %s\n", name, shorten(c.message(name)))
		}
	}
	if len(c.skipped) > 0 {
		fmt.Fprintf(w, "\nSkipped in every configuration (%d; why: docs/conformance.md):\n", len(c.skipped))
		for _, name := range c.skipped {
			fmt.Fprintf(w, "  %s\n    %s\n", name, shorten(c.message(name)))
		}
	}
}

// passes says how many runs passed in a configuration and in the first one: "knext-cni 3/4,
// upstream-cni 4/4".
func (c comparison) passes(config string, r compare.Result) string {
	return fmt.Sprintf("%s %d/%d, %s %d/%d", config, compare.Passed(r.Knext), len(r.Knext),
		c.results[0].config.name, compare.Passed(r.Upstream), len(r.Upstream))
}

// printRuns prints a spec that differs: in every configuration that ran, its first outcome with
// the message, its outcome in every run, and the verdict against the first configuration.
func (c comparison) printRuns(w io.Writer, name string) {
	fmt.Fprintf(w, "  %s\n", name)
	verdicts := c.verdicts(name)
	for i, r := range c.results {
		if r.err != nil {
			continue
		}
		o, ok := r.specs[name]
		first := o.state
		switch {
		case !ok:
			first = "not in the report"
		case o.message != "":
			first += ": " + shorten(o.message)
		}
		var runs []string
		for _, run := range r.runs() {
			runs = append(runs, run[name].String())
		}
		verdict := ""
		if v, differs := verdicts[r.config.name]; differs {
			verdict = fmt.Sprintf(", %s", v.Verdict)
		} else if i > 0 {
			verdict = ", same"
		}
		fmt.Fprintf(w, "    %-15s %s\n    %-15s runs: %s (%d/%d passed%s)\n", r.config.name, first, "",
			strings.Join(runs, "/"), compare.Passed(outcomesOf(r.runs(), name)), len(runs), verdict)
	}
}

func outcomesOf(runs []compare.Run, name string) []compare.Outcome {
	o := make([]compare.Outcome, len(runs))
	for i, run := range runs {
		o[i] = run[name]
	}
	return o
}

// shorten cuts a message to a readable length; the full text is in critest.log.
func shorten(message string) string {
	const limit = 160
	if len(message) <= limit {
		return message
	}
	return message[:limit] + "..."
}

// message returns the failure or skip message of the first configuration that has the spec.
func (c comparison) message(name string) string {
	for _, r := range c.results {
		if o, ok := r.specs[name]; ok {
			return o.message
		}
	}
	return ""
}

// lostEveryTime returns the specs r skipped with critest's spec discrepancy in every run of
// them, sorted.
func (r *result) lostEveryTime() []string {
	var names []string
	for name, o := range r.specs {
		if !lost(o) {
			continue
		}
		every := true
		for _, specs := range r.reruns {
			if rerun := specs[name]; rerun.message != notSelected {
				every = every && lost(rerun)
			}
		}
		if every {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	return names
}

func lost(o outcome) bool {
	return o.state == "skipped" && strings.HasPrefix(o.message, discrepancyPrefix)
}

// verdict is nil when every configuration ran, none regressed against the first one, no spec
// failed in every configuration, and no knext configuration lost critest's race in every run.
func (c comparison) verdict() error {
	var errs []error
	for _, r := range c.results {
		if r.err != nil {
			errs = append(errs, fmt.Errorf("%s did not run", r.config.name))
		}
		if lost := r.lostEveryTime(); len(lost) > 0 && !r.config.upstream {
			errs = append(errs, fmt.Errorf("%s lost the race critest probes in %d spec(s): %s", r.config.name, len(lost), strings.Join(lost, "; ")))
		}
	}
	for _, r := range c.results[1:] {
		if regressions := compare.Select(c.judged[r.config.name], compare.Regression); len(regressions) > 0 {
			errs = append(errs, fmt.Errorf("%s regressed against %s in %d spec(s)", r.config.name, c.results[0].config.name, len(regressions)))
		}
	}
	if len(c.failed) > 0 {
		errs = append(errs, fmt.Errorf("%d spec(s) failed in every configuration", len(c.failed)))
	}
	return errors.Join(errs...)
}
