package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"
)

// record is what run.json, in the results directory, says of a run: enough to compare its
// reports again (the report command) and to say in the docs what ran.
type record struct {
	Started    time.Time  `json:"started"`
	Finished   time.Time  `json:"finished"`
	Nodes      int        `json:"nodes"`
	Focus      string     `json:"focus"`
	E2EVersion string     `json:"e2eVersion"`
	Attempts   []*attempt `json:"attempts"`
}

const recordFile = "run.json"

func (rec *record) write(out string) error {
	data, err := json.MarshalIndent(rec, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(out, recordFile), append(data, '\n'), 0o644)
}

func readRecord(out string) (*record, error) {
	data, err := os.ReadFile(filepath.Join(out, recordFile))
	if err != nil {
		return nil, err
	}
	rec := &record{}
	if err := json.Unmarshal(data, rec); err != nil {
		return nil, fmt.Errorf("%s: %w", filepath.Join(out, recordFile), err)
	}
	return rec, nil
}

// results reads the JUnit report of every attempt: by column, the first run first.
func (rec *record) results(out string) (map[string][]map[string]outcome, error) {
	runs := map[string][]map[string]outcome{}
	for _, a := range rec.Attempts {
		focus, err := regexp.Compile(a.Focus)
		if err != nil {
			return nil, fmt.Errorf("%s run %d: focus: %w", a.Column, a.Number, err)
		}
		specs, err := readJUnit(filepath.Join(out, a.Dir, junitReport), focus)
		if err != nil {
			return nil, err
		}
		runs[a.Column] = append(runs[a.Column], specs)
	}
	for _, column := range columns {
		if len(runs[column]) == 0 {
			return nil, fmt.Errorf("%s: no run of %s", filepath.Join(out, recordFile), column)
		}
	}
	return runs, nil
}

// summary is the comparison's outcome: the specs by verdict.
type summary struct {
	specs     []*specResult
	byVerdict map[verdict][]*specResult
}

func summarize(specs []*specResult) summary {
	s := summary{specs: specs, byVerdict: map[verdict][]*specResult{}}
	for _, spec := range specs {
		s.byVerdict[spec.Verdict] = append(s.byVerdict[spec.Verdict], spec)
	}
	return s
}

// err fails the comparison when a spec regresses on knext.
func (s summary) err() error {
	regressions := s.byVerdict[regression]
	if len(regressions) == 0 {
		return nil
	}
	var names []string
	for _, spec := range regressions {
		names = append(names, spec.Name)
	}
	return fmt.Errorf("%d specs fail or are skipped on knext and pass upstream in every run: %s", len(names), strings.Join(names, "; "))
}

// count is how many first runs of column ended in state.
func (s summary) count(column, state string) int {
	n := 0
	for _, spec := range s.specs {
		if o := spec.Outcomes[column]; len(o) > 0 && o[0].State == state {
			n++
		}
	}
	return n
}

// markdown is the results region of docs/conformance.md: what ran, the verdict, one row per
// spec, and why each spec that did not pass everywhere did not.
func (rec *record) markdown(s summary) string {
	var b strings.Builder
	utc := func(t time.Time) string { return t.UTC().Format("2006-01-02 15:04") }
	fmt.Fprintf(&b, "The run of %s–%s UTC: e2e.test %s, `--ginkgo.focus='%s'`, %d nodes per cluster, %d specs.\n\n",
		utc(rec.Started), rec.Finished.UTC().Format("15:04"), rec.E2EVersion, rec.Focus, rec.Nodes, len(s.specs))
	for _, column := range columns {
		fmt.Fprintf(&b, "- %s: %d passed, %d failed, %d skipped (first run)", column,
			s.count(column, passed), s.count(column, failed), s.count(column, skipped))
		for _, a := range rec.Attempts {
			if a.Column == column {
				fmt.Fprintf(&b, "; run %d: cluster up %s, suite %s", a.Number, seconds(a.ClusterUp), seconds(a.Suite))
			}
		}
		b.WriteString("\n")
	}
	b.WriteString("\n")
	switch differ := len(s.specs) - len(s.byVerdict[same]); {
	case differ == 0:
		b.WriteString("**knext = upstream**: every spec has the same outcome on both.\n\n")
	default:
		fmt.Fprintf(&b, "%d specs differed in the first run and were run again on both: %d regressions (knext never passes, upstream always does: this fails the comparison), %d fixed, %d flaky (passes/runs per column in the table).\n\n",
			differ, len(s.byVerdict[regression]), len(s.byVerdict[fixed]), len(s.byVerdict[flaky]))
	}
	b.WriteString("| spec | knext | upstream | verdict | duration (knext / upstream) |\n| --- | --- | --- | --- | --- |\n")
	for _, spec := range s.specs {
		cell := func(column string) string {
			o := spec.Outcomes[column]
			switch {
			case len(o) == 0:
				return "not run"
			case len(o) == 1:
				return o[0].State
			}
			return spec.passes(column) + " passed"
		}
		duration := func(column string) string {
			if o := spec.Outcomes[column]; len(o) > 0 && o[0].State != skipped {
				return seconds(o[0].Duration)
			}
			return "–"
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s / %s |\n", escapeCell(spec.Name), cell(columnKnext), cell(columnUpstream),
			spec.Verdict, duration(columnKnext), duration(columnUpstream))
	}
	var notes []string
	for _, spec := range s.specs {
		for _, column := range columns {
			for i, o := range spec.Outcomes[column] {
				if o.State != passed {
					notes = append(notes, fmt.Sprintf("- %s, %s, run %d: %s: %s", spec.Name, column, i+1, o.State, firstLine(o.Message)))
				}
			}
		}
	}
	if len(notes) > 0 {
		b.WriteString("\nEvery outcome but a pass, with the first line of its message:\n\n" + strings.Join(notes, "\n") + "\n")
	}
	return b.String()
}

// seconds formats s seconds as "42 s" or "6 min 30 s".
func seconds(s float64) string {
	d := time.Duration(s * float64(time.Second)).Round(time.Second)
	if d < time.Minute {
		return fmt.Sprintf("%d s", int(d.Seconds()))
	}
	return fmt.Sprintf("%d min %d s", int(d.Minutes()), int(d.Seconds())%60)
}

func escapeCell(s string) string {
	return strings.ReplaceAll(s, "|", `\|`)
}
