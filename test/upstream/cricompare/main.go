// Command cricompare compares runs of containerd's CRI integration tests (upstream's integration
// package), against knext and against upstream containerd, side by side, with package
// internal/compare: a test whose outcome differs between the two first runs is rerun on both
// before it is judged, and only a regression fails.
//
//	cricompare -rerun-pattern -knext KNEXT.json -upstream UPSTREAM.json
//	cricompare -knext KNEXT.json -upstream UPSTREAM.json [-knext-reruns KNEXT-RERUNS.json
//	    -upstream-reruns UPSTREAM-RERUNS.json -reruns N] [-source DIR] [-markdown FILE]
//	    [-judged-stream FILE] [-flaky FILE]
//
// Each file is a `go test -json` (test2json) stream; the reruns are one stream per column of the
// test binary run with -count N. With -rerun-pattern it prints the `go test -run` pattern of the
// tests that differ, nothing when none does. Otherwise it prints every top-level test with its
// result in both columns, every test that differs with its verdict and its passes per column,
// every skip with the reason the test printed, and the counts; with -source (the integration
// package's directory) the counts per test file too, and -markdown writes them as a table with a
// flaky column. -judged-stream writes knext's first stream with each flaky test's failure turned
// into a pass that says so, for a runner that counts the stream's failures; -flaky lists the
// flaky tests, one a line. It exits 1 when a test is a regression (compare.Regression: knext
// does worse than upstream in every run, or only one column runs the test).
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/knext-dev/knext/internal/compare"
)

func main() {
	var o options
	flag.StringVar(&o.knext, "knext", "", "test2json stream of the first run against knext")
	flag.StringVar(&o.upstream, "upstream", "", "test2json stream of the first run against upstream containerd")
	flag.StringVar(&o.knextReruns, "knext-reruns", "", "test2json stream of the reruns against knext")
	flag.StringVar(&o.upstreamReruns, "upstream-reruns", "", "test2json stream of the reruns against upstream containerd")
	flag.IntVar(&o.reruns, "reruns", compare.DefaultReruns, "how many times the reruns ran each test (their -count)")
	flag.StringVar(&o.source, "source", "", "directory of the integration package, to count per test file")
	flag.StringVar(&o.markdown, "markdown", "", "write the per-file counts as a Markdown table to this file")
	flag.StringVar(&o.judgedStream, "judged-stream", "", "write knext's first stream, flaky failures judged, to this file")
	flag.StringVar(&o.flaky, "flaky", "", "write the flaky tests, one a line, to this file")
	rerunPattern := flag.Bool("rerun-pattern", false, "print the go test -run pattern of the tests whose outcome differs")
	flag.Parse()
	if o.knext == "" || o.upstream == "" || (o.knextReruns == "") != (o.upstreamReruns == "") {
		fmt.Fprintln(os.Stderr, "usage: cricompare [-rerun-pattern] -knext KNEXT.json -upstream UPSTREAM.json "+
			"[-knext-reruns KNEXT.json -upstream-reruns UPSTREAM.json -reruns N] [-source DIR] [-markdown FILE] "+
			"[-judged-stream FILE] [-flaky FILE]")
		os.Exit(2)
	}
	var ok bool
	var err error
	if *rerunPattern {
		ok, err = true, printRerunPattern(o, os.Stdout)
	} else {
		ok, err = run(o, os.Stdout)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "cricompare:", err)
		os.Exit(2)
	}
	if !ok {
		os.Exit(1)
	}
}

type options struct {
	knext, upstream, knextReruns, upstreamReruns string
	reruns                                       int
	source, markdown, judgedStream, flaky        string
}

// column is one daemon's runs, read from its streams.
type column struct {
	runs        []compare.Run
	skipReasons map[string]string
}

// readColumns reads both columns: each first stream, as many runs in both (go test -count) unless
// one stopped early, then, if given, each reruns' stream, padded to the reruns asked for. A run
// that reported nothing ran no test.
func readColumns(o options) (knext, upstream column, err error) {
	if knext, err = readStream(o.knext, "the run"); err != nil {
		return column{}, column{}, err
	}
	if upstream, err = readStream(o.upstream, "the run"); err != nil {
		return column{}, column{}, err
	}
	n := max(len(knext.runs), len(upstream.runs))
	for _, c := range []*column{&knext, &upstream} {
		c.runs = append(c.runs, make([]compare.Run, n-len(c.runs))...)
	}
	if o.knextReruns == "" {
		return knext, upstream, nil
	}
	for _, c := range []struct {
		col  *column
		path string
	}{{&knext, o.knextReruns}, {&upstream, o.upstreamReruns}} {
		reruns, err := readStream(c.path, "the reruns")
		if err != nil {
			return column{}, column{}, err
		}
		if len(reruns.runs) > o.reruns {
			return column{}, column{}, fmt.Errorf("%s: %d runs, more than the %d asked for (-reruns)", c.path, len(reruns.runs), o.reruns)
		}
		c.col.runs = append(c.col.runs, append(reruns.runs, make([]compare.Run, o.reruns-len(reruns.runs))...)...)
	}
	return knext, upstream, nil
}

// readStream reads the runs of a test2json stream, which must report a test.
func readStream(path, what string) (column, error) {
	f, err := os.Open(path)
	if err != nil {
		return column{}, err
	}
	defer f.Close()
	runs, skipReasons, err := compare.ReadGoTestJSON(f)
	if err != nil {
		return column{}, fmt.Errorf("%s: %w", path, err)
	}
	if len(runs) == 0 {
		return column{}, fmt.Errorf("%s: %s reported no test", path, what)
	}
	return column{runs: runs, skipReasons: skipReasons}, nil
}

func printRerunPattern(o options, out io.Writer) error {
	knext, upstream, err := readColumns(o)
	if err != nil {
		return err
	}
	differing := compare.Comparison{Knext: knext.runs, Upstream: upstream.runs}.Differing()
	if len(differing) > 0 {
		fmt.Fprintln(out, compare.GoTestRunPattern(differing))
	}
	return nil
}

func run(o options, out io.Writer) (bool, error) {
	knext, upstream, err := readColumns(o)
	if err != nil {
		return false, err
	}
	var files map[string]string
	if o.source != "" {
		if files, err = testFiles(o.source); err != nil {
			return false, err
		}
	}
	results := compare.Comparison{Knext: knext.runs, Upstream: upstream.runs}.Judge()
	reran := o.knextReruns != ""

	w := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "test\tknext\tupstream\t")
	var skips []string
	for _, r := range results {
		if r.Verdict != compare.Same {
			fmt.Fprintf(w, "%s\t%s\t%s\t<- %s (%s)\n", r.Name, r.Knext[0], r.Upstream[0], r.Verdict, r.Passes())
		} else if !strings.Contains(r.Name, "/") {
			fmt.Fprintf(w, "%s\t%s\t%s\t\n", r.Name, r.Knext[0], r.Upstream[0])
		}
		if r.Knext[0] == compare.Skip || r.Upstream[0] == compare.Skip {
			reason := upstream.skipReasons[r.Name]
			if r.Knext[0] == compare.Skip {
				reason = knext.skipReasons[r.Name]
			}
			skips = append(skips, fmt.Sprintf("%s (knext %s, upstream %s): %s", r.Name, r.Knext[0], r.Upstream[0], reason))
		}
	}
	w.Flush()

	fmt.Fprintf(out, "\nknext:    %s\nupstream: %s\n", counts(knext.runs[0], nil), counts(upstream.runs[0], nil))
	if files != nil {
		table := fileTable(files, knext.runs[0], upstream.runs[0], results)
		fmt.Fprintf(out, "\nper test file (knext | upstream, top-level tests; flaky: passes per column):\n%s", table)
		if o.markdown != "" {
			if err := os.WriteFile(o.markdown, []byte(table), 0o644); err != nil {
				return false, err
			}
		}
	}
	section := func(title string, verdict compare.Verdict) {
		if selected := compare.Select(results, verdict); len(selected) > 0 {
			fmt.Fprintf(out, "\n%s:\n", title)
			for _, r := range selected {
				fmt.Fprintf(out, "  %s: %s\n", r.Name, runsOf(r))
			}
		}
	}
	if len(skips) > 0 {
		fmt.Fprintf(out, "\nskipped, with the reason the test gives:\n  %s\n", strings.Join(skips, "\n  "))
	}
	differing := len(results) - len(compare.Select(results, compare.Same))
	switch {
	case differing == 0:
		fmt.Fprintln(out, "\nNo test differs between knext and upstream.")
	case reran:
		fmt.Fprintf(out, "\n%d test(s) differed in the first run; each was run %d more times on both.\n", differing, o.reruns)
	default:
		fmt.Fprintf(out, "\n%d test(s) differed in the first run and were not rerun.\n", differing)
	}
	section("fixed (knext passes where upstream does worse, every time)", compare.Fixed)
	section("FLAKY (the difference did not hold in every run; does not fail)", compare.Flaky)
	section("REGRESSIONS (knext does worse than upstream in every run, or only one runs the test)", compare.Regression)

	if o.flaky != "" {
		var lines []string
		for _, r := range compare.Select(results, compare.Flaky) {
			lines = append(lines, r.Name+": "+r.Passes()+"\n")
		}
		if err := os.WriteFile(o.flaky, []byte(strings.Join(lines, "")), 0o644); err != nil {
			return false, err
		}
	}
	if o.judgedStream != "" {
		if err := writeJudgedStream(o.knext, o.judgedStream, results); err != nil {
			return false, err
		}
	}
	return len(compare.Select(results, compare.Regression)) == 0, nil
}

// runsOf shows a test's outcome in every run: "knext fail/pass/pass/pass; upstream pass/...
// (passes: knext 3/4, upstream 4/4)".
func runsOf(r compare.Result) string {
	join := func(outcomes []compare.Outcome) string {
		words := make([]string, len(outcomes))
		for i, o := range outcomes {
			words[i] = o.String()
		}
		return strings.Join(words, "/")
	}
	return fmt.Sprintf("knext %s; upstream %s (passes: %s)", join(r.Knext), join(r.Upstream), r.Passes())
}

// counts tallies the top-level tests of a run, those of a file only when include is set.
func counts(r compare.Run, include func(name string) bool) string {
	n := map[compare.Outcome]int{}
	for name, o := range r {
		if !strings.Contains(name, "/") && (include == nil || include(name)) {
			n[o]++
		}
	}
	return fmt.Sprintf("%d passed, %d failed, %d skipped", n[compare.Pass], n[compare.Fail], n[compare.Skip])
}

// fileTable is a Markdown table of the per-file counts of both first runs, and of the file's
// flaky tests with their passes per column.
func fileTable(files map[string]string, knext, upstream compare.Run, results []compare.Result) string {
	var b strings.Builder
	b.WriteString("| test file | tests | knext | upstream | flaky |\n| --- | --- | --- | --- | --- |\n")
	byFile := map[string][]string{}
	for test, file := range files {
		byFile[file] = append(byFile[file], test)
	}
	for _, file := range slices.Sorted(func(yield func(string) bool) {
		for file := range byFile {
			if !yield(file) {
				return
			}
		}
	}) {
		inFile := func(name string) bool { return files[name] == file }
		var flaky []string
		for _, r := range compare.Select(results, compare.Flaky) {
			if inFile(strings.SplitN(r.Name, "/", 2)[0]) {
				flaky = append(flaky, fmt.Sprintf("%s (%s)", r.Name, r.Passes()))
			}
		}
		fmt.Fprintf(&b, "| %s | %d | %s | %s | %s |\n", file, len(byFile[file]), counts(knext, inFile), counts(upstream, inFile),
			strings.Join(flaky, ", "))
	}
	return b.String()
}

var testFunc = regexp.MustCompile(`(?m)^func (Test[A-Za-z0-9_]*)\(t \*testing\.T\)`)

// testFiles maps each test function of the package in dir to its file, for the files that build
// on Linux (not *_windows_test.go, not //go:build windows).
func testFiles(dir string) (map[string]string, error) {
	paths, err := filepath.Glob(filepath.Join(dir, "*_test.go"))
	if err != nil {
		return nil, err
	}
	files := map[string]string{}
	for _, path := range paths {
		data, err := os.ReadFile(path)
		if err != nil {
			return nil, err
		}
		if strings.HasSuffix(path, "_windows_test.go") || strings.Contains(string(data), "//go:build windows\n") {
			continue
		}
		for _, m := range testFunc.FindAllStringSubmatch(string(data), -1) {
			files[m[1]] = filepath.Base(path)
		}
	}
	return files, nil
}

// writeJudgedStream copies the test2json stream in to out, with the first result of each flaky
// test turned into a pass, after a line that says why, and the package's result a pass when no
// test fails any more and nothing regressed. A flaky test that never ended (the binary crashed)
// ends so before the package's result. Every other line is copied as it is.
func writeJudgedStream(in, out string, results []compare.Result) error {
	flaky := map[string]string{}
	for _, r := range compare.Select(results, compare.Flaky) {
		flaky[r.Name] = fmt.Sprintf("    cricompare: flaky, not a regression: %s\n", runsOf(r))
	}
	regressed := len(compare.Select(results, compare.Regression)) > 0
	src, err := os.Open(in)
	if err != nil {
		return err
	}
	defer src.Close()
	dst, err := os.Create(out)
	if err != nil {
		return err
	}
	defer dst.Close()
	w := bufio.NewWriter(dst)
	emit := func(ev map[string]any) {
		data, _ := json.Marshal(ev) // strings and numbers of a decoded event: always encodable
		w.Write(append(data, '\n'))
	}
	// judge ends test as a pass, at the time of ev: its own result, or the package's.
	judge := func(ev map[string]any, test string) {
		emit(map[string]any{"Time": ev["Time"], "Action": "output", "Package": ev["Package"], "Test": test, "Output": flaky[test]})
		result := maps.Clone(ev)
		if result["Test"] != test {
			delete(result, "Elapsed")
		}
		result["Action"], result["Test"] = "pass", test
		emit(result)
	}

	started, ended := map[string]bool{}, map[string]bool{}
	failing := false
	sc := bufio.NewScanner(src)
	sc.Buffer(make([]byte, 1024*1024), 16*1024*1024)
	for sc.Scan() {
		var ev map[string]any
		if json.Unmarshal(sc.Bytes(), &ev) != nil {
			w.Write(append(slices.Clone(sc.Bytes()), '\n'))
			continue
		}
		test, _ := ev["Test"].(string)
		action, _ := ev["Action"].(string)
		switch {
		case test == "" && (action == "fail" || action == "pass"):
			// The package's result: every test has reported by now.
			for _, name := range slices.Sorted(maps.Keys(started)) {
				if ended[name] {
					continue
				}
				if flaky[name] == "" {
					failing = true
				} else {
					judge(ev, name)
				}
			}
			if action == "fail" && !failing && !regressed {
				ev["Action"] = "pass"
			}
			emit(ev)
		case test != "" && action == "run":
			started[test] = true
			w.Write(append(slices.Clone(sc.Bytes()), '\n'))
		case test != "" && (action == "fail" || action == "pass" || action == "skip") && !ended[test]:
			ended[test] = true
			if action == "fail" && flaky[test] != "" {
				judge(ev, test)
				continue
			}
			failing = failing || action == "fail"
			w.Write(append(slices.Clone(sc.Bytes()), '\n'))
		default:
			w.Write(append(slices.Clone(sc.Bytes()), '\n'))
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("%s: %w", in, err)
	}
	if err := w.Flush(); err != nil {
		return err
	}
	return dst.Close()
}
