// Package compare judges a test suite run side by side against knext and against upstream
// containerd, so that a flake never fails CI and a regression always does.
//
// A comparison has two columns, knext and upstream, each a list of runs (Run: every test's
// Outcome by name). The first run of each column runs the whole suite; the tests whose outcome
// differs between the two first runs (Comparison.Differing) are then run again on both columns,
// DefaultReruns times unless told otherwise, and only those: GoTestRunPattern gives the
// `go test -run` pattern that selects them, GinkgoFocus the Ginkgo focus. Run i of one column
// pairs with run i of the other (they ran at the same time, or one after the other under the same
// conditions). Comparison.Judge gives each test a Result: its Runs (the outcomes of each column, the
// first run first) and the Verdict of Classify:
//
//   - Same: no difference in the first run (such a test is not rerun);
//   - Regression: knext does worse than upstream in every run, outcomes ranked pass > skip >
//     fail > not run; so a test that fails or is skipped on knext every time while it passes on
//     upstream every time; and a test that one column never reports while the other does (the
//     columns must run the same tests);
//   - Fixed: the reverse, knext does better in every run;
//   - Flaky: anything else (it differs sometimes, on either side).
//
// Only a Regression fails a comparison (Select(results, Regression) is empty when it passes).
// A flaky test is reported, never hidden, with the passes of each column (Runs.Passes:
// "knext 3/4, upstream 4/4"), which tables show in a flaky column.
//
// ReadGoTestJSON reads a `go test -json` (test2json) stream into runs: a stream of a test binary
// run with -count N holds N runs.
package compare

import (
	"fmt"
	"slices"
)

// DefaultReruns is how many times a differing test is run again on each column.
const DefaultReruns = 3

// Outcome is a test's result in one run of one column.
type Outcome string

// The outcomes; NotRun is the outcome of a test the run did not report.
const (
	Pass   Outcome = "pass"
	Fail   Outcome = "fail"
	Skip   Outcome = "skip"
	NotRun Outcome = ""
)

func (o Outcome) String() string {
	if o == NotRun {
		return "not run"
	}
	return string(o)
}

// rank orders outcomes from worst to best.
func (o Outcome) rank() int {
	switch o {
	case Pass:
		return 3
	case Skip:
		return 2
	case Fail:
		return 1
	}
	return 0
}

// Run is what one run of one column reports: each test's outcome, by name (a subtest as
// Parent/Sub, a Ginkgo spec as its full text).
type Run map[string]Outcome

// Runs is one test's outcomes in each column, the first run first.
type Runs struct {
	Knext, Upstream []Outcome
}

// Passes is how many runs of each column passed: "knext 3/4, upstream 4/4".
func (r Runs) Passes() string {
	return fmt.Sprintf("knext %d/%d, upstream %d/%d", Passed(r.Knext), len(r.Knext), Passed(r.Upstream), len(r.Upstream))
}

// Passed counts the passes among outcomes.
func Passed(outcomes []Outcome) int {
	n := 0
	for _, o := range outcomes {
		if o == Pass {
			n++
		}
	}
	return n
}

// Verdict is what a comparison concludes of one test.
type Verdict string

// The verdicts (see the package documentation).
const (
	Same       Verdict = "same"
	Regression Verdict = "regression"
	Fixed      Verdict = "fixed"
	Flaky      Verdict = "flaky"
)

// Classify judges one test from its outcomes in both columns. A column with fewer runs than the
// other did not report the test in the runs it lacks.
func Classify(r Runs) Verdict {
	n := max(len(r.Knext), len(r.Upstream))
	knext, upstream := padded(r.Knext, n), padded(r.Upstream, n)
	if n == 0 || knext[0] == upstream[0] {
		return Same
	}
	if !slices.ContainsFunc(knext, reported) || !slices.ContainsFunc(upstream, reported) {
		return Regression
	}
	worse, better := 0, 0
	for i := range n {
		switch k, u := knext[i].rank(), upstream[i].rank(); {
		case k < u:
			worse++
		case k > u:
			better++
		}
	}
	switch n {
	case worse:
		return Regression
	case better:
		return Fixed
	}
	return Flaky
}

func reported(o Outcome) bool { return o != NotRun }

func padded(outcomes []Outcome, n int) []Outcome {
	return append(slices.Clone(outcomes), make([]Outcome, n-len(outcomes))...)
}

// Comparison is a suite's runs on both columns: the first run of each, then the reruns of the
// tests that differed.
type Comparison struct {
	Knext, Upstream []Run
}

// Result is the verdict on one test.
type Result struct {
	Name string
	Runs
	Verdict Verdict
}

// names returns the tests of the first runs, sorted.
func (c Comparison) names() []string {
	seen := map[string]bool{}
	for _, runs := range [][]Run{c.Knext, c.Upstream} {
		if len(runs) > 0 {
			for name := range runs[0] {
				seen[name] = true
			}
		}
	}
	names := make([]string, 0, len(seen))
	for name := range seen {
		names = append(names, name)
	}
	slices.Sort(names)
	return names
}

func first(runs []Run, name string) Outcome {
	if len(runs) == 0 {
		return NotRun
	}
	return runs[0][name]
}

// Differing returns the tests whose outcome differs between the columns' first runs, sorted:
// those to run again.
func (c Comparison) Differing() []string {
	var names []string
	for _, name := range c.names() {
		if first(c.Knext, name) != first(c.Upstream, name) {
			names = append(names, name)
		}
	}
	return names
}

// Judge returns the result of every test of the first runs, sorted by name. A test that differs
// gets its outcomes in every run; one that does not, its first run's only.
func (c Comparison) Judge() []Result {
	var results []Result
	for _, name := range c.names() {
		runs := Runs{Knext: []Outcome{first(c.Knext, name)}, Upstream: []Outcome{first(c.Upstream, name)}}
		if runs.Knext[0] != runs.Upstream[0] {
			runs = Runs{Knext: outcomes(c.Knext, name), Upstream: outcomes(c.Upstream, name)}
		}
		results = append(results, Result{Name: name, Runs: runs, Verdict: Classify(runs)})
	}
	return results
}

func outcomes(runs []Run, name string) []Outcome {
	o := make([]Outcome, len(runs))
	for i, run := range runs {
		o[i] = run[name]
	}
	return o
}

// Select returns the results with the given verdict.
func Select(results []Result, verdict Verdict) []Result {
	var selected []Result
	for _, r := range results {
		if r.Verdict == verdict {
			selected = append(selected, r)
		}
	}
	return selected
}
