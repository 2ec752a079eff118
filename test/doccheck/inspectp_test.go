package doccheck

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

func TestRegionCodeBlock(t *testing.T) {
	doc := newPage("p.md", []byte(regionsPage))
	regions, err := doc.regions("k")
	if err != nil {
		t.Fatal(err)
	}
	if text, line, err := regions[0].codeBlock("json"); text != "{}" || line != 3 || err != nil {
		t.Errorf("the code block of region a: %q at line %d, %v; want {} at line 3", text, line, err)
	}
	if _, _, err := regions[1].codeBlock("json"); err == nil {
		t.Error("region b holds no code block, and no error says so")
	}
}

func TestInspectpExamplesOfAPage(t *testing.T) {
	r := repositoryOf(t, map[string]string{"docs/p.md": "# P\n\n<!-- inspectp:a -->\n```json\n\"podNetwork\": {\"ips\": []}\n```\n<!-- /inspectp:a -->\n\n" +
		"```json\n\"podNetwork\": {}\n```\n\n```json\n{\"other\": 1}\n```\n"})
	if unmarked, err := r.UnmarkedInspectpExamples(); err != nil || !slices.Equal(unmarked, []string{"docs/p.md:10"}) {
		t.Errorf("unmarked examples %v, %v; want docs/p.md:10", unmarked, err)
	}
	examples, err := r.InspectpExamples()
	if err != nil || len(examples) != 1 || examples[0].Where != "docs/p.md:5" || !slices.Contains(FieldPaths(examples[0].Value), "podNetwork.ips") {
		t.Errorf("examples %+v, %v; want the one of docs/p.md:5", examples, err)
	}
}

func TestDecodeExample(t *testing.T) {
	value, err := decodeExample("\"podNetwork\": {\n  \"ips\": [\n    { \"ip\": \"10.0.0.1\", \"nri\": \"live\", \"source\": \"nri:10-a\" },\n" +
		"    { \"ip\": \"10.0.0.2\", \"source\": \"cni\" },\n    ...\n  ],\n  ...\n}")
	if err != nil {
		t.Fatal(err)
	}
	network := InspectpExample{Value: value}.PodNetwork()
	if got, want := FieldPaths(value), []string{"podNetwork", "podNetwork.ips", "podNetwork.ips[].ip", "podNetwork.ips[].nri", "podNetwork.ips[].source"}; !slices.Equal(got, want) {
		t.Errorf("field paths %v, want %v", got, want)
	}
	if got, want := Provenance(network), []string{"nri live", "source cni", "source nri:"}; !slices.Equal(got, want) {
		t.Errorf("provenance %v, want %v", got, want)
	}
	if _, err := decodeExample("{ \"a\": 1 \"b\": 2 }"); err == nil {
		t.Error("an example that is no JSON decoded")
	}
}

// The integration test TestInspectpAsDocumented compares the marked examples with the real
// output: an example of the podNetwork entry must be marked, and show only values the code has.
func TestInspectpExamplesAreMarked(t *testing.T) {
	r := openRepository(t)
	unmarked, err := r.UnmarkedInspectpExamples()
	if err != nil {
		t.Fatal(err)
	}
	for _, where := range unmarked {
		t.Errorf("%s: an example of %q outside a region <!-- %s:ID -->: the integration test TestInspectpAsDocumented would not compare it with crictl inspectp's output", where, PodNetworkKey, InspectpRegionKind)
	}
	examples, err := r.InspectpExamples()
	if err != nil {
		t.Fatal(err)
	}
	if len(examples) == 0 {
		t.Fatalf("no page has a region <!-- %s:ID -->", InspectpRegionKind)
	}
	code := provenanceInCode(t)
	for _, e := range examples {
		if _, ok := e.PodNetwork().(map[string]any); !ok {
			t.Errorf("%s: the example shows no %q object", e.Where, PodNetworkKey)
		}
		for _, shown := range Provenance(e.PodNetwork()) {
			kind, value, _ := strings.Cut(shown, " ")
			if !slices.Contains(code[kind], value) {
				t.Errorf("%s: the example shows %s %q, which containerd's code never reports (it reports %v)", e.Where, kind, value, code[kind])
			}
		}
	}
}

// pagesOfProvenance document every provenance value of verbose status.
var pagesOfProvenance = []string{"docs/inspectp.md", "docs/configuration.md"}

func TestEveryProvenanceValueIsDocumented(t *testing.T) {
	r := openRepository(t)
	for _, name := range pagesOfProvenance {
		doc := r.pageAt(name)
		if doc == nil {
			t.Fatalf("the repository has no %s", name)
		}
		spans := doc.codeSpans()
		for kind, values := range provenanceInCode(t) {
			for _, value := range values {
				// A source prefix such as "nri:" is documented with its placeholder: `nri:<plugin>`.
				documented := slices.ContainsFunc(spans, func(s string) bool {
					return s == value || (strings.HasSuffix(value, ":") && strings.HasPrefix(s, value+"<"))
				})
				if !documented {
					t.Errorf("%s does not document the %s value %q of verbose status (in a code span)", name, kind, value)
				}
			}
		}
	}
}

// codeSpans returns the content of the page's code spans.
func (p *page) codeSpans() []string {
	var spans []string
	for _, s := range p.spans() {
		if s.kind == codeSpan {
			spans = append(spans, s.text)
		}
	}
	return spans
}

// The provenance values of verbose status are the constants of containerd's CRI server declared
// with cniIPSource; each IP's field "source" shows those named *IPSource* (a prefix ends with
// ":"), an NRI IP's field "nri" the others.
const (
	criServerPackage     = "github.com/containerd/containerd/v2/internal/cri/server"
	provenanceAnchorName = "cniIPSource"
)

// provenanceInCode returns the provenance values the patched containerd of the workspace can
// report, by field: "source" and "nri".
func provenanceInCode(t *testing.T) map[string][]string {
	t.Helper()
	out, err := exec.Command("go", "list", "-f", "{{.Dir}}", criServerPackage).Output()
	if err != nil {
		t.Fatalf("go list %s: %v (run the tests in the workspace make src writes, GOWORK=build/go.work)", criServerPackage, err)
	}
	dir := strings.TrimSpace(string(out))
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		file, err := parser.ParseFile(token.NewFileSet(), name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, decl := range file.Decls {
			if values := provenanceGroup(decl); values != nil {
				return values
			}
		}
	}
	t.Fatalf("%s declares no constant %s: not the patched tree of make src, or the provenance values of verbose status moved", dir, provenanceAnchorName)
	return nil
}

// provenanceGroup returns the values of the constants of decl, by field, if it declares
// provenanceAnchorName.
func provenanceGroup(decl ast.Decl) map[string][]string {
	group, ok := decl.(*ast.GenDecl)
	if !ok || group.Tok != token.CONST {
		return nil
	}
	values := map[string][]string{}
	anchored := false
	for _, spec := range group.Specs {
		constants := spec.(*ast.ValueSpec)
		for i, name := range constants.Names {
			anchored = anchored || name.Name == provenanceAnchorName
			literal, ok := constants.Values[i].(*ast.BasicLit)
			if !ok || literal.Kind != token.STRING {
				continue
			}
			value, err := strconv.Unquote(literal.Value)
			if err != nil {
				continue
			}
			field := "nri"
			if strings.Contains(name.Name, "IPSource") {
				field = "source"
			}
			values[field] = append(values[field], value)
		}
	}
	if !anchored {
		return nil
	}
	return values
}
