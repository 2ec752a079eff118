package main

import (
	"fmt"
	"maps"
	"slices"
)

// The columns of the comparison: the runtimes of the nodes (package cluster's).
const (
	columnKnext    = "knext"
	columnUpstream = "upstream"
)

var columns = []string{columnKnext, columnUpstream}

// A spec's outcome in one run.
const (
	passed  = "passed"
	failed  = "failed" // JUnit's failure and error
	skipped = "skipped"
)

// outcome is one spec's result in one run of one column.
type outcome struct {
	State    string
	Message  string // the failure or skip message, as JUnit carries it
	Duration float64
}

// verdict is what a spec's outcomes over every run say.
type verdict string

// The verdicts of the rerun-before-judging rule (classify).
const (
	same       verdict = "same"
	regression verdict = "regression"
	fixed      verdict = "fixed"
	flaky      verdict = "flaky"
)

// classify judges one spec by its states in every run of each column, the first run first:
//   - same: the first run gave both columns the same state;
//   - regression: knext never passed (it failed or skipped) while upstream passed every time;
//   - fixed: the reverse, knext passed every time and upstream never did;
//   - flaky: anything else (the columns differed in some runs only, or the states changed).
//
// Only a regression fails the comparison; a flaky spec is reported with its passes per column.
func classify(knext, upstream []string) verdict {
	isPassed := func(state string) bool { return state == passed }
	notPassed := func(state string) bool { return state != passed }
	switch {
	case len(knext) == 0 || len(upstream) == 0:
		return flaky // ran in one column only: nothing to compare, and never silently equal
	case knext[0] == upstream[0]:
		return same
	case !slices.ContainsFunc(knext, isPassed) && !slices.ContainsFunc(upstream, notPassed):
		return regression
	case !slices.ContainsFunc(knext, notPassed) && !slices.ContainsFunc(upstream, isPassed):
		return fixed
	}
	return flaky
}

// specResult is one spec over every run of both columns.
type specResult struct {
	Name     string
	Outcomes map[string][]outcome // by column: the first run, then the reruns
	Verdict  verdict
}

func (s *specResult) states(column string) []string {
	var states []string
	for _, o := range s.Outcomes[column] {
		states = append(states, o.State)
	}
	return states
}

// passes is "passes/runs" of column.
func (s *specResult) passes(column string) string {
	states := s.states(column)
	n := 0
	for _, state := range states {
		if state == passed {
			n++
		}
	}
	return fmt.Sprintf("%d/%d", n, len(states))
}

// differing returns the specs whose state in the first run differs between the columns (or
// that one column lacks): the ones to rerun.
func differing(knext, upstream map[string]outcome) []string {
	var names []string
	for name := range joinKeys(knext, upstream) {
		k, inKnext := knext[name]
		u, inUpstream := upstream[name]
		if !inKnext || !inUpstream || k.State != u.State {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	return names
}

func joinKeys(a, b map[string]outcome) map[string]bool {
	keys := map[string]bool{}
	for name := range a {
		keys[name] = true
	}
	for name := range b {
		keys[name] = true
	}
	return keys
}

// compare gathers, for every spec, its outcomes in runs (by column, the first run first; a
// rerun holds only the specs it reran) and its verdict.
func compare(runs map[string][]map[string]outcome) []*specResult {
	bySpec := map[string]*specResult{}
	for _, column := range columns {
		for _, run := range runs[column] {
			for name, o := range run {
				s := bySpec[name]
				if s == nil {
					s = &specResult{Name: name, Outcomes: map[string][]outcome{}}
					bySpec[name] = s
				}
				s.Outcomes[column] = append(s.Outcomes[column], o)
			}
		}
	}
	var specs []*specResult
	for _, name := range slices.Sorted(maps.Keys(bySpec)) {
		s := bySpec[name]
		s.Verdict = classify(s.states(columnKnext), s.states(columnUpstream))
		specs = append(specs, s)
	}
	return specs
}
