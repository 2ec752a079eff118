// Command testsum counts the tests of one suite from a `go test -json` (test2json) stream and
// prints the per-suite and total tally of `make test`.
//
//	SUITE_COMMAND | testsum count -suite NAME -results FILE   # appends one row to FILE
//	testsum report -results FILE                              # table; exit 1 if a suite failed
//
// A suite fails when a test fails, when the stream is not test2json (a build error, say), or when
// it ran nothing: a suite that silently ran no test must not read as green.
package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
)

// event is the part of a test2json event that testsum reads.
type event struct {
	Action  string
	Package string
	Test    string
	Output  string
}

// tally is one suite's result; it is also the row format of the results file.
type tally struct {
	Suite                   string
	Passed, Failed, Skipped int
	BrokenPackages          []string
	StreamError             string
	ExitCode                int
}

func (t tally) ok() bool {
	return t.Failed == 0 && len(t.BrokenPackages) == 0 && t.StreamError == "" && t.ExitCode == 0 &&
		t.Passed > 0
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: testsum count -suite NAME -results FILE [-exit CODE] | testsum report -results FILE")
		os.Exit(2)
	}
	fs := flag.NewFlagSet(os.Args[1], flag.ExitOnError)
	suite := fs.String("suite", "", "suite name")
	results := fs.String("results", "", "results file (one JSON row per suite)")
	exitCode := fs.Int("exit", 0, "exit code of the suite's command, when the caller knows it")
	_ = fs.Parse(os.Args[2:])
	if *results == "" {
		fmt.Fprintln(os.Stderr, "testsum: -results is required")
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "count":
		err = count(*suite, *results, *exitCode, os.Stdin, os.Stderr)
	case "report":
		var ok bool
		ok, err = report(*results, os.Stdout)
		if err == nil && !ok {
			os.Exit(1)
		}
	default:
		err = fmt.Errorf("unknown command %q", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "testsum:", err)
		os.Exit(2)
	}
}

// count reads one suite's stream, echoes the output of failed tests to log, and appends the tally.
func count(suite, results string, exitCode int, stream io.Reader, log io.Writer) error {
	if suite == "" {
		return errors.New("count needs -suite")
	}
	t := tallyStream(suite, stream, log)
	t.ExitCode = exitCode
	f, err := os.OpenFile(results, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	defer f.Close()
	row, err := json.Marshal(t)
	if err != nil {
		return err
	}
	fmt.Fprintf(log, "suite %s: %s\n", suite, t.summary())
	_, err = fmt.Fprintf(f, "%s\n", row)
	return err
}

func tallyStream(suite string, stream io.Reader, log io.Writer) tally {
	t := tally{Suite: suite}
	output := map[string]*strings.Builder{} // test -> its output, echoed only if it fails
	sc := bufio.NewScanner(stream)
	sc.Buffer(make([]byte, 1024*1024), 16*1024*1024)
	for sc.Scan() {
		var ev event
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil || ev.Action == "" {
			if t.StreamError == "" {
				t.StreamError = "not a test2json line: " + truncate(sc.Text(), 200)
			}
			fmt.Fprintln(log, sc.Text())
			continue
		}
		key := ev.Package + "." + ev.Test
		switch ev.Action {
		case "output":
			if ev.Test == "" {
				continue
			}
			b := output[key]
			if b == nil {
				b = &strings.Builder{}
				output[key] = b
			}
			b.WriteString(ev.Output)
		case "pass":
			if ev.Test != "" {
				t.Passed++
			}
			delete(output, key)
		case "skip":
			if ev.Test != "" {
				t.Skipped++
			}
			delete(output, key)
		case "fail":
			if ev.Test == "" {
				// A package that fails without a failing test did not build or crashed.
				t.BrokenPackages = append(t.BrokenPackages, ev.Package)
				continue
			}
			t.Failed++
			if b := output[key]; b != nil {
				fmt.Fprintf(log, "--- FAIL %s %s\n%s", ev.Package, ev.Test, b.String())
			}
			delete(output, key)
		}
	}
	if err := sc.Err(); err != nil && t.StreamError == "" {
		t.StreamError = err.Error()
	}
	// A package fails as a whole when one of its tests fails; only count it as broken otherwise.
	if t.Failed > 0 {
		t.BrokenPackages = nil
	}
	return t
}

func (t tally) summary() string {
	s := fmt.Sprintf("%d passed, %d failed, %d skipped", t.Passed, t.Failed, t.Skipped)
	switch {
	case len(t.BrokenPackages) > 0:
		s += "; packages failed without a failing test (build error or crash): " + strings.Join(t.BrokenPackages, ", ")
	case t.StreamError != "":
		s += "; " + t.StreamError
	case t.ExitCode != 0:
		s += "; command exited " + strconv.Itoa(t.ExitCode)
	case t.Passed == 0:
		s += "; ran no test"
	}
	return s
}

func report(results string, out io.Writer) (bool, error) {
	data, err := os.ReadFile(results)
	if err != nil {
		return false, err
	}
	var total tally
	allOK := true
	fmt.Fprintf(out, "%-28s %7s %7s %7s  %s\n", "suite", "passed", "failed", "skipped", "result")
	for line := range strings.SplitSeq(strings.TrimSpace(string(data)), "\n") {
		var t tally
		if err := json.Unmarshal([]byte(line), &t); err != nil {
			return false, fmt.Errorf("results file %s: %w", results, err)
		}
		verdict := "ok"
		if !t.ok() {
			verdict = "FAILED: " + t.summary()
			allOK = false
		}
		fmt.Fprintf(out, "%-28s %7d %7d %7d  %s\n", t.Suite, t.Passed, t.Failed, t.Skipped, verdict)
		total.Passed += t.Passed
		total.Failed += t.Failed
		total.Skipped += t.Skipped
	}
	fmt.Fprintf(out, "total: %d passed, %d failed, %d skipped\n", total.Passed, total.Failed, total.Skipped)
	return allOK, nil
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n] + "..."
	}
	return s
}
