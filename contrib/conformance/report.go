package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"
)

// outcome is one spec's result in one configuration.
type outcome struct {
	state    string // passed, failed or skipped
	message  string // first line of the failure or skip message
	attempts int    // runs of the spec: more than one when it failed and was retried
}

// result is one configuration's run.
type result struct {
	config   configuration
	specs    map[string]outcome // by full spec text
	err      error              // the configuration could not run (no report)
	duration time.Duration
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
		NumAttempts             int
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
			o := outcome{state: "failed", attempts: s.NumAttempts}
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
				o.message = "not selected (-ginkgo.skip or -ginkgo.focus)"
			}
			specs[name] = o
		}
	}
	if len(specs) == 0 {
		return nil, fmt.Errorf("%s: no specs", path)
	}
	return specs, nil
}

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

// comparison holds the results of all configurations and the specs whose outcome differs.
type comparison struct {
	results   []*result
	differing []string // spec names, sorted
	// timingDependent specs passed in some configurations and hit a spec discrepancy in the others.
	timingDependent []string
	failed          []string // failed in every configuration that ran, sorted
	// retried lists the specs that passed only on a retry, with their configuration, sorted.
	retried []string
	skipped []string // skipped in every configuration that ran, sorted
}

func compare(results []*result) comparison {
	c := comparison{results: results}
	names := map[string]bool{}
	for _, r := range results {
		for name, o := range r.specs {
			names[name] = true
			if o.state == "passed" && o.attempts > 1 {
				c.retried = append(c.retried, fmt.Sprintf("%s\n    %s: passed on attempt %d", name, r.config.name, o.attempts))
			}
		}
	}
	for name := range names {
		states := map[string]bool{}
		byChance := true
		for _, r := range results {
			if r.err == nil {
				o := r.specs[name] // a spec a configuration lacks counts as state ""
				states[o.state] = true
				byChance = byChance && (o.state == "passed" || o.state == "skipped" && strings.HasPrefix(o.message, discrepancyPrefix))
			}
		}
		switch {
		case len(states) > 1 && byChance:
			c.timingDependent = append(c.timingDependent, name)
		case len(states) > 1:
			c.differing = append(c.differing, name)
		case states["failed"]:
			c.failed = append(c.failed, name)
		case states["skipped"]:
			c.skipped = append(c.skipped, name)
		}
	}
	slices.Sort(c.differing)
	slices.Sort(c.timingDependent)
	slices.Sort(c.failed)
	slices.Sort(c.skipped)
	slices.Sort(c.retried)
	return c
}

func (c comparison) print(w io.Writer) {
	fmt.Fprintf(w, "%-10s", "")
	for _, r := range c.results {
		fmt.Fprintf(w, " %15s", r.config.name)
	}
	fmt.Fprintln(w)
	for _, state := range []string{"passed", "failed", "skipped"} {
		fmt.Fprintf(w, "%-10s", state)
		for _, r := range c.results {
			cell := "-"
			if r.err == nil {
				cell = fmt.Sprint(r.count(state))
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

	if len(c.differing) == 0 {
		fmt.Fprintln(w, "\nNo spec differs between the configurations.")
	} else {
		fmt.Fprintf(w, "\n%d spec(s) differ between the configurations:\n", len(c.differing))
		c.printOutcomes(w, c.differing)
	}
	if len(c.timingDependent) > 0 {
		fmt.Fprintf(w, "\n%d spec(s) passed or hit critest's %q by chance (a race critest probes; upstream may lose it, knext must not):\n",
			len(c.timingDependent), discrepancyPrefix)
		c.printOutcomes(w, c.timingDependent)
	}
	if len(c.retried) > 0 {
		fmt.Fprintf(w, "\nPassed only on a retry (critest runs a failing spec up to %d times; counted as passed):\n", flakeAttempts)
		for _, line := range c.retried {
			fmt.Fprintf(w, "  %s\n", line)
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

// printOutcomes prints each spec of names with its outcome in every configuration that ran.
func (c comparison) printOutcomes(w io.Writer, names []string) {
	for _, name := range names {
		fmt.Fprintf(w, "  %s\n", name)
		for _, r := range c.results {
			if r.err != nil {
				continue
			}
			o, ok := r.specs[name]
			switch {
			case !ok:
				fmt.Fprintf(w, "    %-15s not in the report\n", r.config.name)
			case o.message != "":
				fmt.Fprintf(w, "    %-15s %s: %s\n", r.config.name, o.state, shorten(o.message))
			default:
				fmt.Fprintf(w, "    %-15s %s\n", r.config.name, o.state)
			}
		}
	}
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

// verdict is nil when every configuration ran, none failed a spec and none differs from another.
// discrepancies returns the specs r skipped with critest's spec discrepancy, sorted.
func (r *result) discrepancies() []string {
	var names []string
	for name, o := range r.specs {
		if o.state == "skipped" && strings.HasPrefix(o.message, discrepancyPrefix) {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	return names
}

func (c comparison) verdict() error {
	var errs []error
	for _, r := range c.results {
		if r.err != nil {
			errs = append(errs, fmt.Errorf("%s did not run", r.config.name))
		} else if n := r.count("failed"); n > 0 {
			errs = append(errs, fmt.Errorf("%s failed %d spec(s)", r.config.name, n))
		}
		if lost := r.discrepancies(); len(lost) > 0 && !r.config.upstream {
			errs = append(errs, fmt.Errorf("%s lost the race critest probes in %d spec(s): %s", r.config.name, len(lost), strings.Join(lost, "; ")))
		}
	}
	if len(c.differing) > 0 {
		errs = append(errs, fmt.Errorf("%d spec(s) differ between the configurations", len(c.differing)))
	}
	return errors.Join(errs...)
}
