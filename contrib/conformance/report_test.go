package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
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

func results(states ...map[string]string) []*result {
	var rs []*result
	for i, s := range states {
		r := &result{config: configurations[i], specs: map[string]outcome{}}
		for name, state := range s {
			msg := ""
			if state != "passed" {
				msg = name + " " + state + " in " + r.config.name
			}
			r.specs[name] = outcome{state: state, message: msg}
		}
		rs = append(rs, r)
	}
	return rs
}

func TestCompareNamesEveryDifferingSpec(t *testing.T) {
	c := compare(results(
		map[string]string{"hostport": "passed", "dns": "passed", "apparmor": "skipped", "userns": "failed"},
		map[string]string{"hostport": "passed", "dns": "passed", "apparmor": "skipped", "userns": "failed"},
		map[string]string{"hostport": "failed", "apparmor": "skipped", "userns": "failed"},
	))
	if got := strings.Join(c.differing, ","); got != "dns,hostport" {
		t.Errorf("differing = %q, want dns (missing in one report) and hostport", got)
	}
	if strings.Join(c.failed, ",") != "userns" || strings.Join(c.skipped, ",") != "apparmor" {
		t.Errorf("failed everywhere %v, skipped everywhere %v; want userns and apparmor", c.failed, c.skipped)
	}
	var out bytes.Buffer
	c.print(&out)
	for _, want := range []string{
		"passed                   2               2               0",
		"knext-cniless   failed: hostport failed in knext-cniless",
		"knext-cniless   not in the report",
		"Skipped in every configuration (1; why: docs/conformance.md):\n  apparmor\n    apparmor skipped in upstream-cni", //nolint:dupword // the spec, then where it was skipped
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("printed comparison lacks %q:\n%s", want, out.String())
		}
	}
	err := c.verdict()
	if err == nil || !strings.Contains(err.Error(), "knext-cniless failed 2 spec(s)") || !strings.Contains(err.Error(), "2 spec(s) differ") {
		t.Errorf("verdict = %v, want the failures and the differences named", err)
	}
}

func TestVerdictPassesOnlyEqualCleanRuns(t *testing.T) {
	same := map[string]string{"a": "passed", "b": "skipped"}
	if err := compare(results(same, same, same)).verdict(); err != nil {
		t.Errorf("equal runs without failures: verdict %v, want nil", err)
	}
	rs := results(same, same, same)
	rs[1].err, rs[1].specs = os.ErrNotExist, nil
	if err := compare(rs).verdict(); err == nil || !strings.Contains(err.Error(), "knext-cni did not run") {
		t.Errorf("a configuration that did not run: verdict %v, want it named", err)
	}
}

func TestCompareSetsApartSpecDiscrepancyRaces(t *testing.T) {
	rs := results(map[string]string{"sync": "passed", "lost": "skipped"},
		map[string]string{"sync": "skipped", "lost": "skipped"},
		map[string]string{"sync": "passed", "lost": "passed"})
	rs[1].specs["sync"] = outcome{state: "skipped", message: "spec discrepancy: containerd loses containers created while ..."}
	for _, r := range rs[:2] {
		r.specs["lost"] = outcome{state: "skipped", message: "spec discrepancy: containerd lost 5 container(s)"}
	}
	rs[2].specs["other"] = outcome{state: "passed", message: ""}
	rs[0].specs["other"] = outcome{state: "skipped", message: "AppArmor is disabled on this host"}
	rs[1].specs["other"] = outcome{state: "skipped", message: "AppArmor is disabled on this host"}
	c := compare(rs)
	if got := strings.Join(c.timingDependent, ","); got != "lost,sync" {
		t.Errorf("timing-dependent = %q, want lost,sync", got)
	}
	if got := strings.Join(c.differing, ","); got != "other" {
		t.Errorf("differing = %q, want other: an ordinary skip against a pass is a difference", got)
	}
	var out bytes.Buffer
	c.print(&out)
	if !strings.Contains(out.String(), "2 spec(s) passed or hit critest's \"spec discrepancy:\" by chance") {
		t.Errorf("printed comparison does not set the races apart:\n%s", out.String())
	}
	// Upstream may lose the race; knext must not.
	if err := c.verdict(); err == nil || !strings.Contains(err.Error(), "knext-cni lost the race critest probes in 2 spec(s): lost; sync") ||
		strings.Contains(err.Error(), "upstream-cni lost") {
		t.Errorf("verdict %v, want knext-cni, and only it, named for the races it lost", err)
	}
	rs[1].specs["sync"] = outcome{state: "passed"}
	rs[1].specs["lost"] = outcome{state: "passed"}
	rs[1].specs["other"] = rs[2].specs["other"]
	rs[0].specs["other"] = rs[2].specs["other"]
	if err := compare(rs).verdict(); err != nil {
		t.Errorf("only upstream lost the races: verdict %v, want nil", err)
	}
}

func TestCompareListsSpecsPassedOnARetry(t *testing.T) {
	same := map[string]string{"a": "passed"}
	rs := results(same, same, same)
	rs[0].specs["a"] = outcome{state: "passed", attempts: 2}
	c := compare(rs)
	if err := c.verdict(); err != nil {
		t.Errorf("a spec passed on a retry: verdict %v, want nil", err)
	}
	var out bytes.Buffer
	c.print(&out)
	if want := "  a\n    upstream-cni: passed on attempt 2\n"; !strings.Contains(out.String(), want) {
		t.Errorf("printed comparison lacks %q:\n%s", want, out.String())
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
