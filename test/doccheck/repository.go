package doccheck

import (
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
)

// Repository is a checkout of knext, read for the checks of its Markdown pages.
type Repository struct {
	root string
	// pages are the repository's Markdown pages, in lexical order of their paths.
	pages []*page
	// series is the patch series, in lexical order of the patch files' paths.
	series []patch
	// topDirs are the repository's top-level directories that a page may cite.
	topDirs []string
}

// ignoredTopDirs hold no page of ours and are never cited as paths of the repository: git's own,
// and the build output (`build/`, which the pages name as what `make` writes there).
var ignoredTopDirs = []string{".git", "build"}

// generatedPaths are files that a make target writes into the tree and a page documents, but that
// the tree need not hold: `make bench-doc` copies the bench's report next to docs/performance.md
// and draws its plots there, and until a report is committed there are none.
var generatedPaths = []string{"docs/performance/report.json", "docs/performance/*.svg"}

// upstreamDirs are directories of the upstream trees (containerd's, Kubernetes') that the pages
// cite as upstream's and whose top-level folder is also one of ours (script/, test/): a cited
// path in one of them is upstream's, not a path of this repository, even though no patch
// changes it. None of them may exist in this repository (TestUpstreamDirsAreNotOurs), or a
// citation of our own file there would go unchecked.
var upstreamDirs = []string{
	"script/setup", // containerd's machine setup: install-cni, runc-version...
	"script/test",  // containerd's CI helpers: utils.sh
	"test/e2e",     // Kubernetes' e2e suite, which third_party/kubernetes/e2e compiles
}

// ignoredDirs, at any depth, hold no page of ours: other projects' files and test data.
var ignoredDirs = []string{".git", "vendor", "node_modules", "testdata"}

// OpenRepository reads the pages and the patch series of the repository at root.
func OpenRepository(root string) (*Repository, error) {
	r := &Repository{root: root}
	entries, err := os.ReadDir(root)
	if err != nil {
		return nil, err
	}
	for _, e := range entries {
		if e.IsDir() && !slices.Contains(ignoredTopDirs, e.Name()) {
			r.topDirs = append(r.topDirs, e.Name())
		}
	}
	err = filepath.WalkDir(root, func(file string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, file)
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			if slices.Contains(ignoredDirs, d.Name()) || (!strings.Contains(rel, "/") && slices.Contains(ignoredTopDirs, rel)) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(rel, ".md") {
			return nil
		}
		doc, err := readPage(root, rel)
		if err != nil {
			return err
		}
		r.pages = append(r.pages, doc)
		return nil
	})
	if err != nil {
		return nil, err
	}
	if r.series, err = readSeries(root); err != nil {
		return nil, err
	}
	return r, nil
}

// pageAt returns the repository's page at path (slash-separated), nil if there is none.
func (r *Repository) pageAt(path string) *page {
	i := slices.IndexFunc(r.pages, func(p *page) bool { return p.Path == path })
	if i < 0 {
		return nil
	}
	return r.pages[i]
}

// BrokenLinks returns, one line each with the page and the line, the relative links of the
// pages whose target does not exist, or whose anchor names no heading of the target page.
func (r *Repository) BrokenLinks() []string {
	var problems []string
	for _, p := range r.pages {
		for _, s := range p.spans() {
			if s.kind != linkSpan {
				continue
			}
			if why := r.checkLink(p, s.text); why != "" {
				problems = append(problems, fmt.Sprintf("%s:%d: link %s: %s", p.Path, s.line, s.text, why))
			}
		}
	}
	return problems
}

// external matches the destinations of links that leave the repository: a URL scheme.
var external = regexp.MustCompile(`^[a-zA-Z][a-zA-Z0-9+.-]*:`)

// checkLink tells what is wrong with the link to destination on page p, "" if nothing.
func (r *Repository) checkLink(p *page, destination string) string {
	if external.MatchString(destination) {
		return ""
	}
	target, anchor, _ := strings.Cut(destination, "#")
	target, err := url.PathUnescape(target)
	if err != nil {
		return err.Error()
	}
	if target == "" {
		target = p.Path
	} else {
		target = path.Join(path.Dir(p.Path), target)
	}
	if target == ".." || strings.HasPrefix(target, "../") || path.IsAbs(target) {
		return "its target is outside the repository"
	}
	if _, err := os.Stat(filepath.Join(r.root, filepath.FromSlash(target))); err != nil {
		return fmt.Sprintf("%s does not exist", target)
	}
	if anchor == "" {
		return ""
	}
	targetPage := r.pageAt(target)
	if targetPage == nil {
		return fmt.Sprintf("%s is not a page of the repository, it has no anchor %q", target, anchor)
	}
	if !targetPage.anchors()[anchor] {
		return fmt.Sprintf("%s has no heading whose anchor is %q", target, anchor)
	}
	return ""
}

// citationPattern matches, after a character that cannot be part of a path, a path that starts
// with one of the top-level directories: an optional "./" (as in Go package patterns), then
// path characters, glob characters, placeholders such as <module> and brace lists such as
// {plugin,store}.
func (r *Repository) citationPattern() *regexp.Regexp {
	quoted := make([]string, 0, len(r.topDirs))
	for _, d := range r.topDirs {
		quoted = append(quoted, regexp.QuoteMeta(d))
	}
	return regexp.MustCompile(`(?:^|[^\w./-])((?:\./)?(?:` + strings.Join(quoted, "|") + `)/(?:\{[^{}\s]*\}|[\w.*?<>\[\]/-])*)`)
}

// BrokenCitations returns, one line each with the page and the line, the paths the pages cite
// (in text, code spans and code blocks alike; not link destinations, which BrokenLinks checks)
// that start with a top-level directory of the repository and exist neither in the repository
// nor among the files the patch series creates or changes in the upstream trees, and are neither
// generated (generatedPaths) nor in a directory only upstream has (upstreamDirs).
func (r *Repository) BrokenCitations() []string {
	pattern := r.citationPattern()
	var problems []string
	check := func(p *page, text string, line int) {
		for _, m := range pattern.FindAllStringSubmatchIndex(text, -1) {
			cited := text[m[2]:m[3]]
			if why := r.checkCitation(cited); why != "" {
				problems = append(problems, fmt.Sprintf("%s:%d: %s: %s", p.Path, line+strings.Count(text[:m[2]], "\n"), cited, why))
			}
		}
	}
	for _, p := range r.pages {
		for _, s := range p.spans() {
			if s.kind != linkSpan {
				check(p, s.text, s.line)
			}
		}
	}
	return problems
}

// placeholder matches a placeholder of a cited path, such as <module>: any one path element.
var placeholder = regexp.MustCompile(`<[^<>/]*>`)

// checkCitation tells what is wrong with a cited path, "" if nothing.
func (r *Repository) checkCitation(cited string) string {
	cited = strings.TrimPrefix(cited, "./")
	cited, _, _ = strings.Cut(cited, "#")
	// "dir/..." is a Go package pattern, or the elision of the rest of a path: the directory.
	cited = strings.TrimSuffix(cited, "/...")
	// Punctuation that ends a sentence, and a trailing slash.
	cited = strings.TrimRight(cited, ".,:;/")
	var missing []string
	for _, alternative := range expandBraces(cited) {
		glob := placeholder.ReplaceAllString(alternative, "*")
		if _, err := path.Match(glob, ""); err != nil {
			return fmt.Sprintf("not a valid path pattern: %v", err)
		}
		if !r.inRepository(glob) && !r.inSeries(glob) && !generated(glob) && !inUpstreamDir(glob) {
			missing = append(missing, alternative)
		}
	}
	switch {
	case len(missing) == 0:
		return ""
	case len(missing) == 1 && missing[0] == cited:
		return "no such file or directory in the repository, nor in the patch series"
	default:
		return fmt.Sprintf("%s: no such file or directory in the repository, nor in the patch series", strings.Join(missing, ", "))
	}
}

// inRepository tells whether the glob pattern matches a file or directory of the repository.
func (r *Repository) inRepository(glob string) bool {
	matches, _ := filepath.Glob(filepath.Join(r.root, filepath.FromSlash(glob)))
	return len(matches) > 0
}

// generated tells whether the glob pattern is, or matches, one of the generated paths.
func generated(glob string) bool {
	for _, g := range generatedPaths {
		if matched, _ := path.Match(g, glob); matched || g == glob {
			return true
		}
	}
	return false
}

// inUpstreamDir tells whether the glob pattern is one of the upstream directories or lies in one.
func inUpstreamDir(glob string) bool {
	for _, d := range upstreamDirs {
		if glob == d || strings.HasPrefix(glob, d+"/") {
			return true
		}
	}
	return false
}

// inSeries tells whether the glob pattern matches a file that a patch creates or changes, or a
// directory that holds one.
func (r *Repository) inSeries(glob string) bool {
	for _, p := range r.series {
		for _, file := range p.Changes {
			for dir := file; dir != "."; dir = path.Dir(dir) {
				if matched, _ := path.Match(glob, dir); matched {
					return true
				}
			}
		}
	}
	return false
}

// expandBraces expands the brace lists of a cited path as the shell does:
// "a/{b,c}.go" is "a/b.go" and "a/c.go".
func expandBraces(cited string) []string {
	open := strings.Index(cited, "{")
	if open < 0 {
		return []string{cited}
	}
	length := strings.Index(cited[open:], "}")
	if length < 0 {
		return []string{cited}
	}
	var expanded []string
	for choice := range strings.SplitSeq(cited[open+1:open+length], ",") {
		for _, rest := range expandBraces(cited[open+length+1:]) {
			expanded = append(expanded, cited[:open]+choice+rest)
		}
	}
	return expanded
}
