package githubreleases

import (
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

func TestServesTarballsAndTheirTags(t *testing.T) {
	dir := t.TempDir()
	for name, content := range map[string]string{
		"containerd-1.7.20-linux-amd64.tar.gz": "old",
		"containerd-2.0.14-linux-amd64.tar.gz": "new",
		"README":                               "not a release",
	} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	h, err := Handler(dir)
	if err != nil {
		t.Fatal(err)
	}
	get := func(path string) (int, string, string) {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
		body, _ := io.ReadAll(rec.Result().Body)
		return rec.Code, rec.Header().Get("Content-Type"), string(body)
	}

	if code, _, body := get("/containerd/containerd/releases/download/v2.0.14/containerd-2.0.14-linux-amd64.tar.gz"); code != http.StatusOK || body != "new" {
		t.Errorf("release download: %d %q, want 200 \"new\"", code, body)
	}
	for _, path := range []string{
		"/containerd/containerd/releases/download/v1.7.21/containerd-1.7.20-linux-amd64.tar.gz", // tag and file disagree
		"/containerd/containerd/releases/download/v1.7.99/containerd-1.7.99-linux-amd64.tar.gz", // not built
		"/containerd/containerd/releases/download/README/README",
	} {
		if code, _, _ := get(path); code != http.StatusNotFound {
			t.Errorf("GET %s: %d, want 404", path, code)
		}
	}

	// What git ls-remote parses as a dumb server's refs: "<40 hex>\t<ref>" lines, not the smart
	// protocol's content type.
	code, contentType, body := get("/containerd/containerd.git/info/refs?service=git-upload-pack")
	if code != http.StatusOK || strings.Contains(contentType, "git-upload-pack") {
		t.Fatalf("info/refs: %d %q", code, contentType)
	}
	lines := strings.Split(strings.TrimSuffix(body, "\n"), "\n")
	want := []string{"refs/tags/v1.7.20", "refs/tags/v2.0.14"}
	if len(lines) != len(want) {
		t.Fatalf("info/refs:\n%s\nwant the refs %v", body, want)
	}
	for i, line := range lines {
		id, ref, ok := strings.Cut(line, "\t")
		if !ok || len(id) != 40 || strings.Trim(id, "0123456789abcdef") != "" || ref != want[i] {
			t.Errorf("info/refs line %q, want a 40-hex object id, a tab and %s", line, want[i])
		}
	}
}

func TestRefusesADirectoryWithoutReleases(t *testing.T) {
	if _, err := Handler(t.TempDir()); err == nil || !strings.Contains(err.Error(), "no containerd release tarball") {
		t.Errorf("Handler of an empty directory: %v, want an error naming what is missing", err)
	}
}

// git itself lists the tags as the upgrade tests ask for them.
func TestGitListsTheTags(t *testing.T) {
	dir := t.TempDir()
	for _, name := range []string{"containerd-1.7.20-linux-amd64.tar.gz", "containerd-1.7.35-linux-amd64.tar.gz", "containerd-2.0.14-linux-amd64.tar.gz"} {
		if err := os.WriteFile(filepath.Join(dir, name), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	h, err := Handler(dir)
	if err != nil {
		t.Fatal(err)
	}
	server := httptest.NewTLSServer(h)
	defer server.Close()
	cmd := exec.Command("git", "ls-remote", "--tags", "--exit-code", server.URL+"/containerd/containerd.git", "refs/tags/v1.7.*")
	cmd.Env = append(os.Environ(), "GIT_SSL_NO_VERIFY=1", "GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null", "GIT_TERMINAL_PROMPT=0")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("git ls-remote: %v\n%s", err, out)
	}
	fields := strings.Fields(string(out))
	if len(fields) != 4 || fields[1] != "refs/tags/v1.7.20" || fields[3] != "refs/tags/v1.7.35" {
		t.Errorf("git ls-remote listed:\n%s\nwant refs/tags/v1.7.20 and refs/tags/v1.7.35", out)
	}
}
