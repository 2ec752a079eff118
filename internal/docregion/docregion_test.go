package docregion

import (
	"os"
	"path/filepath"
	"testing"
)

func TestFillReplacesEveryRegion(t *testing.T) {
	page := "# P\n<!-- bench:a -->\nold\n<!-- /bench:a -->\ntext\n<!-- bench:b -->\n<!-- /bench:b -->\n"
	got, err := Fill(page, "bench", map[string]string{"a": "A\n", "b": "B"})
	if want := "# P\n<!-- bench:a -->\nA\n<!-- /bench:a -->\ntext\n<!-- bench:b -->\nB\n<!-- /bench:b -->\n"; err != nil || got != want {
		t.Errorf("Fill = %q, %v; want %q", got, err, want)
	}
	if _, err := Fill(page, "bench", map[string]string{"a": "A", "b": "B", "c": "C"}); err == nil {
		t.Error("content without a region was dropped silently")
	}
	if _, err := Fill(page, "other", map[string]string{"a": "A"}); err == nil {
		t.Error("a region of another kind was filled")
	}
}

func TestFillFileRewritesThePage(t *testing.T) {
	page := filepath.Join(t.TempDir(), "page.md")
	if err := os.WriteFile(page, []byte("<!-- k:x -->\n<!-- /k:x -->\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := FillFile(page, "k", map[string]string{"x": "table"}); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(page); string(got) != "<!-- k:x -->\ntable\n<!-- /k:x -->\n" {
		t.Errorf("page = %q", got)
	}
	if err := FillFile(page, "k", map[string]string{"y": "table"}); err == nil {
		t.Error("a missing region was not reported")
	}
}
