package registry

import (
	"archive/tar"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

const manifestType = "application/vnd.oci.image.manifest.v1+json"

func digestOf(data []byte) string {
	sum := sha256.Sum256(data)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// writeArchive writes an OCI layout archive holding one image named name with one layer, and
// returns the archive's path, the manifest bytes and the layer bytes. corrupt stores the layer
// under a wrong digest.
func writeArchive(t *testing.T, name string, corrupt bool) (path string, manifest, layer []byte) {
	t.Helper()
	layer = []byte("layer of " + name)
	layerDigest := digestOf(layer)
	manifest, _ = json.Marshal(map[string]any{
		"schemaVersion": 2,
		"mediaType":     manifestType,
		"layers":        []descriptor{{MediaType: "application/vnd.oci.image.layer.v1.tar", Digest: layerDigest, Size: int64(len(layer))}},
	})
	index, _ := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"manifests": []descriptor{{
			MediaType:   manifestType,
			Digest:      digestOf(manifest),
			Size:        int64(len(manifest)),
			Annotations: map[string]string{imageNameAnnotation: name},
		}},
	})
	storedLayer := layer
	if corrupt {
		storedLayer = []byte("tampered")
	}
	path = filepath.Join(t.TempDir(), "image.tar")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	tw := tar.NewWriter(f)
	for _, file := range []struct {
		name string
		data []byte
	}{
		{"oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)},
		{"index.json", index},
		{"blobs/sha256/" + strings.TrimPrefix(digestOf(manifest), "sha256:"), manifest},
		{"blobs/sha256/" + strings.TrimPrefix(layerDigest, "sha256:"), storedLayer},
	} {
		if err := tw.WriteHeader(&tar.Header{Name: file.name, Mode: 0o644, Size: int64(len(file.data)), Typeflag: tar.TypeReg}); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write(file.data); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	return path, manifest, layer
}

func get(t *testing.T, reg *Registry, method, host, path string) *http.Response {
	t.Helper()
	req := httptest.NewRequest(method, "https://"+host+path, nil)
	rec := httptest.NewRecorder()
	reg.ServeHTTP(rec, req)
	return rec.Result()
}

func body(t *testing.T, resp *http.Response) string {
	t.Helper()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

func TestServesManifestsAndBlobsByNameAndAlias(t *testing.T) {
	path, manifest, layer := writeArchive(t, "knext.local/pause:3.10", false)
	reg := New()
	if err := reg.LoadArchive(path); err != nil {
		t.Fatal(err)
	}
	if err := reg.AddAlias("registry.k8s.io/pause:3.10.2", "knext.local/pause:3.10"); err != nil {
		t.Fatal(err)
	}
	if got, want := strings.Join(reg.Hosts(), ","), "knext.local,registry.k8s.io"; got != want {
		t.Errorf("hosts = %s, want %s", got, want)
	}

	for _, tc := range []struct{ host, path string }{
		{"knext.local", "/v2/pause/manifests/3.10"},
		{"registry.k8s.io:443", "/v2/pause/manifests/3.10.2"},
		{"knext.local", "/v2/pause/manifests/" + digestOf(manifest)},
		// containerd pulling registry.k8s.io/pause:3.10.2 through a hosts.toml mirror.
		{"127.0.0.1:5077", "/v2/pause/manifests/3.10.2?ns=registry.k8s.io"},
	} {
		resp := get(t, reg, http.MethodGet, tc.host, tc.path)
		if resp.StatusCode != http.StatusOK || body(t, resp) != string(manifest) {
			t.Errorf("GET %s%s: status %d, want the manifest", tc.host, tc.path, resp.StatusCode)
		}
		if got := resp.Header.Get("Content-Type"); got != manifestType {
			t.Errorf("GET %s%s: Content-Type %q, want %q", tc.host, tc.path, got, manifestType)
		}
		if got := resp.Header.Get("Docker-Content-Digest"); got != digestOf(manifest) {
			t.Errorf("GET %s%s: Docker-Content-Digest %q, want %q", tc.host, tc.path, got, digestOf(manifest))
		}
	}

	head := get(t, reg, http.MethodHead, "knext.local", "/v2/pause/manifests/3.10")
	if head.StatusCode != http.StatusOK || body(t, head) != "" || head.Header.Get("Content-Length") != strconv.Itoa(len(manifest)) {
		t.Errorf("HEAD manifest: status %d, Content-Length %q, want 200 with length %d and no body",
			head.StatusCode, head.Header.Get("Content-Length"), len(manifest))
	}

	blob := get(t, reg, http.MethodGet, "knext.local", "/v2/pause/blobs/"+digestOf(layer))
	if blob.StatusCode != http.StatusOK || body(t, blob) != string(layer) {
		t.Errorf("GET blob: status %d, want the layer", blob.StatusCode)
	}
}

func TestUnknownNamesAndDigestsAreNotFound(t *testing.T) {
	path, _, _ := writeArchive(t, "knext.local/busybox:1.36", false)
	reg := New()
	if err := reg.LoadArchive(path); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ host, path, code string }{
		{"knext.local", "/v2/busybox/manifests/latest", "MANIFEST_UNKNOWN"},
		{"other.example", "/v2/busybox/manifests/1.36", "MANIFEST_UNKNOWN"},
		// A mirror request names the registry in ns, whatever the Host header says.
		{"knext.local", "/v2/busybox/manifests/1.36?ns=other.example", "MANIFEST_UNKNOWN"},
		{"knext.local", "/v2/busybox/blobs/sha256:" + strings.Repeat("0", 64), "BLOB_UNKNOWN"},
	} {
		resp := get(t, reg, http.MethodGet, tc.host, tc.path)
		if resp.StatusCode != http.StatusNotFound || !strings.Contains(body(t, resp), tc.code) {
			t.Errorf("GET %s%s: status %d, want 404 %s", tc.host, tc.path, resp.StatusCode, tc.code)
		}
	}
	if resp := get(t, reg, http.MethodPut, "knext.local", "/v2/busybox/manifests/1.36"); resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("PUT: status %d, want 405", resp.StatusCode)
	}
}

func TestRejectsBadArchivesAndAliases(t *testing.T) {
	corrupt, _, _ := writeArchive(t, "knext.local/pause:3.10", true)
	if err := New().LoadArchive(corrupt); err == nil || !strings.Contains(err.Error(), "has digest") {
		t.Errorf("loading an archive with a tampered blob: err = %v, want a digest mismatch", err)
	}

	good, _, _ := writeArchive(t, "knext.local/pause:3.10", false)
	reg := New()
	if err := reg.LoadArchive(good); err != nil {
		t.Fatal(err)
	}
	if err := reg.LoadArchive(good); err == nil || !strings.Contains(err.Error(), "defined twice") {
		t.Errorf("loading the same image twice: err = %v, want 'defined twice'", err)
	}
	if err := reg.AddAlias("registry.k8s.io/pause:3.10.2", "knext.local/pause:9"); err == nil ||
		!strings.Contains(err.Error(), "knext.local/pause:3.10") {
		t.Errorf("alias of a missing image: err = %v, want it to list the images it has", err)
	}
	if err := reg.AddAlias("pause:3.10.2", "knext.local/pause:3.10"); err == nil {
		t.Error("alias without a registry host was accepted")
	}
}
