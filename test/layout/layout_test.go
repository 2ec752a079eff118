// Package layout checks the repository's layout: what users run never carries test code.
package layout

import (
	"os/exec"
	"strings"
	"testing"
)

const (
	module = "github.com/knext-dev/knext"
	// testHome holds the code only tests use (harnesses, test plugins, suite runners).
	testHome = module + "/test/"
)

// productPatterns are every command and every product package: none may depend on the test home.
var productPatterns = []string{module + "/cmd/...", module + "/internal/...", module + "/deploy/..."}

func TestCommandsAndProductDoNotDependOnTestCode(t *testing.T) {
	roots := goList(t, append([]string{"-f", "{{.ImportPath}}"}, productPatterns...)...)
	imports := map[string][]string{}
	for _, line := range goList(t, append([]string{"-deps", "-f", "{{.ImportPath}}{{range .Imports}} {{.}}{{end}}"}, productPatterns...)...) {
		fields := strings.Fields(line)
		imports[fields[0]] = fields[1:]
	}
	if len(roots) == 0 || len(imports) == 0 {
		t.Fatalf("go list found no package under %v", productPatterns)
	}
	for _, root := range roots {
		if path := pathToTestHome(root, imports, map[string]bool{}); path != nil {
			t.Errorf("%s depends on test-only code: %s", root, strings.Join(path, " imports "))
		}
	}
}

// pathToTestHome returns an import chain from pkg to a package of the test home, or nil.
func pathToTestHome(pkg string, imports map[string][]string, seen map[string]bool) []string {
	if strings.HasPrefix(pkg, testHome) {
		return []string{pkg}
	}
	if seen[pkg] || !strings.HasPrefix(pkg, module+"/") {
		return nil
	}
	seen[pkg] = true
	for _, imported := range imports[pkg] {
		if path := pathToTestHome(imported, imports, seen); path != nil {
			return append([]string{pkg}, path...)
		}
	}
	return nil
}

// goList runs `go list` with args and returns its output lines.
func goList(t *testing.T, args ...string) []string {
	t.Helper()
	cmd := exec.Command("go", append([]string{"list"}, args...)...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	if len(strings.TrimSpace(string(out))) == 0 {
		return nil
	}
	return strings.Split(strings.TrimSpace(string(out)), "\n")
}
