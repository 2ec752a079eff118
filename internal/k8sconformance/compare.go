package k8sconformance

import (
	"github.com/knext-dev/knext/internal/compare"
)

// The columns of the comparison: the runtimes of the nodes (package cluster's).
const (
	columnKnext    = "knext"
	columnUpstream = "upstream"
)

var columns = []string{columnKnext, columnUpstream}

// outcome is one spec's result in one run of one column.
type outcome struct {
	State    compare.Outcome
	Message  string  // the failure or skip message, as the JUnit report carries it
	Duration float64 // seconds
}

// runs is every run of each column (by column, the first run first; a rerun holds only the
// specs it reran), each the outcome of every spec by full text.
type runs map[string][]map[string]outcome

// comparison is the runs as package compare judges them.
func (r runs) comparison() compare.Comparison {
	column := func(name string) []compare.Run {
		var judged []compare.Run
		for _, run := range r[name] {
			outcomes := compare.Run{}
			for spec, o := range run {
				outcomes[spec] = o.State
			}
			judged = append(judged, outcomes)
		}
		return judged
	}
	return compare.Comparison{Knext: column(columnKnext), Upstream: column(columnUpstream)}
}

// first is the first runs only: what decides which specs to run again.
func (r runs) first() runs {
	first := runs{}
	for column, all := range r {
		first[column] = all[:1]
	}
	return first
}
