// Package build tests the patch-queue machinery (materialize.sh, export.sh, verify.sh, src.sh)
// on a throwaway copy of this repository, so the real patches/ and build/ are never touched.
package build

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// repoCopy holds what the scripts read: go.mod/go.sum (the pins), script/build and an empty
// patches/ series.
type repoCopy struct {
	t    *testing.T
	root string
	env  []string // extra environment of every script run
}

func newRepoCopy(t *testing.T) *repoCopy {
	t.Helper()
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "script"), 0o755); err != nil {
		t.Fatal(err)
	}
	for src, dst := range map[string]string{"../../go.mod": "go.mod", "../../go.sum": "go.sum", ".": "script/build"} {
		if err := exec.Command("cp", "-r", src, filepath.Join(root, dst)).Run(); err != nil {
			t.Fatalf("copy %s: %v", src, err)
		}
	}
	for _, name := range []string{"containerd", "nri"} {
		if err := os.MkdirAll(filepath.Join(root, "patches", name), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return &repoCopy{t: t, root: root}
}

// run runs a script of the copy with no git identity in reach, as on a fresh machine.
func (r *repoCopy) run(script string, args ...string) (string, error) {
	return r.runEnv(nil, script, args...)
}

// runEnv is run with extra environment variables.
func (r *repoCopy) runEnv(env []string, script string, args ...string) (string, error) {
	cmd := exec.Command("bash", append([]string{filepath.Join(r.root, "script", "build", script)}, args...)...)
	cmd.Dir = r.root // as from make: relative paths are relative to the repository
	home := r.t.TempDir()
	cmd.Env = append(os.Environ(), "HOME="+home, "XDG_CONFIG_HOME="+home, "GOWORK=off")
	// Go's caches stay the real ones: a new HOME would otherwise mean a cold build and module cache.
	for _, v := range []string{"GOCACHE", "GOMODCACHE"} {
		out, err := exec.Command("go", "env", v).Output()
		if err != nil {
			r.t.Fatalf("go env %s: %v", v, err)
		}
		cmd.Env = append(cmd.Env, v+"="+strings.TrimSpace(string(out)))
	}
	// Generated-code tools are cached across materializations of the real repo too.
	if tools, err := filepath.Abs("../../build/tools"); err == nil {
		cmd.Env = append(cmd.Env, "KNEXT_TOOLS_DIR="+tools)
	}
	cmd.Env = append(append(cmd.Env, r.env...), env...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func (r *repoCopy) mustRun(script string, args ...string) string {
	r.t.Helper()
	out, err := r.run(script, args...)
	if err != nil {
		r.t.Fatalf("%s %v: %v\n%s", script, args, err, out)
	}
	return out
}

func git(t *testing.T, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command("git", append([]string{"-C", dir, "-c", "user.name=test", "-c", "user.email=test@knext.invalid"}, args...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("git %v: %v\n%s", args, err, out)
	}
	return strings.TrimSpace(string(out))
}

// commitFile adds a commit writing content to name in tree.
func commitFile(t *testing.T, tree, name, content, msg string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(tree, name), []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	git(t, tree, "add", name)
	git(t, tree, "commit", "-q", "-m", msg)
}

func patchNames(t *testing.T, dir string) []string {
	t.Helper()
	matches, err := filepath.Glob(filepath.Join(dir, "*.patch"))
	if err != nil {
		t.Fatal(err)
	}
	for i, m := range matches {
		matches[i] = filepath.Base(m)
	}
	return matches
}

func TestEmptySeriesMaterializesPristineTrees(t *testing.T) {
	r := newRepoCopy(t)
	out := filepath.Join(r.root, "build")
	r.mustRun("materialize.sh", out)

	for _, name := range []string{"containerd", "nri"} {
		tree := filepath.Join(out, "src", name)
		if n := git(t, tree, "rev-list", "--count", "HEAD"); n != "1" {
			t.Errorf("%s: %s commits, want only the pristine one", name, n)
		}
		if tag := git(t, tree, "describe", "--tags", "--exact-match", "HEAD"); !strings.HasPrefix(tag, "upstream-v") {
			t.Errorf("%s: HEAD tagged %q, want upstream-<version>", name, tag)
		}
		if date := git(t, tree, "log", "-1", "--format=%aI %cI"); date != "2000-01-01T00:00:00Z 2000-01-01T00:00:00Z" &&
			date != "2000-01-01T00:00:00+00:00 2000-01-01T00:00:00+00:00" {
			t.Errorf("%s: pristine commit dated %q, want 2000-01-01", name, date)
		}
	}
	work, err := os.ReadFile(filepath.Join(out, "go.work"))
	if err != nil {
		t.Fatal(err)
	}
	for _, use := range []string{r.root, "./src/containerd", "./src/nri"} {
		if !strings.Contains(string(work), "\t"+use+"\n") {
			t.Errorf("go.work does not use %s:\n%s", use, work)
		}
	}
	r.mustRun("verify.sh")

	// The pristine commit is deterministic: a second materialization has the same hash.
	again := filepath.Join(r.root, "again")
	r.mustRun("materialize.sh", again)
	for _, name := range []string{"containerd", "nri"} {
		a := git(t, filepath.Join(out, "src", name), "rev-parse", "HEAD")
		b := git(t, filepath.Join(again, "src", name), "rev-parse", "HEAD")
		if a != b {
			t.Errorf("%s: pristine commit %s then %s", name, a, b)
		}
	}
}

func TestSeriesRoundTrip(t *testing.T) {
	r := newRepoCopy(t)
	out := filepath.Join(r.root, "build")
	r.mustRun("materialize.sh", out)
	nri := filepath.Join(out, "src", "nri")
	commitFile(t, nri, "KNEXT_ONE", "one\n", "Add a first throwaway file")
	commitFile(t, nri, "KNEXT_TWO", "two\n", "Add a second throwaway file")
	r.mustRun("export.sh", "build", "patches") // relative, as the Makefile passes them

	got := patchNames(t, filepath.Join(r.root, "patches", "nri"))
	want := []string{"0001-Add-a-first-throwaway-file.patch", "0002-Add-a-second-throwaway-file.patch"}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("exported %v, want %v", got, want)
	}
	patch, err := os.ReadFile(filepath.Join(r.root, "patches", "nri", want[0]))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(string(patch), "From 0000000000000000000000000000000000000000 ") ||
		strings.Contains(string(patch), "\n-- \n") {
		t.Errorf("export is not stable (want zeroed hash, no signature):\n%s", patch)
	}
	if got := patchNames(t, filepath.Join(r.root, "patches", "containerd")); len(got) != 0 {
		t.Errorf("containerd series = %v, want empty", got)
	}

	// src.sh re-materializes: the exported series applies again, on top of the pristine tag.
	r.mustRun("src.sh", out)
	if n := git(t, nri, "rev-list", "--count", "HEAD"); n != "3" {
		t.Errorf("nri has %s commits after src.sh, want pristine + 2 patches", n)
	}
	if content, err := os.ReadFile(filepath.Join(nri, "KNEXT_TWO")); err != nil || string(content) != "two\n" {
		t.Errorf("second patch not applied: %q, %v", content, err)
	}
	r.mustRun("verify.sh")

	// A series edited by hand no longer round-trips: verify says so.
	edited := filepath.Join(r.root, "patches", "nri", want[1])
	if err := os.WriteFile(edited, []byte(strings.Replace(string(mustRead(t, edited)), "Subject: [PATCH 2/2]", "Subject: [PATCH 2/2] edited:", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := r.run("verify.sh"); err == nil || !strings.Contains(out, "does not round-trip") {
		t.Errorf("verify accepted a series that does not round-trip: %v\n%s", err, out)
	}
}

func TestSrcRefusesToDropUnexportedWork(t *testing.T) {
	r := newRepoCopy(t)
	out := filepath.Join(r.root, "build")
	r.mustRun("materialize.sh", out)
	nri := filepath.Join(out, "src", "nri")

	commitFile(t, nri, "KNEXT_UNEXPORTED", "x\n", "Not exported yet")
	if msg, err := r.run("src.sh", out); err == nil || !strings.Contains(msg, "run make patches first") {
		t.Fatalf("src.sh dropped an unexported commit: %v\n%s", err, msg)
	}
	git(t, nri, "reset", "-q", "--hard", "HEAD~1")

	if err := os.WriteFile(filepath.Join(nri, "README.md"), []byte("edited\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if msg, err := r.run("src.sh", out); err == nil || !strings.Contains(msg, "uncommitted changes") {
		t.Fatalf("src.sh dropped an uncommitted edit: %v\n%s", err, msg)
	}
}

func TestBrokenPatchNamesItself(t *testing.T) {
	r := newRepoCopy(t)
	broken := "From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001\n" +
		"From: test <test@knext.invalid>\nDate: Sat, 1 Jan 2000 00:00:00 +0000\nSubject: [PATCH] Edit a file that does not exist\n\n---\n" +
		"diff --git a/no-such-file b/no-such-file\n--- a/no-such-file\n+++ b/no-such-file\n@@ -1 +1 @@\n-a\n+b\n"
	if err := os.WriteFile(filepath.Join(r.root, "patches", "containerd", "0001-broken.patch"), []byte(broken), 0o644); err != nil {
		t.Fatal(err)
	}
	msg, err := r.run("materialize.sh", filepath.Join(r.root, "build"))
	if err == nil {
		t.Fatalf("materialize.sh applied a broken patch:\n%s", msg)
	}
	if !strings.Contains(msg, "patch 0001-broken.patch does not apply") || !strings.Contains(msg, "no-such-file") {
		t.Fatalf("error does not name the patch and git's reason:\n%s", msg)
	}
}

func mustRead(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestSrcFollowsANewSeriesWhenTheTreeHasNoLocalCommits(t *testing.T) {
	r := newRepoCopy(t)
	out := filepath.Join(r.root, "build")
	r.mustRun("materialize.sh", out)

	// Someone else's series arrives in patches/ (a pull), made in another tree.
	other := filepath.Join(r.root, "other")
	r.mustRun("materialize.sh", other)
	commitFile(t, filepath.Join(other, "src", "nri"), "KNEXT_PULLED", "pulled\n", "Arrive with a pull")
	r.mustRun("export.sh", other, filepath.Join(r.root, "patches"))

	r.mustRun("src.sh", out)
	if content, err := os.ReadFile(filepath.Join(out, "src", "nri", "KNEXT_PULLED")); err != nil || string(content) != "pulled\n" {
		t.Fatalf("src.sh did not apply the new series: %q, %v", content, err)
	}
}
