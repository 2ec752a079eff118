package doccheck

import (
	"encoding/json"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"
)

// InspectpRegionKind marks the examples of `crictl inspectp` output in the pages:
// <!-- inspectp:ID --> and <!-- /inspectp:ID --> around one ```json code block.
const InspectpRegionKind = "inspectp"

// PodNetworkKey is the entry of verbose pod status in which knext shows where a pod's IPs come
// from; crictl inspectp shows it at the top level.
const PodNetworkKey = "podNetwork"

// InspectpExample is an example of `crictl inspectp -o json` output in a page.
type InspectpExample struct {
	// Where is the page and the line of the example's code block.
	Where string
	// Value is the example, decoded; an example of the podNetwork entry alone is
	// {"podNetwork": ...}.
	Value map[string]any
}

// PodNetwork returns the example's podNetwork entry, nil if it has none.
func (e InspectpExample) PodNetwork() any { return e.Value[PodNetworkKey] }

// InspectpExamples returns the marked examples of `crictl inspectp` output of every page.
func (r *Repository) InspectpExamples() ([]InspectpExample, error) {
	var examples []InspectpExample
	for _, p := range r.pages {
		regions, err := p.regions(InspectpRegionKind)
		if err != nil {
			return nil, err
		}
		for _, marked := range regions {
			text, line, err := marked.codeBlock("json")
			if err != nil {
				return nil, err
			}
			where := fmt.Sprintf("%s:%d", p.Path, line)
			value, err := decodeExample(text)
			if err != nil {
				return nil, fmt.Errorf("%s: the example of region %s:%s is no JSON: %w", where, InspectpRegionKind, marked.id, err)
			}
			examples = append(examples, InspectpExample{Where: where, Value: value})
		}
	}
	return examples, nil
}

// UnmarkedInspectpExamples returns the page and line of every JSON code block that shows a
// podNetwork entry outside a region of InspectpRegionKind: an example no check compares with
// the real output.
func (r *Repository) UnmarkedInspectpExamples() ([]string, error) {
	var unmarked []string
	for _, p := range r.pages {
		regions, err := p.regions(InspectpRegionKind)
		if err != nil {
			return nil, err
		}
		for _, b := range p.spans() {
			if b.kind != codeBlockSpan || b.lang != "json" || !strings.Contains(b.text, `"`+PodNetworkKey+`"`) {
				continue
			}
			if !slices.ContainsFunc(regions, func(r region) bool { return r.start < b.line && b.line < r.end }) {
				unmarked = append(unmarked, fmt.Sprintf("%s:%d", p.Path, b.line))
			}
		}
	}
	return unmarked, nil
}

// trailingComma matches a comma that an elided line left before a closing bracket.
var trailingComma = regexp.MustCompile(`,(\s*[}\]])`)

// decodeExample decodes an example as the pages write them: a line "..." stands for entries
// left out, and an example may be one entry, "key": value, of an object.
func decodeExample(text string) (map[string]any, error) {
	var kept []string
	for line := range strings.SplitSeq(text, "\n") {
		if strings.TrimSpace(line) != "..." {
			kept = append(kept, line)
		}
	}
	text = trailingComma.ReplaceAllString(strings.Join(kept, "\n"), "$1")
	if strings.HasPrefix(strings.TrimSpace(text), `"`) {
		text = "{" + text + "}"
	}
	var value map[string]any
	err := json.Unmarshal([]byte(text), &value)
	return value, err
}

// FieldPaths returns the paths of every field of a decoded JSON value, such as
// "podNetwork.ips[].source", sorted: an object's field is its path, a dot and its name, and
// an array's elements share its path and "[]".
func FieldPaths(value any) []string {
	paths := map[string]bool{}
	var walk func(prefix string, v any)
	walk = func(prefix string, v any) {
		switch v := v.(type) {
		case map[string]any:
			for name, field := range v {
				p := name
				if prefix != "" {
					p = prefix + "." + name
				}
				paths[p] = true
				walk(p, field)
			}
		case []any:
			for _, element := range v {
				walk(prefix+"[]", element)
			}
		}
	}
	walk("", value)
	return slices.Sorted(maps.Keys(paths))
}

// Provenance returns the provenance values that a decoded podNetwork entry shows: each IP's
// source, as "cni" or "nri:" (the plugin's name left out), and each NRI IP's "nri" value, sorted.
func Provenance(podNetwork any) []string {
	values := map[string]bool{}
	entry, _ := podNetwork.(map[string]any)
	ips, _ := entry["ips"].([]any)
	for _, ip := range ips {
		fields, _ := ip.(map[string]any)
		if source, ok := fields["source"].(string); ok {
			kind, _, isPlugin := strings.Cut(source, ":")
			if isPlugin {
				kind += ":"
			}
			values["source "+kind] = true
		}
		if nri, ok := fields["nri"].(string); ok {
			values["nri "+nri] = true
		}
	}
	return slices.Sorted(maps.Keys(values))
}
