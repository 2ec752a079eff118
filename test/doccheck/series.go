package doccheck

import (
	"bufio"
	"fmt"
	"mime"
	"net/mail"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
)

// patch is a file of the patch series.
type patch struct {
	// Path is the patch file's path in the repository, such as
	// "patches/nri/0001-api-add-the-PodSandboxStatus-RPC-for-plugin-reported.patch".
	Path string
	// Subject is its commit's subject, without format-patch's "[PATCH n/m]".
	Subject string
	// Changes are the files of its module's tree that it creates or changes.
	Changes []string
}

// module is the directory of patches/ that holds the patch: the tree it applies to.
func (p patch) module() string { return path.Base(path.Dir(p.Path)) }

// number is the patch's number in its series, such as "0001".
func (p patch) number() string {
	number, _, _ := strings.Cut(path.Base(p.Path), "-")
	return number
}

// patchPrefix is what format-patch puts before a commit's subject.
var patchPrefix = regexp.MustCompile(`^\[PATCH[^\]]*\]\s*`)

// readSeries reads the patch files patches/*/*.patch of the repository at root.
func readSeries(root string) ([]patch, error) {
	files, err := filepath.Glob(filepath.Join(root, "patches", "*", "*.patch"))
	if err != nil {
		return nil, err
	}
	series := make([]patch, 0, len(files))
	for _, file := range files {
		p, err := readPatch(file)
		if err != nil {
			return nil, err
		}
		rel, err := filepath.Rel(root, file)
		if err != nil {
			return nil, err
		}
		p.Path = filepath.ToSlash(rel)
		series = append(series, p)
	}
	return series, nil
}

// readPatch reads a git format-patch file: an mbox "From " line, the mail headers, the commit
// message and the diff.
func readPatch(file string) (patch, error) {
	f, err := os.Open(file)
	if err != nil {
		return patch{}, err
	}
	defer f.Close()
	in := bufio.NewReader(f)
	if from, err := in.ReadString('\n'); err != nil || !strings.HasPrefix(from, "From ") {
		return patch{}, fmt.Errorf("%s:1: not a git format-patch file (no mbox From line)", file)
	}
	message, err := mail.ReadMessage(in)
	if err != nil {
		return patch{}, fmt.Errorf("%s: %w", file, err)
	}
	subject, err := new(mime.WordDecoder).DecodeHeader(message.Header.Get("Subject"))
	if err != nil || subject == "" {
		return patch{}, fmt.Errorf("%s: no readable Subject header (%v)", file, err)
	}
	p := patch{Subject: patchPrefix.ReplaceAllString(subject, "")}
	body := bufio.NewScanner(message.Body)
	body.Buffer(nil, 1<<20)
	for body.Scan() {
		if changed, ok := strings.CutPrefix(body.Text(), "+++ b/"); ok {
			p.Changes = append(p.Changes, changed)
		}
	}
	return p, body.Err()
}

// The table of the series in patches/README.md, between <!-- patches:series --> and
// <!-- /patches:series -->: one row per patch file, `| [<module>/<file>](<module>/<file>) |
// <subject> | <purpose> |`.
const (
	seriesPage        = "patches/README.md"
	seriesRegionKind  = "patches"
	seriesRegionID    = "series"
	seriesTableHeader = "| patch | subject | purpose |"
)

// SeriesTableProblems returns what the table of the series says wrong about the patch files:
// a patch without its row, a row of no patch (or of one patch twice), a subject that is not
// the patch's, a row without its purpose. It also checks that the tables of each module's
// section of patches/README.md ("## <module>/ ...") have one row per patch of that module,
// which starts with the patch's number.
func (r *Repository) SeriesTableProblems() ([]string, error) {
	readme := r.pageAt(seriesPage)
	if readme == nil {
		return nil, fmt.Errorf("the repository has no %s", seriesPage)
	}
	table, line, err := seriesTable(readme)
	if err != nil {
		return nil, err
	}
	var problems []string
	listed := map[string]int{}
	for i, row := range table {
		where := fmt.Sprintf("%s:%d", seriesPage, line+i)
		cells := tableCells(row)
		if len(cells) != 3 {
			problems = append(problems, fmt.Sprintf("%s: %d cells, want 3 (%s)", where, len(cells), seriesTableHeader))
			continue
		}
		name, ok := patchLink(cells[0])
		if !ok {
			problems = append(problems, fmt.Sprintf("%s: the first cell %q is not a link [<module>/<file>](<module>/<file>) to a patch file", where, cells[0]))
			continue
		}
		if previous, twice := listed[name]; twice {
			problems = append(problems, fmt.Sprintf("%s: %s has a row already, on line %d", where, name, previous))
			continue
		}
		listed[name] = line + i
		k := slices.IndexFunc(r.series, func(p patch) bool { return p.Path == "patches/"+name })
		if k < 0 {
			problems = append(problems, fmt.Sprintf("%s: no patch file patches/%s", where, name))
			continue
		}
		if subject := r.series[k].Subject; cells[1] != subject {
			problems = append(problems, fmt.Sprintf("%s: subject %q, but %s's is %q", where, cells[1], name, subject))
		}
		if cells[2] == "" {
			problems = append(problems, fmt.Sprintf("%s: %s has no purpose", where, name))
		}
	}
	for _, p := range r.series {
		if _, ok := listed[strings.TrimPrefix(p.Path, "patches/")]; !ok {
			problems = append(problems, fmt.Sprintf("%s:%d: the table of the series has no row for %s (%s)", seriesPage, line, p.Path, p.Subject))
		}
	}
	return append(problems, r.moduleSectionProblems(readme)...), nil
}

// seriesTable returns the rows of the table of the series, without its header and delimiter
// row, and the number of the first row's line.
func seriesTable(readme *page) ([]string, int, error) {
	regions, err := readme.regions(seriesRegionKind)
	if err != nil {
		return nil, 0, err
	}
	i := slices.IndexFunc(regions, func(r region) bool { return r.id == seriesRegionID })
	if i < 0 {
		return nil, 0, fmt.Errorf("%s has no region <!-- %s:%s -->", readme.Path, seriesRegionKind, seriesRegionID)
	}
	marked := regions[i]
	lines := readme.lines[marked.start : marked.end-1]
	first := slices.IndexFunc(lines, func(l string) bool { return strings.TrimSpace(l) != "" })
	if first < 0 || strings.TrimSpace(lines[first]) != seriesTableHeader || first+1 >= len(lines) {
		return nil, 0, fmt.Errorf("%s:%d: the region %s:%s does not start with the table %s", readme.Path, marked.start, seriesRegionKind, seriesRegionID, seriesTableHeader)
	}
	// A blank line ends a table.
	var rows []string
	for _, l := range lines[first+2:] {
		if strings.TrimSpace(l) == "" {
			break
		}
		rows = append(rows, l)
	}
	// Line numbers count from 1, and the rows follow the opening marker, the header and the
	// delimiter row.
	return rows, marked.start + first + 3, nil
}

// tableCells returns the trimmed cells of a table row.
func tableCells(row string) []string {
	row = strings.TrimSpace(row)
	row = strings.TrimSuffix(strings.TrimPrefix(row, "|"), "|")
	cells := strings.Split(row, "|")
	for i := range cells {
		cells[i] = strings.TrimSpace(cells[i])
	}
	return cells
}

// patchLink returns the patch file that a cell [<module>/<file>](<module>/<file>) names.
func patchLink(cell string) (string, bool) {
	spans := newPage("", []byte(cell)).spans()
	// The link's destination, then its text.
	if len(spans) != 2 || spans[0].kind != linkSpan || spans[1].kind != textSpan ||
		spans[1].text != spans[0].text || !strings.HasSuffix(spans[0].text, ".patch") {
		return "", false
	}
	return spans[0].text, true
}

// patchRow matches the row of a table that starts with a patch number, such as "| 0001 |".
var patchRow = regexp.MustCompile(`^\| *([0-9]{4}) *\|`)

// moduleSectionProblems checks the tables of each module's section of patches/README.md: the
// rows that start with a patch number name the patches of that module, each once.
func (r *Repository) moduleSectionProblems(readme *page) []string {
	var problems []string
	rows := map[string]int{} // "<module>/<number>" -> the line of its row
	sections := map[string]bool{}
	module := ""
	for i, line := range readme.lines {
		if heading, ok := strings.CutPrefix(line, "## "); ok {
			module = ""
			if name, _, isModule := strings.Cut(heading, "/"); isModule && !strings.Contains(name, " ") {
				module = name
				sections[module] = true
			}
			continue
		}
		m := patchRow.FindStringSubmatch(line)
		if module == "" || m == nil {
			continue
		}
		key := module + "/" + m[1]
		if previous, twice := rows[key]; twice {
			problems = append(problems, fmt.Sprintf("%s:%d: patch %s has a row already, on line %d", readme.Path, i+1, key, previous))
			continue
		}
		rows[key] = i + 1
		if !slices.ContainsFunc(r.series, func(p patch) bool { return p.module() == module && p.number() == m[1] }) {
			problems = append(problems, fmt.Sprintf("%s:%d: a row of patch %s, which patches/%s does not hold", readme.Path, i+1, key, module))
		}
	}
	for _, p := range r.series {
		if key := p.module() + "/" + p.number(); sections[p.module()] && rows[key] == 0 {
			problems = append(problems, fmt.Sprintf("%s: the section of %s/ has no row for patch %s (%s)", readme.Path, p.module(), key, p.Subject))
		}
	}
	return problems
}
