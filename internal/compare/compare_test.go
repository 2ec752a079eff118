package compare

import (
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// readRuns reads the streams of a recorded case (testdata/record.sh): the first run of a column,
// then its reruns.
func readRuns(t *testing.T, dir, column string) []Run {
	t.Helper()
	var runs []Run
	for _, name := range []string{column + ".json", column + "-rerun.json"} {
		f, err := os.Open(filepath.Join("testdata", dir, name))
		if err != nil {
			t.Fatal(err)
		}
		r, _, err := ReadGoTestJSON(f)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		runs = append(runs, r...)
	}
	return runs
}

func TestRecordedStreams(t *testing.T) {
	const usr1 = "TestContainerStopSignals/SIGUSR1_stop_signal"
	for _, tc := range []struct {
		dir        string
		differing  []string
		pattern    string // what testdata/record.sh reran
		verdicts   map[string]Verdict
		usr1Counts string // its passes per column
	}{
		{
			dir:        "flaky",
			differing:  []string{"TestContainerStopSignals", usr1},
			pattern:    `^TestContainerStopSignals$/^SIGUSR1_stop_signal$`,
			verdicts:   map[string]Verdict{"TestContainerStopSignals": Flaky, usr1: Flaky},
			usr1Counts: "knext 3/4, upstream 4/4",
		},
		{
			dir:       "regression",
			differing: []string{"TestContainerStopSignals", usr1, "TestDefaultContainerStopSignal"},
			pattern:   `^TestContainerStopSignals$/^SIGUSR1_stop_signal$|^TestDefaultContainerStopSignal$`,
			verdicts: map[string]Verdict{"TestContainerStopSignals": Regression, usr1: Regression,
				"TestDefaultContainerStopSignal": Regression},
			usr1Counts: "knext 0/4, upstream 4/4",
		},
	} {
		t.Run(tc.dir, func(t *testing.T) {
			c := Comparison{Knext: readRuns(t, tc.dir, "knext"), Upstream: readRuns(t, tc.dir, "upstream")}
			if len(c.Knext) != 1+DefaultReruns || len(c.Upstream) != 1+DefaultReruns {
				t.Fatalf("read %d and %d runs, want the first and %d reruns in each column", len(c.Knext), len(c.Upstream), DefaultReruns)
			}
			if got := c.Differing(); !slices.Equal(got, tc.differing) {
				t.Errorf("Differing() = %q, want %q", got, tc.differing)
			}
			if got := GoTestRunPattern(c.Differing()); got != tc.pattern {
				t.Errorf("GoTestRunPattern = %q, want %q", got, tc.pattern)
			}
			// The reruns ran exactly what the pattern selects.
			for _, rerun := range c.Knext[1:] {
				if got := slices.Sorted(maps.Keys(rerun)); !slices.Equal(got, tc.differing) {
					t.Errorf("a rerun ran %q, want %q", got, tc.differing)
				}
			}
			results := c.Judge()
			if len(results) != 5 {
				t.Errorf("judged %d tests, want the 5 of the first run: %+v", len(results), results)
			}
			for _, r := range results {
				want, differs := tc.verdicts[r.Name]
				if !differs {
					want = Same
				}
				if r.Verdict != want {
					t.Errorf("%s: %s (%s), want %s", r.Name, r.Verdict, r.Passes(), want)
				}
				if r.Name == usr1 && r.Passes() != tc.usr1Counts {
					t.Errorf("%s: passes %q, want %q", r.Name, r.Passes(), tc.usr1Counts)
				}
			}
			if failed := len(Select(results, Regression)) > 0; failed != (tc.dir == "regression") {
				t.Errorf("the comparison fails: %v, want %v", failed, tc.dir == "regression")
			}
		})
	}
}

func TestReadGoTestJSONKeepsSkipReasons(t *testing.T) {
	f, err := os.Open("testdata/flaky/upstream.json")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	runs, reasons, err := ReadGoTestJSON(f)
	if err != nil {
		t.Fatal(err)
	}
	if len(runs) != 1 || runs[0]["TestContainerCgroupWritable"] != Skip {
		t.Errorf("runs = %v, want one run with TestContainerCgroupWritable skipped", runs)
	}
	if got := reasons["TestContainerCgroupWritable"]; !strings.HasSuffix(got, "requires cgroup v2") {
		t.Errorf("skip reason %q, want the test's message", got)
	}
}

func TestReadGoTestJSONIgnoresWhatIsNotTest2JSON(t *testing.T) {
	stream := `{"Action":"run","Test":"TestA"}
panic: runtime error

goroutine 1 [running]:
{"Action":"pass","Test":"TestA"}
{"Action":"fail"}
`
	runs, _, err := ReadGoTestJSON(strings.NewReader(stream))
	if err != nil || len(runs) != 1 || len(runs[0]) != 1 || runs[0]["TestA"] != Pass {
		t.Errorf("runs = %v (%v), want TestA passed and nothing else", runs, err)
	}
}

func TestClassify(t *testing.T) {
	p, f, s, n := Pass, Fail, Skip, NotRun
	for _, tc := range []struct {
		name            string
		knext, upstream []Outcome
		want            Verdict
	}{
		{"same first run", []Outcome{f}, []Outcome{f}, Same},
		{"knext fails every time", []Outcome{f, f, f, f}, []Outcome{p, p, p, p}, Regression},
		{"knext skips every time", []Outcome{s, s, s, s}, []Outcome{p, p, p, p}, Regression},
		{"knext fails or skips every time", []Outcome{f, s, f, f}, []Outcome{p, p, p, p}, Regression},
		{"knext fails, upstream skips, every time", []Outcome{f, f, f, f}, []Outcome{s, s, s, s}, Regression},
		{"knext fails once", []Outcome{f, p, p, p}, []Outcome{p, p, p, p}, Flaky},
		{"knext passes once", []Outcome{f, p, f, f}, []Outcome{p, p, p, p}, Flaky},
		{"upstream fails once", []Outcome{p, p, p, p}, []Outcome{f, p, p, p}, Flaky},
		{"both fail sometimes", []Outcome{f, p, f, p}, []Outcome{p, f, p, p}, Flaky},
		{"knext passes, upstream fails, every time", []Outcome{p, p, p, p}, []Outcome{f, f, f, f}, Fixed},
		{"knext crashed before it in one run", []Outcome{n, p, p, p}, []Outcome{p, p, p, p}, Flaky},
		{"only knext runs it", []Outcome{p, p, p, p}, []Outcome{n, n, n, n}, Regression},
		{"only upstream runs it", []Outcome{n, n, n, n}, []Outcome{f, f, f, f}, Regression},
		{"a missing rerun counts as not run", []Outcome{f, f}, []Outcome{p, p, p, p}, Regression},
		{"no runs", nil, nil, Same},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Classify(Runs{Knext: tc.knext, Upstream: tc.upstream}); got != tc.want {
				t.Errorf("Classify(knext %v, upstream %v) = %s, want %s", tc.knext, tc.upstream, got, tc.want)
			}
		})
	}
}

func TestGinkgoFocus(t *testing.T) {
	selected := []string{"[k8s.io] Container runtime should support (stop) signals", "[k8s.io] Image pull"}
	focus := regexp.MustCompile(GinkgoFocus(selected))
	// Ginkgo matches the suite's description, a space and the spec's text.
	for spec, want := range map[string]bool{
		selected[0]: true, selected[1]: true,
		"[k8s.io] Image pull and remove": false, "[k8s.io] Container runtime should support signals": false,
	} {
		if got := focus.MatchString("CRI validation " + spec); got != want {
			t.Errorf("focus %s selects %q: %v, want %v", focus, spec, got, want)
		}
	}
}
