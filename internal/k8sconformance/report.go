package k8sconformance

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/knext-dev/knext/internal/compare"
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

// results reads the JUnit report of every attempt.
func (rec *record) results(out string) (runs, error) {
	all := runs{}
	for _, a := range rec.Attempts {
		focus, err := regexp.Compile(a.Focus)
		if err != nil {
			return nil, fmt.Errorf("%s run %d: focus: %w", a.Column, a.Number, err)
		}
		specs, err := readJUnit(filepath.Join(out, a.Dir, junitReport), focus)
		if err != nil {
			return nil, err
		}
		all[a.Column] = append(all[a.Column], specs)
	}
	for _, column := range columns {
		if len(all[column]) == 0 {
			return nil, fmt.Errorf("%s: no run of %s", filepath.Join(out, recordFile), column)
		}
	}
	return all, nil
}

// markdown is the results region of docs/conformance.md: what ran, the verdict, one row per spec
// (its first runs, package compare's verdict with the passes per column of a spec that ran
// again, its durations) and why each spec that did not pass everywhere did not. The error names the specs that regress on knext.
func (rec *record) markdown(all runs) (string, error) {
	results := all.comparison().Judge()
	var b strings.Builder
	fmt.Fprintf(&b, "The run of %s–%s UTC: e2e.test %s, `--ginkgo.focus='%s'`, %d nodes per cluster, %d specs.\n\n",
		rec.Started.UTC().Format("2006-01-02 15:04"), rec.Finished.UTC().Format("15:04"), rec.E2EVersion, rec.Focus, rec.Nodes, len(results))
	for _, column := range columns {
		counts := map[compare.Outcome]int{}
		for _, o := range all[column][0] {
			counts[o.State]++
		}
		fmt.Fprintf(&b, "- %s: %d passed, %d failed, %d skipped", column, counts[compare.Pass], counts[compare.Fail], counts[compare.Skip])
		for _, a := range rec.Attempts {
			if a.Column == column {
				fmt.Fprintf(&b, "; run %d: cluster up in %s, suite %s", a.Number, seconds(a.ClusterUp), seconds(a.Suite))
			}
		}
		b.WriteString("\n")
	}
	b.WriteString("\n")
	regressions := compare.Select(results, compare.Regression)
	if differ := len(results) - len(compare.Select(results, compare.Same)); differ == 0 {
		b.WriteString("**knext = upstream**: every spec has the same outcome on both.\n\n")
	} else {
		fmt.Fprintf(&b, "%d specs differed in the first run and ran %d times more on both: %d regressions (knext does worse in every run: this fails the comparison), %d fixed, %d flaky (does not fail).\n\n",
			differ, len(all[columnKnext])-1, len(regressions), len(compare.Select(results, compare.Fixed)), len(compare.Select(results, compare.Flaky)))
	}
	b.WriteString("| spec | knext | upstream | verdict | duration (knext / upstream) |\n| --- | --- | --- | --- | --- |\n")
	for _, r := range results {
		verdict := string(r.Verdict)
		if r.Verdict != compare.Same {
			verdict += " (passes " + r.Passes() + ")"
		}
		duration := func(column string) string {
			if o, ok := all[column][0][r.Name]; ok && o.State != compare.Skip {
				return seconds(o.Duration)
			}
			return "–"
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s / %s |\n", escapeCell(r.Name), r.Knext[0], r.Upstream[0], verdict,
			duration(columnKnext), duration(columnUpstream))
	}
	var notes []string
	for _, r := range results {
		for _, column := range columns {
			for i, run := range all[column] {
				if o, ok := run[r.Name]; ok && o.State != compare.Pass {
					notes = append(notes, fmt.Sprintf("- %s, %s, run %d: %s: %s", r.Name, column, i+1, o.State, firstLine(o.Message)))
				}
			}
		}
	}
	if len(notes) > 0 {
		b.WriteString("\nEvery outcome but a pass, with the first line of its message:\n\n" + strings.Join(notes, "\n") + "\n")
	}
	if len(regressions) == 0 {
		return b.String(), nil
	}
	var names []string
	for _, r := range regressions {
		names = append(names, r.Name)
	}
	return b.String(), fmt.Errorf("%d specs regress on knext (worse than upstream in every run): %s", len(names), strings.Join(names, "; "))
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
