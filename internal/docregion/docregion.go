// Package docregion rewrites the generated regions of a documentation page: what stands between
// <!-- KIND:ID --> and <!-- /KIND:ID --> comes from a program (benchmark tables, conformance
// results), the rest of the page is written by hand.
package docregion

import (
	"fmt"
	"os"
	"strings"
)

// Fill replaces what stands between each <!-- kind:ID --> and <!-- /kind:ID --> of page with
// regions[ID]; every region must be there.
func Fill(page, kind string, regions map[string]string) (string, error) {
	for id, content := range regions {
		begin, end := "<!-- "+kind+":"+id+" -->", "<!-- /"+kind+":"+id+" -->"
		before, rest, ok := strings.Cut(page, begin)
		_, after, okEnd := strings.Cut(rest, end)
		if !ok || !okEnd {
			return "", fmt.Errorf("no region %s ... %s", begin, end)
		}
		page = before + begin + "\n" + strings.TrimSpace(content) + "\n" + end + after
	}
	return page, nil
}

// FillFile is Fill on the file at path, rewritten in place.
func FillFile(path, kind string, regions map[string]string) error {
	text, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	updated, err := Fill(string(text), kind, regions)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return os.WriteFile(path, []byte(updated), 0o644)
}
