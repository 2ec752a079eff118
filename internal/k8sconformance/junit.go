package k8sconformance

import (
	"errors"
	"fmt"
	"regexp"
	"strings"

	"github.com/joshdk/go-junit"

	"github.com/knext-dev/knext/internal/compare"
)

// specPrefix starts the JUnit name of every spec: Ginkgo names a test case by its node type and
// its full text, "[It] [sig-network] DNS should ...", and a suite node by its type alone,
// "[SynchronizedBeforeSuite]", "[ReportAfterSuite] Kubernetes e2e JUnit report", ...
const specPrefix = "[It] "

// readJUnit returns the outcome of every spec of an e2e.test JUnit report that focus selects (the
// report lists the others as skipped too), by full text. A
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
			o := outcome{State: compare.Pass, Message: test.Message, Duration: test.Duration.Seconds()}
			switch test.Status {
			case junit.StatusSkipped:
				o.State = compare.Skip
			case junit.StatusFailed, junit.StatusError:
				o.State = compare.Fail
				if test.Error != nil {
					o.Message = test.Error.Error()
				}
			}
			name, isSpec := strings.CutPrefix(test.Name, specPrefix)
			switch {
			case !isSpec:
				if o.State == compare.Fail {
					suiteErrors = append(suiteErrors, fmt.Errorf("%s failed: %s", test.Name, firstLine(o.Message)))
				}
			// Ginkgo matches the focus against the suite's description, a space and the
			// spec's full text; the JUnit report names the suite in every test's class.
			case focus.MatchString(test.Classname + " " + name):
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
