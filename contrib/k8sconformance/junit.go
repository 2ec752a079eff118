package main

import (
	"errors"
	"fmt"
	"regexp"
	"strings"

	"github.com/joshdk/go-junit"
)

// specPrefix starts the JUnit name of every spec: Ginkgo names a test case by its node type and
// its full text, "[It] [sig-network] DNS should ...", and a suite node by its type alone,
// "[SynchronizedBeforeSuite]", "[ReportAfterSuite] Kubernetes e2e JUnit report", ...
const specPrefix = "[It] "

// readJUnit returns the outcome of every spec of an e2e.test JUnit report whose full text matches
// focus (the specs a run selected; the report lists the others as skipped too), by full text. A
// failed suite node (the suite's set-up or teardown) is an error: the specs did not run as they
// should.
func readJUnit(path string, focus *regexp.Regexp) (map[string]outcome, error) {
	suites, err := junit.IngestFile(path)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	specs := map[string]outcome{}
	var suiteErrors []error
	for _, suite := range suites {
		for _, test := range suite.Tests {
			o := outcome{State: passed, Message: test.Message, Duration: test.Duration.Seconds()}
			switch test.Status {
			case junit.StatusSkipped:
				o.State = skipped
			case junit.StatusFailed, junit.StatusError:
				o.State = failed
				if test.Error != nil {
					o.Message = test.Error.Error()
				}
			}
			name, isSpec := strings.CutPrefix(test.Name, specPrefix)
			switch {
			case !isSpec:
				if o.State == failed {
					suiteErrors = append(suiteErrors, fmt.Errorf("%s failed: %s", test.Name, firstLine(o.Message)))
				}
			case focus.MatchString(name):
				specs[name] = o
			}
		}
	}
	if err := errors.Join(suiteErrors...); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if len(specs) == 0 {
		return nil, fmt.Errorf("%s: no spec matches %q", path, focus)
	}
	return specs, nil
}

// firstLine is the first non-empty line of message.
func firstLine(message string) string {
	for line := range strings.Lines(message) {
		if line = strings.TrimSpace(line); line != "" {
			return line
		}
	}
	return ""
}
