// Package doccheck reads the repository's Markdown pages for the tests that hold them to the
// repository and the code: links and cited paths resolve, the examples of `crictl inspectp` have
// the shape of its real output, the table of the patch series lists the patch files as they are.
//
// It reads the part of Markdown these checks need (fenced code blocks, code spans, inline links,
// ATX headings, marked regions), not the whole of CommonMark.
package doccheck

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"unicode"
)

// page is a Markdown page of the repository.
type page struct {
	// Path is the page's path in the repository, slash-separated.
	Path  string
	lines []string
}

// readPage reads the page at path (slash-separated) in the repository at root.
func readPage(root, path string) (*page, error) {
	data, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(path)))
	if err != nil {
		return nil, err
	}
	return &page{Path: path, lines: strings.Split(string(data), "\n")}, nil
}

// block is a run of a page's lines: a fenced code block, or a paragraph of text (lines between
// blank lines and fences).
type block struct {
	line int    // the number of its first line, from 1
	text string // its lines joined by "\n"; for a fenced block, without the fences
	code bool   // a fenced code block
	info string // a fenced block's info string, such as "json"
}

// fence returns the fence that opens a code block on line ("```" or "~~~", as long as it is) and
// its info string, or "" if line opens none. Fences are recognized at any indentation, as in
// list items.
func fence(line string) (marker, info string) {
	trimmed := strings.TrimLeft(line, " \t")
	for _, c := range []string{"`", "~"} {
		n := len(trimmed) - len(strings.TrimLeft(trimmed, c))
		if n >= 3 {
			return trimmed[:n], strings.TrimSpace(trimmed[n:])
		}
	}
	return "", ""
}

// blocks splits the page into fenced code blocks and paragraphs.
func (p *page) blocks() []block {
	var (
		blocks    []block
		paragraph []string
		start     int
	)
	flush := func() {
		if len(paragraph) > 0 {
			blocks = append(blocks, block{line: start, text: strings.Join(paragraph, "\n")})
			paragraph = nil
		}
	}
	for i := 0; i < len(p.lines); i++ {
		marker, info := fence(p.lines[i])
		if marker == "" {
			if strings.TrimSpace(p.lines[i]) == "" {
				flush()
				continue
			}
			if len(paragraph) == 0 {
				start = i + 1
			}
			paragraph = append(paragraph, p.lines[i])
			continue
		}
		flush()
		code := block{line: i + 2, code: true, info: info}
		var content []string
		// A block closes with a fence of its character at least as long as the opening one,
		// or at the end of the page.
		for i++; i < len(p.lines); i++ {
			if closing, rest := fence(p.lines[i]); closing != "" && closing[0] == marker[0] && len(closing) >= len(marker) && rest == "" {
				break
			}
			content = append(content, p.lines[i])
		}
		code.text = strings.Join(content, "\n")
		blocks = append(blocks, code)
	}
	flush()
	return blocks
}

// spanKind tells what a span of inline content is.
type spanKind int

const (
	textSpan spanKind = iota
	codeSpan
	linkSpan
)

// span is a piece of a paragraph's inline content: plain text, the content of a code span, or
// the destination of a link (whose text comes as spans of its own, before it).
type span struct {
	kind spanKind
	text string
	line int
}

// inline splits a paragraph that starts on line into spans.
func inline(text string, line int) []span {
	var spans []span
	lineAt := func(offset int) int { return line + strings.Count(text[:offset], "\n") }
	emitText := func(from, to int) {
		if from < to {
			spans = append(spans, span{kind: textSpan, text: text[from:to], line: lineAt(from)})
		}
	}
	textStart := 0
	for i := 0; i < len(text); {
		switch text[i] {
		case '\\':
			i += 2
		case '`':
			content, end, ok := codeSpanAt(text, i)
			if !ok {
				i = end
				continue
			}
			emitText(textStart, i)
			spans = append(spans, span{kind: codeSpan, text: content, line: lineAt(i)})
			i, textStart = end, end
		case '[':
			label, destination, end, ok := linkAt(text, i)
			if !ok {
				i++
				continue
			}
			emitText(textStart, i)
			spans = append(spans, inline(label, lineAt(i+1))...)
			spans = append(spans, span{kind: linkSpan, text: destination, line: lineAt(i)})
			i, textStart = end, end
		default:
			i++
		}
	}
	emitText(textStart, len(text))
	return spans
}

// codeSpanAt reads the code span whose opening backticks start at text[i]: its content and the
// offset after it. Without a closing run of as many backticks, the run is literal text: ok is
// false and end is the offset after it.
func codeSpanAt(text string, i int) (content string, end int, ok bool) {
	n := len(text[i:]) - len(strings.TrimLeft(text[i:], "`"))
	run := text[i : i+n]
	for from := i + n; from < len(text); {
		j := strings.Index(text[from:], run)
		if j < 0 {
			break
		}
		j += from
		closing := len(text[j:]) - len(strings.TrimLeft(text[j:], "`"))
		if closing != n {
			from = j + closing
			continue
		}
		content = strings.ReplaceAll(text[i+n:j], "\n", " ")
		// One space on each side lets a code span start or end with a backtick.
		if len(content) >= 2 && content[0] == ' ' && content[len(content)-1] == ' ' && strings.TrimSpace(content) != "" {
			content = content[1 : len(content)-1]
		}
		return content, j + n, true
	}
	return "", i + n, false
}

// linkAt reads the inline link [label](destination "title") that starts at text[i]: its label,
// its destination and the offset after it; ok is false if none starts there.
func linkAt(text string, i int) (label, destination string, end int, ok bool) {
	depth := 0
	closeLabel := -1
	for j := i; j < len(text) && closeLabel < 0; j++ {
		switch text[j] {
		case '\\':
			j++
		case '`':
			if _, after, isCode := codeSpanAt(text, j); isCode {
				j = after - 1
			}
		case '[':
			depth++
		case ']':
			if depth--; depth == 0 {
				closeLabel = j
			}
		}
	}
	if closeLabel < 0 || closeLabel+1 >= len(text) || text[closeLabel+1] != '(' {
		return "", "", 0, false
	}
	depth = 0
	for j := closeLabel + 1; j < len(text); j++ {
		switch text[j] {
		case '\\':
			j++
		case '(':
			depth++
		case ')':
			if depth--; depth == 0 {
				target := strings.TrimSpace(text[closeLabel+2 : j])
				if rest, isAngled := strings.CutPrefix(target, "<"); isAngled {
					target, _, _ = strings.Cut(rest, ">")
				} else if k := strings.IndexAny(target, " \t\n"); k >= 0 {
					target = target[:k] // a title follows
				}
				return text[i+1 : closeLabel], target, j + 1, true
			}
		}
	}
	return "", "", 0, false
}

// anchors returns the anchors of the page's headings, as GitHub makes them.
func (p *page) anchors() map[string]bool {
	anchors := map[string]bool{}
	seen := map[string]int{}
	for _, b := range p.blocks() {
		if b.code {
			continue
		}
		for offset, line := range strings.Split(b.text, "\n") {
			level := len(line) - len(strings.TrimLeft(line, "#"))
			if level == 0 || level > 6 || (len(line) > level && line[level] != ' ') {
				continue
			}
			heading := strings.TrimSpace(strings.TrimRight(strings.TrimSpace(line[level:]), "#"))
			var plain strings.Builder
			for _, s := range inline(heading, b.line+offset) {
				if s.kind != linkSpan {
					plain.WriteString(s.text)
				}
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
// <!-- /KIND:ID -->, each marker alone on its line.
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
	for i, line := range p.lines {
		marker, ok := strings.CutPrefix(strings.TrimSpace(line), "<!-- ")
		marker, isMarker := strings.CutSuffix(marker, " -->")
		if !ok || !isMarker {
			continue
		}
		if id, opens := strings.CutPrefix(marker, kind+":"); opens {
			if open != nil {
				return nil, fmt.Errorf("%s:%d: region %s:%s opens inside region %s:%s of line %d", p.Path, i+1, kind, id, kind, open.id, open.start)
			}
			open = &region{id: id, start: i + 1, page: p}
		} else if id, closes := strings.CutPrefix(marker, "/"+kind+":"); closes {
			if open == nil || open.id != id {
				return nil, fmt.Errorf("%s:%d: region %s:%s closes, but it is not open", p.Path, i+1, kind, id)
			}
			open.end = i + 1
			regions = append(regions, *open)
			open = nil
		}
	}
	if open != nil {
		return nil, fmt.Errorf("%s:%d: region %s:%s does not close", p.Path, open.start, kind, open.id)
	}
	return regions, nil
}

// codeBlock returns the content of the region's one fenced code block with the info string
// info, and the number of its first line.
func (r region) codeBlock(info string) (string, int, error) {
	var found []block
	for _, b := range r.page.blocks() {
		if b.code && b.info == info && b.line > r.start && b.line < r.end {
			found = append(found, b)
		}
	}
	if len(found) != 1 {
		return "", 0, fmt.Errorf("%s:%d: region %s holds %d code blocks marked %q, want one", r.page.Path, r.start, r.id, len(found), info)
	}
	return found[0].text, found[0].line, nil
}
