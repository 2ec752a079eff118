package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/knext-dev/knext/internal/compare"
)

const (
	pass = compare.Pass
	fail = compare.Fail
	skip = compare.Skip
)

// stream writes a test2json stream in which each test (name: outcome) ends as given; skipped
// tests print a reason first.
func stream(t *testing.T, results map[string]compare.Outcome) string {
	t.Helper()
	var b strings.Builder
	for name, o := range results {
		fmt.Fprintf(&b, `{"Action":"run","Test":%q}`+"\n", name)
		fmt.Fprintf(&b, `{"Action":"output","Test":%q,"Output":"=== RUN   %s\n"}`+"\n", name, name)
		if o == skip {
			fmt.Fprintf(&b, `{"Action":"output","Test":%q,"Output":"    x_test.go:12: needs cgroup v2\n"}`+"\n", name)
			fmt.Fprintf(&b, `{"Action":"output","Test":%q,"Output":"--- SKIP: %s (0.00s)\n"}`+"\n", name, name)
		}
		fmt.Fprintf(&b, `{"Action":%q,"Test":%q}`+"\n", o, name)
	}
	b.WriteString("panic: not a test2json line\n")
	path := filepath.Join(t.TempDir(), "run.json")
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestCompare(t *testing.T) {
	source := t.TempDir()
	for name, content := range map[string]string{
		"a_test.go":         "func TestA(t *testing.T) {}\nfunc TestB(t *testing.T) {}\n",
		"c_linux_test.go":   "func TestC(t *testing.T) {}\n",
		"w_windows_test.go": "func TestW(t *testing.T) {}\n",
	} {
		if err := os.WriteFile(filepath.Join(source, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	upstream := stream(t, map[string]compare.Outcome{"TestA": pass, "TestA/sub": pass, "TestB": skip, "TestC": fail})

	// One run each, no reruns: every difference holds in every run there is.
	for _, tc := range []struct {
		name  string
		knext map[string]compare.Outcome
		ok    bool
		want  []string
	}{
		{"same results", map[string]compare.Outcome{"TestA": pass, "TestA/sub": pass, "TestB": skip, "TestC": fail}, true,
			[]string{"knext:    1 passed, 1 failed, 1 skipped", "TestB (knext skip, upstream skip): x_test.go:12: needs cgroup v2",
				"| a_test.go | 2 | 1 passed, 0 failed, 1 skipped | 1 passed, 0 failed, 1 skipped |  |", "No test differs"}},
		{"knext does better", map[string]compare.Outcome{"TestA": pass, "TestA/sub": pass, "TestB": skip, "TestC": pass}, true,
			[]string{"fixed (knext passes where upstream does worse, every time):\n  TestC: knext pass; upstream fail (passes: knext 1/1, upstream 0/1)",
				"1 test(s) differed in the first run and were not rerun"}},
		{"a subtest fails on knext", map[string]compare.Outcome{"TestA": fail, "TestA/sub": fail, "TestB": skip, "TestC": fail}, false,
			[]string{"TestA/sub  fail   pass      <- regression (knext 0/1, upstream 1/1)", "REGRESSIONS",
				"TestA/sub: knext fail; upstream pass"}},
		{"skipped on knext only", map[string]compare.Outcome{"TestA": skip, "TestB": skip, "TestC": fail}, false,
			[]string{"TestA: knext skip; upstream pass", "TestA/sub: knext not run; upstream pass"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out strings.Builder
			markdown := filepath.Join(t.TempDir(), "table.md")
			ok, err := run(options{knext: stream(t, tc.knext), upstream: upstream, source: source, markdown: markdown}, &out)
			if err != nil {
				t.Fatal(err)
			}
			if ok != tc.ok {
				t.Errorf("compare said ok=%v, want %v:\n%s", ok, tc.ok, out.String())
			}
			for _, want := range tc.want {
				if !strings.Contains(out.String(), want) {
					t.Errorf("output lacks %q:\n%s", want, out.String())
				}
			}
			table, err := os.ReadFile(markdown)
			if err != nil || strings.Contains(string(table), "w_windows_test.go") || !strings.Contains(string(table), "| c_linux_test.go | 1 |") {
				t.Errorf("Markdown table (%v):\n%s", err, table)
			}
		})
	}
}

// recorded returns the options of a case recorded in package compare's testdata.
func recorded(t *testing.T, name string) options {
	dir := filepath.Join("..", "..", "..", "internal", "compare", "testdata", name)
	return options{
		knext: filepath.Join(dir, "knext.json"), upstream: filepath.Join(dir, "upstream.json"),
		knextReruns: filepath.Join(dir, "knext-rerun.json"), upstreamReruns: filepath.Join(dir, "upstream-rerun.json"),
		reruns: compare.DefaultReruns, judgedStream: filepath.Join(t.TempDir(), "judged.json"),
		flaky: filepath.Join(t.TempDir(), "flaky.txt"),
	}
}

func TestRerunPatternSelectsTheDifferingTests(t *testing.T) {
	o := recorded(t, "regression")
	o.knextReruns, o.upstreamReruns = "", ""
	var out strings.Builder
	if err := printRerunPattern(o, &out); err != nil {
		t.Fatal(err)
	}
	if want := "^TestContainerStopSignals$/^SIGUSR1_stop_signal$|^TestDefaultContainerStopSignal$\n"; out.String() != want {
		t.Errorf("rerun pattern %q, want %q", out.String(), want)
	}
	out.Reset()
	o.knext = o.upstream
	if err := printRerunPattern(o, &out); err != nil || out.String() != "" {
		t.Errorf("no difference: printed %q (%v), want nothing", out.String(), err)
	}
}

// judgedResults reads a judged stream as gotestsum counts it: every test's result, and the package's.
func judgedResults(t *testing.T, path string) (compare.Run, string) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	runs, _, err := compare.ReadGoTestJSON(strings.NewReader(string(data)))
	if err != nil || len(runs) != 1 {
		t.Fatalf("judged stream: %d runs (%v), want one:\n%s", len(runs), err, data)
	}
	pkg := ""
	for line := range strings.Lines(string(data)) {
		if strings.Contains(line, `"Test"`) {
			continue
		}
		for _, action := range []string{"pass", "fail"} {
			if strings.Contains(line, `"Action":"`+action+`"`) {
				pkg = action
			}
		}
	}
	return runs[0], pkg
}

func TestAFlakeDoesNotFail(t *testing.T) {
	o := recorded(t, "flaky")
	var out strings.Builder
	ok, err := run(o, &out)
	if err != nil || !ok {
		t.Fatalf("a test that failed once and passed on every rerun: ok=%v (%v), want ok:\n%s", ok, err, out.String())
	}
	for _, want := range []string{
		"2 test(s) differed in the first run; each was run 3 more times on both.",
		"FLAKY (the difference did not hold in every run; does not fail):\n" +
			"  TestContainerStopSignals: knext fail/pass/pass/pass; upstream pass/pass/pass/pass (passes: knext 3/4, upstream 4/4)\n" +
			"  TestContainerStopSignals/SIGUSR1_stop_signal: knext fail/pass/pass/pass; upstream pass/pass/pass/pass (passes: knext 3/4, upstream 4/4)",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
	if flaky, err := os.ReadFile(o.flaky); err != nil || strings.Count(string(flaky), "\n") != 2 {
		t.Errorf("flaky list (%v):\n%s", err, flaky)
	}
	// knext's stream as the suite's runner counts it: the flake is a pass that says it was one.
	results, pkg := judgedResults(t, o.judgedStream)
	if pkg != "pass" || results["TestContainerStopSignals/SIGUSR1_stop_signal"] != pass || results["TestContainerStopSignals"] != pass ||
		results["TestContainerCgroupWritable"] != skip {
		t.Errorf("judged stream: package %s, tests %v; want the flaky tests and the package passed, the skip kept", pkg, results)
	}
	if judged, _ := os.ReadFile(o.judgedStream); !strings.Contains(string(judged), "cricompare: flaky, not a regression: knext fail/pass/pass/pass") {
		t.Errorf("judged stream does not say the test was flaky:\n%s", judged)
	}
}

func TestARegressionFails(t *testing.T) {
	o := recorded(t, "regression")
	var out strings.Builder
	ok, err := run(o, &out)
	if err != nil || ok {
		t.Fatalf("tests that failed on knext in every run: ok=%v (%v), want a failure:\n%s", ok, err, out.String())
	}
	if want := "REGRESSIONS (knext does worse than upstream in every run, or only one runs the test):\n" +
		"  TestContainerStopSignals: knext fail/fail/fail/fail; upstream pass/pass/pass/pass (passes: knext 0/4, upstream 4/4)"; !strings.Contains(out.String(), want) {
		t.Errorf("output lacks %q:\n%s", want, out.String())
	}
	results, pkg := judgedResults(t, o.judgedStream)
	if pkg != "fail" || results["TestContainerStopSignals/SIGUSR1_stop_signal"] != fail || results["TestDefaultContainerStopSignal"] != fail {
		t.Errorf("judged stream: package %s, tests %v; want the regressions failed", pkg, results)
	}
}

func TestMissingRerunsAreErrors(t *testing.T) {
	empty := filepath.Join(t.TempDir(), "empty.json")
	if err := os.WriteFile(empty, []byte("build failed\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		edit func(*options)
	}{
		{"a first run without tests", func(o *options) { o.knext = empty }},
		{"reruns without tests", func(o *options) { o.upstreamReruns = empty }},
		{"more reruns than asked for", func(o *options) { o.reruns = 2 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := recorded(t, "flaky")
			tc.edit(&o)
			var out strings.Builder
			if _, err := run(o, &out); err == nil {
				t.Errorf("compared without error:\n%s", out.String())
			}
		})
	}
}

func TestJudgedStreamEndsAFlakyTestTheBinaryCrashedIn(t *testing.T) {
	dir := t.TempDir()
	in, out := filepath.Join(dir, "knext.json"), filepath.Join(dir, "judged.json")
	crashed := `{"Action":"run","Package":"p","Test":"TestA"}
{"Action":"pass","Package":"p","Test":"TestA"}
{"Action":"run","Package":"p","Test":"TestB"}
{"Action":"output","Package":"p","Output":"panic: test timed out after 80m0s\n"}
{"Action":"fail","Package":"p","Elapsed":4800}
`
	if err := os.WriteFile(in, []byte(crashed), 0o644); err != nil {
		t.Fatal(err)
	}
	flakyB := compare.Result{Name: "TestB", Runs: compare.Runs{Knext: []compare.Outcome{compare.NotRun, pass}, Upstream: []compare.Outcome{pass, pass}},
		Verdict: compare.Flaky}
	for _, tc := range []struct {
		name            string
		results         []compare.Result
		wantB, wantPkgs string
	}{
		{"flaky", []compare.Result{flakyB}, "pass", "pass"},
		{"not judged", nil, "", "fail"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := writeJudgedStream(in, out, tc.results); err != nil {
				t.Fatal(err)
			}
			results, pkg := judgedResults(t, out)
			if string(results["TestB"]) != tc.wantB || results["TestA"] != pass || pkg != tc.wantPkgs {
				t.Errorf("judged stream: package %s, tests %v; want TestB %q and the package %s", pkg, results, tc.wantB, tc.wantPkgs)
			}
		})
	}
}
