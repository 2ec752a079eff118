package compare

import (
	"regexp"
	"slices"
	"strings"
)

// GinkgoFocus is the Ginkgo focus (-ginkgo.focus) that selects the given specs, each named by its
// full text (the texts of its containers and its own, joined by spaces). Ginkgo matches the focus
// against the suite's description, a space and that text.
func GinkgoFocus(specs []string) string {
	quoted := make([]string, len(specs))
	for i, spec := range specs {
		quoted[i] = regexp.QuoteMeta(spec)
	}
	slices.Sort(quoted)
	return ` (?:` + strings.Join(slices.Compact(quoted), "|") + `)$`
}
