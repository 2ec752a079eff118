// Command cricompare compares two runs of containerd's CRI integration tests (upstream's
// integration package), one against knext and one against upstream containerd, side by side.
//
//	cricompare -knext KNEXT.json -upstream UPSTREAM.json [-source DIR] [-markdown FILE]
//
// Each run is a `go test -json` (test2json) stream. It prints every top-level test with its
// result in both columns, every subtest whose results differ, every skip with the reason the test
// printed, and the counts; with -source (the integration package's directory) the counts per test
// file too, and -markdown writes them as a table. It exits 1 when knext fails or skips a test that
// passes on upstream, or when a run is missing a test the other ran.
package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"text/tabwriter"
)

// outcome is a test's result in one run; "" if the run did not report the test.
type outcome string

const (
	pass outcome = "pass"
	fail outcome = "fail"
	skip outcome = "skip"
)

// result is what one run says of one test.
type result struct {
	Outcome outcome
	// Reason is what the test printed last before it was skipped (upstream's own skip message).
	Reason string
}

// run is the results of one run, by test name (subtests as Parent/Sub).
type run map[string]result

func main() {
	knext := flag.String("knext", "", "test2json stream of the run against knext")
	upstream := flag.String("upstream", "", "test2json stream of the run against upstream containerd")
	source := flag.String("source", "", "directory of the integration package, to count per test file")
	markdown := flag.String("markdown", "", "write the per-file counts as a Markdown table to this file")
	flag.Parse()
	if *knext == "" || *upstream == "" {
		fmt.Fprintln(os.Stderr, "usage: cricompare -knext KNEXT.json -upstream UPSTREAM.json [-source DIR] [-markdown FILE]")
		os.Exit(2)
	}
	ok, err := compare(*knext, *upstream, *source, *markdown, os.Stdout)
	if err != nil {
		fmt.Fprintln(os.Stderr, "cricompare:", err)
		os.Exit(2)
	}
	if !ok {
		os.Exit(1)
	}
}

func compare(knextPath, upstreamPath, source, markdown string, out io.Writer) (bool, error) {
	var runs [2]run
	for i, path := range []string{knextPath, upstreamPath} {
		f, err := os.Open(path)
		if err != nil {
			return false, err
		}
		runs[i], err = parse(f)
		f.Close()
		if err != nil {
			return false, fmt.Errorf("%s: %w", path, err)
		}
	}
	knext, upstream := runs[0], runs[1]
	var files map[string]string
	if source != "" {
		var err error
		if files, err = testFiles(source); err != nil {
			return false, err
		}
	}

	names := slices.Sorted(func(yield func(string) bool) {
		seen := map[string]bool{}
		for _, r := range runs {
			for name := range r {
				if !seen[name] && !yield(name) {
					return
				}
				seen[name] = true
			}
		}
	})
	w := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "test\tknext\tupstream\t")
	var regressions, differences, skips []string
	for _, name := range names {
		k, u := knext[name], upstream[name]
		differs := k.Outcome != u.Outcome
		if !strings.Contains(name, "/") || differs {
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\n", name, column(k), column(u), map[bool]string{true: "<- differs"}[differs])
		}
		switch {
		case u.Outcome == pass && k.Outcome != pass, k.Outcome == "" && u.Outcome != "", u.Outcome == "" && k.Outcome != "":
			regressions = append(regressions, fmt.Sprintf("%s: knext %s, upstream %s", name, column(k), column(u)))
		case differs:
			differences = append(differences, fmt.Sprintf("%s: knext %s, upstream %s", name, column(k), column(u)))
		}
		if k.Outcome == skip || u.Outcome == skip {
			reason := u.Reason
			if k.Outcome == skip {
				reason = k.Reason
			}
			skips = append(skips, fmt.Sprintf("%s (knext %s, upstream %s): %s", name, column(k), column(u), reason))
		}
	}
	w.Flush()

	fmt.Fprintf(out, "\nknext:    %s\nupstream: %s\n", counts(knext, nil), counts(upstream, nil))
	if files != nil {
		table := fileTable(files, knext, upstream)
		fmt.Fprintf(out, "\nper test file (knext | upstream, top-level tests):\n%s", table)
		if markdown != "" {
			if err := os.WriteFile(markdown, []byte(table), 0o644); err != nil {
				return false, err
			}
		}
	}
	section := func(title string, lines []string) {
		if len(lines) > 0 {
			fmt.Fprintf(out, "\n%s:\n  %s\n", title, strings.Join(lines, "\n  "))
		}
	}
	section("skipped, with the reason the test gives", skips)
	section("other differences (knext does not do worse)", differences)
	section("REGRESSIONS: passed on upstream, not on knext, or run by only one", regressions)
	if len(knext) == 0 || len(upstream) == 0 {
		return false, errors.New("a run reported no test")
	}
	return len(regressions) == 0, nil
}

func column(r result) string {
	if r.Outcome == "" {
		return "-"
	}
	return string(r.Outcome)
}

// counts tallies the top-level tests of r, those of file only when include is set.
func counts(r run, include func(name string) bool) string {
	n := map[outcome]int{}
	for name, res := range r {
		if !strings.Contains(name, "/") && (include == nil || include(name)) {
			n[res.Outcome]++
		}
	}
	return fmt.Sprintf("%d passed, %d failed, %d skipped", n[pass], n[fail], n[skip])
}

// fileTable is a Markdown table of the per-file counts of both runs.
func fileTable(files map[string]string, knext, upstream run) string {
	var b strings.Builder
	b.WriteString("| test file | tests | knext | upstream |\n| --- | --- | --- | --- |\n")
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
		fmt.Fprintf(&b, "| %s | %d | %s | %s |\n", file, len(byFile[file]), counts(knext, inFile), counts(upstream, inFile))
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

// event is the part of a test2json event read here.
type event struct {
	Action string
	Test   string
	Output string
}

// parse reads a test2json stream. Lines that are not test2json (a crash's output, say) are
// ignored: a test that never reported a result is missing from the run.
func parse(r io.Reader) (run, error) {
	results := run{}
	last := map[string]string{} // test -> the last line it printed of its own
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1024*1024), 16*1024*1024)
	for sc.Scan() {
		var ev event
		if json.Unmarshal(sc.Bytes(), &ev) != nil || ev.Test == "" {
			continue
		}
		switch ev.Action {
		case "output":
			line := strings.TrimSpace(ev.Output)
			if line != "" && !strings.HasPrefix(line, "=== ") && !strings.HasPrefix(line, "--- ") {
				last[ev.Test] = line
			}
		case "pass", "fail":
			results[ev.Test] = result{Outcome: outcome(ev.Action)}
		case "skip":
			results[ev.Test] = result{Outcome: skip, Reason: last[ev.Test]}
		}
	}
	return results, sc.Err()
}
