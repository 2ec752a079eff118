package doccheck

import (
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// writeRepository writes files (path -> content) under a new directory, its root.
func writeRepository(t *testing.T, files map[string]string) string {
	t.Helper()
	root := t.TempDir()
	for name, content := range files {
		file := filepath.Join(root, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(file, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

// formatPatch is a git format-patch file of subject (as format-patch folds it) that changes
// the files changed.
func formatPatch(subject string, changed ...string) string {
	patch := "From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001\n" +
		"From: knext dev <dev@knext.invalid>\nSubject: " + subject + "\n\nWhy.\n---\n"
	for _, file := range changed {
		patch += "diff --git a/" + file + " b/" + file + "\n--- a/" + file + "\n+++ b/" + file + "\n@@ -1 +1 @@\n-old\n+new\n"
	}
	return patch
}

// repositoryOf opens a repository of files.
func repositoryOf(t *testing.T, files map[string]string) *Repository {
	t.Helper()
	r, err := OpenRepository(writeRepository(t, files))
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func wantProblems(t *testing.T, what string, got, want []string) {
	t.Helper()
	if !slices.Equal(got, want) {
		t.Errorf("%s:\n  %s\nwant:\n  %s", what, strings.Join(got, "\n  "), strings.Join(want, "\n  "))
	}
}

// A small repository with one mistake of each kind, and what is right next to it.
var checkedRepository = map[string]string{
	"README.md": "# Top\n\n" +
		"See [the guide](docs/guide.md), [its second part](docs/guide.md#the-second-part), [gone](docs/gone.md),\n" +
		"[no heading](docs/guide.md#nowhere), [web](https://example.com/x), [here](#top).\n" +
		"Cited: `cmd/tool/main.go`, `cmd/missing.go`, `internal/{a,b}/x.go`, `patches/<module>/*.patch`,\n" +
		"`./cmd/...`, `build/bin/containerd`, `internal/cri/server/status.go` and cmd/tool/main.go.\n" +
		"Generated: `docs/performance/report.json`, `docs/performance/*.svg`, docs/performance/status.svg,\n" +
		"upstream's `script/setup/install-cni`, not `script/setup-cni`.\n" +
		"\n```sh\ncmd/tool/run.sh\n[not a link](docs/nowhere.md)\n```\n",
	"docs/guide.md": "# Guide\n\n## The second part\n\n## The second part\n\n" +
		"Back to [the top](../README.md#top); [twice](guide.md#the-second-part-1), [out](../../x.md).\n",
	"cmd/tool/main.go":       "package main\n",
	"internal/a/x.go":        "package a\n",
	"patches/nri/0001.patch": formatPatch("[PATCH] cri: status", "internal/cri/server/status.go"),
	// Never read: the build output, and test data.
	"build/notes.md":         "[gone](gone.md) `cmd/gone`\n",
	"cmd/tool/testdata/x.md": "[gone](gone.md) `cmd/gone`\n",
	"script/build/kept.md":   "[kept](kept.md)\n",
	"script/build/broken.md": "`script/build/none.sh`\n",
}

func TestBrokenLinksAreFound(t *testing.T) {
	wantProblems(t, "broken links", repositoryOf(t, checkedRepository).BrokenLinks(), []string{
		"README.md:3: link docs/gone.md: docs/gone.md does not exist",
		`README.md:4: link docs/guide.md#nowhere: docs/guide.md has no heading whose anchor is "nowhere"`,
		"docs/guide.md:7: link ../../x.md: its target is outside the repository",
	})
}

func TestBrokenCitationsAreFound(t *testing.T) {
	wantProblems(t, "broken citations", repositoryOf(t, checkedRepository).BrokenCitations(), []string{
		"README.md:5: cmd/missing.go: no such file or directory in the repository, nor in the patch series",
		"README.md:5: internal/{a,b}/x.go: internal/b/x.go: no such file or directory in the repository, nor in the patch series",
		"README.md:8: script/setup-cni: no such file or directory in the repository, nor in the patch series",
		"README.md:11: cmd/tool/run.sh: no such file or directory in the repository, nor in the patch series",
		// Code blocks hold no links, but their paths are checked.
		"README.md:12: docs/nowhere.md: no such file or directory in the repository, nor in the patch series",
		"script/build/broken.md:1: script/build/none.sh: no such file or directory in the repository, nor in the patch series",
	})
}

func TestSeriesTableProblemsAreFound(t *testing.T) {
	r := repositoryOf(t, map[string]string{
		"patches/nri/0001-x.patch": formatPatch("[PATCH 1/2] api: x", "pkg/api/api.proto"),
		"patches/nri/0002-y.patch": formatPatch("[PATCH 2/2] adaptation: a subject that\n format-patch folds", "pkg/adaptation/adaptation.go"),
		"patches/README.md": "# Series\n\n<!-- patches:series -->\n| patch | subject | purpose |\n|---|---|---|\n" +
			"| [nri/0001-x.patch](nri/0001-x.patch) | api: a wrong subject | |\n" +
			"| [nri/0003-gone.patch](nri/0003-gone.patch) | gone | stale |\n" +
			"| [nri/0001-x.patch](nri/0001-x.patch) | api: x | twice |\n" +
			"| `nri/0002-y.patch` | adaptation: a subject that format-patch folds | not a link |\n" +
			"<!-- /patches:series -->\n\n" +
			"## nri/ (its section)\n\n| # | what |\n|---|---|\n| 0001 | x |\n| 0007 | stale |\n",
	})
	problems, err := r.SeriesTableProblems()
	if err != nil {
		t.Fatal(err)
	}
	wantProblems(t, "problems of the table of the series", problems, []string{
		`patches/README.md:6: subject "api: a wrong subject", but nri/0001-x.patch's is "api: x"`,
		"patches/README.md:6: nri/0001-x.patch has no purpose",
		"patches/README.md:7: no patch file patches/nri/0003-gone.patch",
		"patches/README.md:8: nri/0001-x.patch has a row already, on line 6",
		"patches/README.md:9: the first cell \"`nri/0002-y.patch`\" is not a link [<module>/<file>](<module>/<file>) to a patch file",
		"patches/README.md:6: the table of the series has no row for patches/nri/0002-y.patch (adaptation: a subject that format-patch folds)",
		"patches/README.md:17: a row of patch nri/0007, which patches/nri does not hold",
		"patches/README.md: the section of nri/ has no row for patch nri/0002 (adaptation: a subject that format-patch folds)",
	})
}

func TestSpans(t *testing.T) {
	got := newPage("p.md", []byte("a `make\nconformance` b ``x ` y`` [l `c`](d.md \"title\") `open\n"+
		"\\[not](a.md) cmd/pod_status.go patches/<module>/*.patch ![i](i.svg)\n\n```json\n{}\n```\n\n    indented\n")).spans()
	want := []span{
		{textSpan, "a ", 1, ""},
		{codeSpan, "make conformance", 1, ""},
		{textSpan, " b ", 2, ""},
		{codeSpan, "x ` y", 2, ""},
		{textSpan, " ", 2, ""},
		{linkSpan, "d.md", 2, ""},
		{textSpan, "l ", 2, ""},
		{codeSpan, "c", 2, ""},
		{textSpan, " `open", 2, ""},
		{textSpan, "\\[not](a.md) cmd/pod_status.go patches/<module>/*.patch ", 3, ""},
		{linkSpan, "i.svg", 3, ""},
		{textSpan, "i", 3, ""},
		{codeBlockSpan, "{}", 6, "json"},
		{codeBlockSpan, "indented", 9, ""},
	}
	if !slices.Equal(got, want) {
		t.Errorf("spans:\n%+v\nwant\n%+v", got, want)
	}
}

// regionsPage is a page with the regions a and b of kind k, a code block in a, one after it.
var regionsPage = "<!-- k:a -->\n```json\n{}\n```\n<!-- /k:a -->\n```json\n[]\n```\n<!-- k:b -->\n<!-- /k:b -->\n"

func TestRegions(t *testing.T) {
	doc := newPage("p.md", []byte(regionsPage))
	if regions, err := doc.regions("k"); err != nil || len(regions) != 2 || regions[0].id != "a" || regions[1].id != "b" {
		t.Errorf("regions %+v, %v; want a and b", regions, err)
	}
	// Markers shown in code are not markers.
	if regions, err := newPage("p.md", []byte("`<!-- k:a -->`\n\n```\n<!-- k:b -->\n```\n")).regions("k"); err != nil || len(regions) != 0 {
		t.Errorf("regions of markers in code %+v, %v; want none", regions, err)
	}
	for _, broken := range []string{"<!-- k:a -->\n", "<!-- /k:a -->\n", "<!-- k:a -->\n<!-- k:b -->\n<!-- /k:b -->\n<!-- /k:a -->\n"} {
		doc := newPage("p.md", []byte(broken))
		if _, err := doc.regions("k"); err == nil {
			t.Errorf("regions of %q: no error", broken)
		}
	}
}

func TestSlug(t *testing.T) {
	for heading, want := range map[string]string{
		"containerd's own CRI integration tests, side by side": "containerds-own-cri-integration-tests-side-by-side",
		"In a cluster: nri-bridge as the cluster network":      "in-a-cluster-nri-bridge-as-the-cluster-network",
		"Mode 1: pre-installed (containerd starts the plugin)": "mode-1-pre-installed-containerd-starts-the-plugin",
		"disable_cni": "disable_cni",
	} {
		if got := slug(heading); got != want {
			t.Errorf("slug(%q) = %q, want %q", heading, got, want)
		}
	}
}

func TestAnchors(t *testing.T) {
	got := newPage("p.md", []byte("# `disable_cni` and *more*\n\nSetext [heading](x.md)\n---\n\n## Setext heading\n")).anchors()
	if want := map[string]bool{"disable_cni-and-more": true, "setext-heading": true, "setext-heading-1": true}; !maps.Equal(got, want) {
		t.Errorf("anchors %v, want %v", got, want)
	}
}
