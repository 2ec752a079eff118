package conformance

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/knext-dev/knext/internal/compare"
)

// writeReport writes a Ginkgo JSON report with the given It nodes (name -> state and message)
// after a BeforeSuite in beforeSuiteState.
func writeReport(t *testing.T, beforeSuiteState string, specs ...[3]string) string {
	t.Helper()
	var b strings.Builder
	b.WriteString(`[{"SuiteDescription":"CRI validation","SpecReports":[`)
	b.WriteString(`{"ContainerHierarchyTexts":null,"LeafNodeType":"BeforeSuite","LeafNodeText":"","State":"` + beforeSuiteState + `"}`)
	for _, s := range specs {
		failure := "null"
		if s[2] != "" {
			failure = `{"Message":"` + s[2] + `\nmore detail"}`
		}
		b.WriteString(`,{"ContainerHierarchyTexts":["[k8s.io] Networking","runtime should support networking"],` +
			`"LeafNodeType":"It","LeafNodeText":"` + s[0] + `","State":"` + s[1] + `","Failure":` + failure + `}`)
	}
	b.WriteString(`]}]`)
	path := filepath.Join(t.TempDir(), "report.json")
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestReadReportMapsGinkgoStates(t *testing.T) {
	specs, err := readReport(writeReport(t, "passed",
		[3]string{"a", "passed", ""}, [3]string{"b", "panicked", "boom"}, [3]string{"c", "timedout", "slow"},
		[3]string{"d", "skipped", "AppArmor is disabled on this host"}, [3]string{"e", "skipped", ""},
		[3]string{"f", "pending", ""}))
	if err != nil {
		t.Fatal(err)
	}
	prefix := "[k8s.io] Networking runtime should support networking "
	want := map[string]outcome{
		"a": {state: "passed", message: ""},
		"b": {state: "failed", message: "boom more detail"},
		"c": {state: "failed", message: "slow more detail"},
		"d": {state: "skipped", message: "AppArmor is disabled on this host more detail"},
		"e": {state: "skipped", message: "not selected (-ginkgo.skip or -ginkgo.focus)"},
		"f": {state: "skipped", message: "not selected (-ginkgo.skip or -ginkgo.focus)"},
	}
	if len(specs) != len(want) {
		t.Errorf("got %d specs, want %d (the passed BeforeSuite is no spec): %v", len(specs), len(want), specs)
	}
	for leaf, o := range want {
		if got := specs[prefix+leaf]; got != o {
			t.Errorf("spec %s: %+v, want %+v", leaf, got, o)
		}
	}
}

func TestReadReportCountsAFailedSuiteSetUp(t *testing.T) {
	specs, err := readReport(writeReport(t, "failed", [3]string{"a", "skipped", ""}))
	if err != nil {
		t.Fatal(err)
	}
	r := &result{specs: specs}
	if r.count("failed") != 1 || specs["[BeforeSuite]"].state != "failed" {
		t.Errorf("a failed BeforeSuite gave %v, want it counted as a failure", specs)
	}
}

func TestReadReportRejectsEmptyReports(t *testing.T) {
	path := filepath.Join(t.TempDir(), "report.json")
	if err := os.WriteFile(path, []byte(`[{"SpecReports":[]}]`), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := readReport(path); err == nil || !strings.Contains(err.Error(), "no specs") {
		t.Errorf("empty report: err = %v, want 'no specs'", err)
	}
	if _, err := readReport(filepath.Join(t.TempDir(), "missing.json")); err == nil {
		t.Error("missing report: no error")
	}
}

// specs makes a report's specs from their states; a spec that did not pass gets a message.
func specs(config string, states map[string]string) map[string]outcome {
	specs := map[string]outcome{}
	for name, state := range states {
		msg := ""
		if state != "passed" {
			msg = name + " " + state + " in " + config
		}
		specs[name] = outcome{state: state, message: msg}
	}
	return specs
}

// results makes the first runs of the configurations, in their order.
func results(states ...map[string]string) []*result {
	var rs []*result
	for i, s := range states {
		rs = append(rs, &result{config: configurations[i], specs: specs(configurations[i].name, s)})
	}
	return rs
}

// rerun adds a rerun to each configuration, in which the specs not given were not selected.
func rerun(rs []*result, states ...map[string]string) {
	for i, r := range rs {
		rerun := specs(r.config.name, states[i])
		for name := range r.specs {
			if _, selected := rerun[name]; !selected {
				rerun[name] = outcome{state: "skipped", message: notSelected}
			}
		}
		r.reruns = append(r.reruns, rerun)
	}
}

func printed(c comparison) string {
	var out bytes.Buffer
	c.print(&out)
	return out.String()
}

func TestCompareJudgesEveryDifferenceAfterItsReruns(t *testing.T) {
	rs := results(
		map[string]string{"hostport": "passed", "dns": "passed", "apparmor": "skipped", "userns": "failed"},
		map[string]string{"hostport": "passed", "dns": "passed", "apparmor": "skipped", "userns": "failed"},
		map[string]string{"hostport": "failed", "apparmor": "skipped", "userns": "failed"},
	)
	if got := strings.Join(compareResults(rs).differing(), ","); got != "dns,hostport" {
		t.Errorf("differing = %q, want dns (missing in one report) and hostport", got)
	}
	for range 3 {
		rerun(rs, map[string]string{"hostport": "passed", "dns": "passed"}, map[string]string{"hostport": "passed", "dns": "passed"},
			map[string]string{"hostport": "failed", "dns": "passed"})
	}
	c := compareResults(rs)
	if strings.Join(c.failed, ",") != "userns" || strings.Join(c.skipped, ",") != "apparmor" {
		t.Errorf("failed everywhere %v, skipped everywhere %v; want userns and apparmor", c.failed, c.skipped)
	}
	if got, want := strings.Join(c.selected(compare.Regression), ","), "hostport"; got != want {
		t.Errorf("regressions %q, want %q", got, want)
	}
	if got, want := strings.Join(c.selected(compare.Flaky), ","), "dns"; got != want {
		t.Errorf("flaky %q, want %q (missing in the first run, then passed)", got, want)
	}
	out := printed(c)
	for _, want := range []string{
		"passed                   2               2               0",
		"flaky                    -               0               1",
		"knext-cniless   failed: hostport failed in knext-cniless\n                    runs: fail/fail/fail/fail (0/4 passed, regression)",
		"knext-cniless   not in the report\n                    runs: not run/pass/pass/pass (3/4 passed, flaky)",
		"knext-cni       passed\n                    runs: pass/pass/pass/pass (4/4 passed, same)",
		"REGRESSIONS (worse than upstream-cni in every run):\n  hostport\n    knext-cniless: knext-cniless 0/4, upstream-cni 4/4",
		"FLAKY (the difference from upstream-cni did not hold in every run; does not fail):\n  dns\n    knext-cniless: knext-cniless 3/4, upstream-cni 4/4",
		"Skipped in every configuration (1; why: docs/conformance.md):\n  apparmor\n    apparmor skipped in upstream-cni", //nolint:dupword // the spec, then where it was skipped
	} {
		if !strings.Contains(out, want) {
			t.Errorf("printed comparison lacks %q:\n%s", want, out)
		}
	}
	err := c.verdict()
	if err == nil || !strings.Contains(err.Error(), "knext-cniless regressed against upstream-cni in 1 spec(s)") ||
		!strings.Contains(err.Error(), "1 spec(s) failed in every configuration") || strings.Contains(err.Error(), "knext-cni regressed") {
		t.Errorf("verdict = %v, want the regression and the failure everywhere named", err)
	}
}

func TestAFlakeDoesNotFailTheVerdict(t *testing.T) {
	rs := results(map[string]string{"a": "passed", "b": "passed"}, map[string]string{"a": "failed", "b": "passed"},
		map[string]string{"a": "passed", "b": "passed"})
	if err := compareResults(rs).verdict(); err == nil {
		t.Error("a spec failed on knext-cni and was not rerun: verdict nil, want a regression")
	}
	rerun(rs, map[string]string{"a": "passed"}, map[string]string{"a": "failed"}, map[string]string{"a": "passed"})
	rerun(rs, map[string]string{"a": "passed"}, map[string]string{"a": "passed"}, map[string]string{"a": "passed"})
	rerun(rs, map[string]string{"a": "passed"}, map[string]string{"a": "passed"}, map[string]string{"a": "passed"})
	c := compareResults(rs)
	if err := c.verdict(); err != nil {
		t.Errorf("a spec that passed on knext-cni in two reruns of three: verdict %v, want nil", err)
	}
	if out := printed(c); !strings.Contains(out, "FLAKY (the difference from upstream-cni did not hold in every run; does not fail):\n  a\n    knext-cni: knext-cni 2/4, upstream-cni 4/4") ||
		!strings.Contains(out, "flaky                    -               1               0") {
		t.Errorf("printed comparison does not report the flake:\n%s", out)
	}
}

func TestCriticalRacesAreJudgedOverEveryRun(t *testing.T) {
	lostSync := outcome{state: "skipped", message: "spec discrepancy: containerd loses containers created while ..."}
	t.Run("upstream loses it every time", func(t *testing.T) {
		rs := results(map[string]string{"sync": "skipped"}, map[string]string{"sync": "passed"}, map[string]string{"sync": "passed"})
		rs[0].specs["sync"] = lostSync
		for range 3 {
			rerun(rs, map[string]string{"sync": "skipped"}, map[string]string{"sync": "passed"}, map[string]string{"sync": "passed"})
			rs[0].reruns[len(rs[0].reruns)-1]["sync"] = lostSync
		}
		c := compareResults(rs)
		if err := c.verdict(); err != nil {
			t.Errorf("only upstream lost the race: verdict %v, want nil", err)
		}
		if out := printed(c); !strings.Contains(out, "Fixed (better than upstream-cni in every run):\n  sync\n    knext-cni: knext-cni 4/4, upstream-cni 0/4") {
			t.Errorf("printed comparison does not list knext as better:\n%s", out)
		}
	})
	t.Run("knext loses it once", func(t *testing.T) {
		rs := results(map[string]string{"sync": "passed"}, map[string]string{"sync": "skipped"}, map[string]string{"sync": "passed"})
		rs[1].specs["sync"] = lostSync
		for range 3 {
			rerun(rs, map[string]string{"sync": "passed"}, map[string]string{"sync": "passed"}, map[string]string{"sync": "passed"})
		}
		if err := compareResults(rs).verdict(); err != nil {
			t.Errorf("knext-cni lost the race once, then won it: verdict %v, want nil", err)
		}
	})
	t.Run("all lose it", func(t *testing.T) {
		rs := results(map[string]string{"sync": "skipped"}, map[string]string{"sync": "skipped"}, map[string]string{"sync": "skipped"})
		for _, r := range rs {
			r.specs["sync"] = lostSync
		}
		// Upstream may lose the race; knext must not.
		if err := compareResults(rs).verdict(); err == nil || !strings.Contains(err.Error(), "knext-cni lost the race critest probes in 1 spec(s): sync") ||
			strings.Contains(err.Error(), "upstream-cni lost") {
			t.Errorf("verdict %v, want the knext configurations, and only them, named for the race they lost", err)
		}
	})
}

func TestVerdictPassesOnlyRunsThatRan(t *testing.T) {
	same := map[string]string{"a": "passed", "b": "skipped"}
	if err := compareResults(results(same, same, same)).verdict(); err != nil {
		t.Errorf("equal runs without failures: verdict %v, want nil", err)
	}
	rs := results(same, same, same)
	rs[1].err, rs[1].specs = os.ErrNotExist, nil
	if err := compareResults(rs).verdict(); err == nil || !strings.Contains(err.Error(), "knext-cni did not run") {
		t.Errorf("a configuration that did not run: verdict %v, want it named", err)
	}
	rs = results(same, same, same)
	rs[2].readReruns(t.TempDir(), 1)
	if err := compareResults(rs).verdict(); err == nil || !strings.Contains(err.Error(), "knext-cniless did not run") {
		t.Errorf("a rerun without a report: verdict %v, want its configuration named", err)
	}
}

func TestSummarizeKeepsTheErrorAndDropsValueDumps(t *testing.T) {
	message := "Timed out after 60.001s.\nExpected success, but got an error:\n    <*url.Error | 0x14c33c29bb60>: \n" +
		"    Get \"http://127.0.0.1:12000\": dial tcp 127.0.0.1:12000: connect: connection refused\n    {\n" +
		"        Op: \"Get\",\n        URL: \"http://127.0.0.1:12000\",\n        Err: <*net.OpError | 0x14c33c10ed70>{\n"
	want := `Timed out after 60.001s. Expected success, but got an error: Get "http://127.0.0.1:12000": dial tcp 127.0.0.1:12000: connect: connection refused`
	if got := summarize(message); got != want {
		t.Errorf("summarize =\n%s\nwant\n%s", got, want)
	}
	if got := summarize("AppArmor is disabled on this host"); got != "AppArmor is disabled on this host" {
		t.Errorf("one-line message changed to %q", got)
	}
}
