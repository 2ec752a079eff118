package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// stream writes a test2json stream in which each test (name: outcome) ends as given; skipped
// tests print a reason first.
func stream(t *testing.T, results map[string]outcome) string {
	t.Helper()
	var b strings.Builder
	for name, o := range results {
		fmt.Fprintf(&b, `{"Action":"run","Test":%q}`+"\n", name)
		fmt.Fprintf(&b, `{"Action":"output","Test":%q,"Output":"=== RUN   %s\n"}`+"\n", name, name)
		if o == skip {
			fmt.Fprintf(&b, `{"Action":"output","Test":%q,"Output":"    x_test.go:12: needs cgroup v2\n"}`+"\n", name)
			fmt.Fprintf(&b, `{"Action":"output","Test":%q,"Output":"--- SKIP: %s (0.00s)\n"}`+"\n", name, name)
		}
		fmt.Fprintf(&b, `{"Action":%q,"Test":%q}`+"\n", o, name)
	}
	b.WriteString("panic: not a test2json line\n")
	path := filepath.Join(t.TempDir(), "run.json")
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestCompare(t *testing.T) {
	source := t.TempDir()
	for name, content := range map[string]string{
		"a_test.go":         "func TestA(t *testing.T) {}\nfunc TestB(t *testing.T) {}\n",
		"c_linux_test.go":   "func TestC(t *testing.T) {}\n",
		"w_windows_test.go": "func TestW(t *testing.T) {}\n",
	} {
		if err := os.WriteFile(filepath.Join(source, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	upstream := stream(t, map[string]outcome{"TestA": pass, "TestA/sub": pass, "TestB": skip, "TestC": fail})

	for _, tc := range []struct {
		name  string
		knext map[string]outcome
		ok    bool
		want  []string
	}{
		{"same results", map[string]outcome{"TestA": pass, "TestA/sub": pass, "TestB": skip, "TestC": fail}, true,
			[]string{"knext:    1 passed, 1 failed, 1 skipped", "TestB (knext skip, upstream skip): x_test.go:12: needs cgroup v2",
				"| a_test.go | 2 | 1 passed, 0 failed, 1 skipped | 1 passed, 0 failed, 1 skipped |"}},
		{"knext does better", map[string]outcome{"TestA": pass, "TestA/sub": pass, "TestB": skip, "TestC": pass}, true,
			[]string{"other differences (knext does not do worse):\n  TestC: knext pass, upstream fail"}},
		{"a subtest fails on knext", map[string]outcome{"TestA": fail, "TestA/sub": fail, "TestB": skip, "TestC": fail}, false,
			[]string{"TestA/sub  fail   pass      <- differs", "REGRESSIONS", "TestA/sub: knext fail, upstream pass"}},
		{"skipped on knext only", map[string]outcome{"TestA": skip, "TestB": skip, "TestC": fail}, false,
			[]string{"TestA: knext skip, upstream pass", "TestA/sub: knext -, upstream pass"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out strings.Builder
			markdown := filepath.Join(t.TempDir(), "table.md")
			ok, err := compare(stream(t, tc.knext), upstream, source, markdown, &out)
			if err != nil {
				t.Fatal(err)
			}
			if ok != tc.ok {
				t.Errorf("compare said ok=%v, want %v:\n%s", ok, tc.ok, out.String())
			}
			for _, want := range tc.want {
				if !strings.Contains(out.String(), want) {
					t.Errorf("output lacks %q:\n%s", want, out.String())
				}
			}
			table, err := os.ReadFile(markdown)
			if err != nil || strings.Contains(string(table), "w_windows_test.go") || !strings.Contains(string(table), "| c_linux_test.go | 1 |") {
				t.Errorf("Markdown table (%v):\n%s", err, table)
			}
		})
	}
}

func TestARunWithoutTestsFails(t *testing.T) {
	empty := filepath.Join(t.TempDir(), "empty.json")
	if err := os.WriteFile(empty, []byte("build failed\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	if _, err := compare(empty, stream(t, map[string]outcome{"TestA": pass}), "", "", &out); err == nil {
		t.Errorf("a run without tests compared without error:\n%s", out.String())
	}
}
