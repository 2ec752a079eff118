// Package doccheck reads the repository's Markdown pages for the tests that hold them to the
// repository and the code: links and cited paths resolve, the examples of `crictl inspectp` have
// the shape of its real output, the table of the patch series lists the patch files as they are.
//
// Pages are parsed with goldmark, as CommonMark.
package doccheck

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"unicode"

	"github.com/yuin/goldmark"
	"github.com/yuin/goldmark/ast"
	"github.com/yuin/goldmark/text"
)

// page is a Markdown page of the repository.
type page struct {
	// Path is the page's path in the repository, slash-separated.
	Path   string
	source []byte
	lines  []string // for the checks that read the page line by line
	doc    ast.Node
}

// readPage reads the page at path (slash-separated) in the repository at root.
func readPage(root, path string) (*page, error) {
	source, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(path)))
	if err != nil {
		return nil, err
	}
	return newPage(path, source), nil
}

// newPage parses the page at path whose content is source.
func newPage(path string, source []byte) *page {
	return &page{
		Path:   path,
		source: source,
		lines:  strings.Split(string(source), "\n"),
		doc:    goldmark.DefaultParser().Parse(text.NewReader(source)),
	}
}

// line returns the number, from 1, of the line that holds the source's byte at offset.
func (p *page) line(offset int) int {
	return bytes.Count(p.source[:offset], []byte("\n")) + 1
}

// nodes returns the nodes of type T under root, in page order, without looking inside them.
func nodes[T ast.Node](root ast.Node) []T {
	var found []T
	_ = ast.Walk(root, func(n ast.Node, entering bool) (ast.WalkStatus, error) {
		if t, ok := n.(T); ok && entering {
			found = append(found, t)
			return ast.WalkSkipChildren, nil
		}
		return ast.WalkContinue, nil
	})
	return found
}

// spanKind tells what a span of a page is.
type spanKind int

const (
	textSpan      spanKind = iota // a run of text, a link's text included
	codeSpan                      // the content of a code span
	linkSpan                      // the destination of a link or an image
	codeBlockSpan                 // the code of a fenced or indented code block
)

// span is a piece of a page's content.
type span struct {
	kind spanKind
	text string
	line int    // the number of its first line, from 1
	lang string // a fenced code block's language, such as "json"
}

// spans returns the page's spans, in page order.
func (p *page) spans() []span {
	var (
		spans   []span
		textEnd int // where the last span ends in the source, if it is text
	)
	_ = ast.Walk(p.doc, func(n ast.Node, entering bool) (ast.WalkStatus, error) {
		if !entering {
			return ast.WalkContinue, nil
		}
		var pieces []text.Segment
		switch n := n.(type) {
		case *ast.Text:
			pieces = []text.Segment{n.Segment}
		case *ast.RawHTML:
			// The placeholder of patches/<module>/*.patch reads as a tag.
			pieces = n.Segments.Sliced(0, n.Segments.Len())
		case *ast.Link:
			spans = append(spans, span{kind: linkSpan, text: string(n.Destination), line: p.line(n.Pos())})
		case *ast.Image:
			spans = append(spans, span{kind: linkSpan, text: string(n.Destination), line: p.line(n.Pos())})
		case *ast.CodeSpan:
			var content strings.Builder
			for _, t := range nodes[*ast.Text](n) {
				content.Write(t.Segment.Value(p.source))
			}
			spans = append(spans, span{kind: codeSpan, text: strings.ReplaceAll(content.String(), "\n", " "), line: p.line(n.Pos())})
			return ast.WalkSkipChildren, nil
		case *ast.FencedCodeBlock:
			// Its code starts on the line after the opening fence.
			spans = append(spans, span{kind: codeBlockSpan, text: p.code(n), line: p.line(n.Pos()) + 1, lang: string(n.Language(p.source))})
		case *ast.CodeBlock:
			spans = append(spans, span{kind: codeBlockSpan, text: p.code(n), line: p.line(n.Pos())})
		}
		for _, piece := range pieces {
			// goldmark splits text where markup might start, as at the "_" of pod_status.go:
			// pieces that follow each other in the source are one run.
			if last := len(spans) - 1; last >= 0 && spans[last].kind == textSpan && piece.Start == textEnd {
				spans[last].text += string(piece.Value(p.source))
			} else {
				spans = append(spans, span{kind: textSpan, text: string(piece.Value(p.source)), line: p.line(piece.Start)})
			}
			textEnd = piece.Stop
		}
		return ast.WalkContinue, nil
	})
	return spans
}

// code returns the lines of a code block, joined by "\n".
func (p *page) code(block ast.Node) string {
	return strings.TrimSuffix(string(block.Lines().Value(p.source)), "\n")
}

// anchors returns the anchors of the page's headings, as GitHub makes them.
func (p *page) anchors() map[string]bool {
	anchors := map[string]bool{}
	seen := map[string]int{}
	for _, heading := range nodes[*ast.Heading](p.doc) {
		var plain strings.Builder
		for _, t := range nodes[*ast.Text](heading) {
			plain.Write(t.Segment.Value(p.source))
		}
		anchor := slug(plain.String())
		// GitHub numbers the anchors of headings with the same text.
		if n := seen[anchor]; n > 0 {
			seen[anchor]++
			anchor = fmt.Sprintf("%s-%d", anchor, n)
		} else {
			seen[anchor] = 1
		}
		anchors[anchor] = true
	}
	return anchors
}

// slug is GitHub's anchor of a heading's text: lower case, spaces as hyphens, without the
// punctuation but hyphens and underscores.
func slug(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(heading) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsNumber(r) || unicode.IsMark(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// region is the content of a marked region of a page: the lines between <!-- KIND:ID --> and
// <!-- /KIND:ID -->, each marker an HTML comment alone on its line.
type region struct {
	id    string
	page  *page
	start int // the number of the opening marker's line
	end   int // the number of the closing marker's line
}

// regions returns the page's regions of kind, in page order. A region that does not close,
// or opens inside another of its kind, is an error.
func (p *page) regions(kind string) ([]region, error) {
	var (
		regions []region
		open    *region
	)
	// A comment alone on its line is an HTML block; one in a line of text is not a marker.
	for _, html := range nodes[*ast.HTMLBlock](p.doc) {
		for i := range html.Lines().Len() {
			segment := html.Lines().At(i)
			number := p.line(segment.Start)
			marker, ok := strings.CutPrefix(strings.TrimSpace(string(segment.Value(p.source))), "<!-- ")
			marker, isMarker := strings.CutSuffix(marker, " -->")
			if !ok || !isMarker {
				continue
			}
			if id, opens := strings.CutPrefix(marker, kind+":"); opens {
				if open != nil {
					return nil, fmt.Errorf("%s:%d: region %s:%s opens inside region %s:%s of line %d", p.Path, number, kind, id, kind, open.id, open.start)
				}
				open = &region{id: id, start: number, page: p}
			} else if id, closes := strings.CutPrefix(marker, "/"+kind+":"); closes {
				if open == nil || open.id != id {
					return nil, fmt.Errorf("%s:%d: region %s:%s closes, but it is not open", p.Path, number, kind, id)
				}
				open.end = number
				regions = append(regions, *open)
				open = nil
			}
		}
	}
	if open != nil {
		return nil, fmt.Errorf("%s:%d: region %s:%s does not close", p.Path, open.start, kind, open.id)
	}
	return regions, nil
}

// codeBlock returns the content of the region's one fenced code block of the language lang,
// and the number of its first line.
func (r region) codeBlock(lang string) (string, int, error) {
	var found []span
	for _, b := range r.page.spans() {
		if b.kind == codeBlockSpan && b.lang == lang && b.line > r.start && b.line < r.end {
			found = append(found, b)
		}
	}
	if len(found) != 1 {
		return "", 0, fmt.Errorf("%s:%d: region %s holds %d code blocks marked %q, want one", r.page.Path, r.start, r.id, len(found), lang)
	}
	return found[0].text, found[0].line, nil
}
