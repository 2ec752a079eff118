package compare

import (
	"bufio"
	"encoding/json"
	"io"
	"regexp"
	"slices"
	"strings"
)

// goTestEvent is the part of a test2json event read here.
type goTestEvent struct {
	Action string
	Test   string
	Output string
}

// ReadGoTestJSON reads a `go test -json` (test2json) stream: the i-th result a test reports goes
// to the i-th run, so a test binary run with -count N gives N runs. skipReasons holds, for each
// test skipped in the first run, the last line it printed before (the test's skip message). Lines
// that are not test2json (a crash's output) are ignored: a test that never reported a result is
// not in the run.
func ReadGoTestJSON(r io.Reader) (runs []Run, skipReasons map[string]string, err error) {
	skipReasons = map[string]string{}
	last := map[string]string{} // test -> the last line it printed of its own
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1024*1024), 16*1024*1024)
	for sc.Scan() {
		var ev goTestEvent
		if json.Unmarshal(sc.Bytes(), &ev) != nil || ev.Test == "" {
			continue
		}
		switch ev.Action {
		case "output":
			line := strings.TrimSpace(ev.Output)
			if line != "" && !strings.HasPrefix(line, "=== ") && !strings.HasPrefix(line, "--- ") {
				last[ev.Test] = line
			}
		case "pass", "fail", "skip":
			i := slices.IndexFunc(runs, func(run Run) bool { _, done := run[ev.Test]; return !done })
			if i < 0 {
				runs, i = append(runs, Run{}), len(runs)
			}
			runs[i][ev.Test] = Outcome(ev.Action)
			if ev.Action == "skip" && i == 0 {
				skipReasons[ev.Test] = last[ev.Test]
			}
		}
	}
	return runs, skipReasons, sc.Err()
}

// GoTestRunPattern is the `go test -run` pattern that selects exactly the given tests (names as
// go test reports them: Parent/Sub): '^TestA$/^sub$|^TestB$'. A test whose subtests are among the
// names runs with those subtests only.
func GoTestRunPattern(names []string) string {
	var alternatives []string
	for _, name := range names {
		if slices.ContainsFunc(names, func(other string) bool { return strings.HasPrefix(other, name+"/") }) {
			continue
		}
		levels := strings.Split(name, "/")
		for i, level := range levels {
			levels[i] = "^" + regexp.QuoteMeta(level) + "$"
		}
		alternatives = append(alternatives, strings.Join(levels, "/"))
	}
	slices.Sort(alternatives)
	return strings.Join(slices.Compact(alternatives), "|")
}
