package build

import (
	"bufio"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// nriOnly narrows the scripts to NRI: a smaller tree to materialize, and the module whose series
// the others build on.
var nriOnly = []string{"KNEXT_MODULES=nri=github.com/containerd/nri"}

// seriesFile is a package of our own in the NRI tree: small, so a step builds in seconds.
const seriesFile = "pkg/knextseries/series.go"

// writeCommit commits files (path -> content; "" removes the file) to tree.
func writeCommit(t *testing.T, tree, msg string, files map[string]string) {
	t.Helper()
	for name, content := range files {
		path := filepath.Join(tree, name)
		if content == "" {
			git(t, tree, "rm", "-q", name)
			continue
		}
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		git(t, tree, "add", name)
	}
	git(t, tree, "commit", "-q", "-m", msg)
}

// brokenSeries exports an NRI series of four patches: the second does not build, the third
// builds but adds a failing test, the fourth repairs both.
func brokenSeries(t *testing.T, r *repoCopy) {
	t.Helper()
	out := filepath.Join(r.root, "build")
	r.mustRun("materialize.sh", out)
	nri := filepath.Join(out, "src", "nri")
	writeCommit(t, nri, "Add a package", map[string]string{
		seriesFile: "package knextseries\n\nfunc One() int { return 1 }\n",
		"pkg/knextseries/series_test.go": "package knextseries\n\nimport \"testing\"\n\n" +
			"func TestOne(t *testing.T) {\n\tif One() != 1 {\n\t\tt.Fatal(\"One() != 1\")\n\t}\n}\n",
	})
	writeCommit(t, nri, "Break the build", map[string]string{
		seriesFile: "package knextseries\n\nfunc One() int { return \"one\" }\n",
	})
	writeCommit(t, nri, "Repair the build and add a failing test", map[string]string{
		seriesFile: "package knextseries\n\nfunc One() int { return 1 }\n",
		"pkg/knextseries/fail_test.go": "package knextseries\n\nimport \"testing\"\n\n" +
			"func TestDeliberatelyFailing(t *testing.T) { t.Fatal(\"deliberately failing\") }\n",
	})
	writeCommit(t, nri, "Drop the failing test", map[string]string{"pkg/knextseries/fail_test.go": ""})
	r.mustRun("export.sh", out, filepath.Join(r.root, "patches"))
}

func TestVerifySeriesNamesTheBrokenPatches(t *testing.T) {
	if testing.Short() {
		t.Skip("materializes both modules and builds NRI")
	}
	r := newRepoCopy(t)
	r.env = nriOnly
	brokenSeries(t, r)
	seriesDir := filepath.Join(r.root, "series")

	out, err := r.runEnv([]string{"KNEXT_SERIES_DIR=" + seriesDir}, "verify-series.sh")
	if err == nil {
		t.Fatalf("verify-series passed a broken series:\n%s", out)
	}
	for _, want := range []string{
		"--- PASS: nri/0001-Add-a-package.patch",
		"--- FAIL: nri/0002-Break-the-build.patch",
		"FAILED: patch 0002-Break-the-build.patch (step 2 of nri): build failed in github.com/containerd/nri/pkg/knextseries",
		"--- FAIL: nri/0003-Repair-the-build-and-add-a-failing-test.patch",
		"FAILED: patch 0003-Repair-the-build-and-add-a-failing-test.patch (step 3 of nri): test failed in github.com/containerd/nri/pkg/knextseries",
		"deliberately failing",
		"--- PASS: nri/0004-Drop-the-failing-test.patch",
		"verify-series: 2 step(s) failed",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}

	// Again, as test2json for make test: the passed steps come from the cache, the failed ones
	// run and fail again; gotestsum sees one test per step.
	out, err = r.runEnv([]string{"KNEXT_SERIES_DIR=" + seriesDir}, "verify-series.sh", "-json")
	if err == nil {
		t.Fatalf("verify-series -json passed a broken series:\n%s", out)
	}
	results := map[string]string{}
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		var ev struct{ Action, Test, Output string }
		if json.Unmarshal(sc.Bytes(), &ev) != nil {
			t.Fatalf("not a test2json line: %s", sc.Text())
		}
		if ev.Test != "" && (ev.Action == "pass" || ev.Action == "fail") {
			results[ev.Test] = ev.Action
		}
		if ev.Action == "output" && strings.Contains(ev.Output, "cached:") && ev.Test != "nri/0001-Add-a-package.patch" &&
			ev.Test != "nri/0004-Drop-the-failing-test.patch" {
			t.Errorf("%s was taken from the cache: %s", ev.Test, ev.Output)
		}
	}
	want := map[string]string{
		"nri/0001-Add-a-package.patch":                           "pass",
		"nri/0002-Break-the-build.patch":                         "fail",
		"nri/0003-Repair-the-build-and-add-a-failing-test.patch": "fail",
		"nri/0004-Drop-the-failing-test.patch":                   "pass",
	}
	if len(results) != len(want) {
		t.Errorf("test2json results %v, want %v", results, want)
	}
	for name, action := range want {
		if results[name] != action {
			t.Errorf("%s: %q, want %q", name, results[name], action)
		}
	}
	if !strings.Contains(out, "cached: passed before") {
		t.Errorf("the second run re-ran the passed steps:\n%s", out)
	}
}

func TestUpstreamBranchesCommitGeneratedCode(t *testing.T) {
	if testing.Short() {
		t.Skip("materializes both modules and regenerates NRI's code")
	}
	r := newRepoCopy(t)
	r.env = nriOnly
	out := filepath.Join(r.root, "build")
	r.mustRun("materialize.sh", out)
	nri := filepath.Join(out, "src", "nri")
	// A message's comment in the proto is copied into the generated code.
	proto := filepath.Join(nri, "pkg/api/api.proto")
	src := string(mustRead(t, proto))
	const anchor = "message PodSandbox {"
	if !strings.Contains(src, anchor) {
		t.Fatalf("%s has no %q", proto, anchor)
	}
	const msg = "api: document PodSandbox\n\nSigned-off-by: knext dev <dev@knext.invalid>"
	writeCommit(t, nri, msg, map[string]string{
		"pkg/api/api.proto": strings.Replace(src, anchor, "// PodSandbox is a pod (knext test).\n"+anchor, 1),
	})
	git(t, nri, "commit", "-q", "--amend", "--no-edit", "--author=knext dev <dev@knext.invalid>")
	r.mustRun("export.sh", out, filepath.Join(r.root, "patches"))
	branches := filepath.Join(r.root, "branches")

	report, err := r.runEnv([]string{"KNEXT_UPSTREAM_BRANCHES_DIR=" + branches}, "upstream-branches.sh")
	if err != nil {
		t.Fatalf("upstream-branches: %v\n%s", err, report)
	}
	repo := filepath.Join(branches, "nri")
	if got := git(t, repo, "log", "-1", "--format=%an <%ae>|%cn <%ce>|%B", "series"); got != "knext dev <dev@knext.invalid>|knext dev <dev@knext.invalid>|"+msg {
		t.Errorf("commit identity and message: %q", got)
	}
	files := git(t, repo, "diff", "--name-only", "upstream-base", "series")
	if !strings.Contains(files, "pkg/api/api.pb.go\n") {
		t.Errorf("the commit does not regenerate pkg/api/api.pb.go: %s", files)
	}
	for f := range strings.FieldsSeq(files) {
		if f != "pkg/api/api.proto" && !strings.HasSuffix(f, ".pb.go") {
			t.Errorf("the commit changes %s, neither the proto nor generated code", f)
		}
	}
	diff := git(t, repo, "diff", "upstream-base", "series", "--", "*.pb.go")
	if !strings.Contains(diff, "+// PodSandbox is a pod (knext test).") {
		t.Errorf("regenerated code lacks the proto's new comment:\n%s", diff)
	}
	if protocHeader := regexp.MustCompile(`(?m)^[-+]//\s*protoc\s`); protocHeader.MatchString(diff) {
		t.Errorf("regenerated code changes the protoc header line:\n%s", diff)
	}
	// The bundle stands alone: it carries the base made from the module source.
	bundle := filepath.Join(branches, "nri.bundle")
	clone := filepath.Join(r.root, "clone")
	if b, err := exec.Command("git", "clone", "-q", "-b", "series", bundle, clone).CombinedOutput(); err != nil {
		t.Fatalf("cloning %s: %v\n%s", bundle, err, b)
	}
	if got, want := git(t, clone, "rev-parse", "HEAD"), git(t, repo, "rev-parse", "series"); got != want {
		t.Errorf("bundle's series is %s, branch's %s", got, want)
	}
}
