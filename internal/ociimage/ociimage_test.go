package ociimage

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// readArchive returns an image archive's files, its index and the manifest of its first image.
func readArchive(t *testing.T, data []byte) (files map[string][]byte, index v1.IndexManifest, manifest v1.Manifest) {
	t.Helper()
	files = map[string][]byte{}
	for _, header := range readTar(t, data, files) {
		if header.Mode&0o111 != 0 && header.Typeflag == tar.TypeReg {
			t.Errorf("archive file %s has mode %o, want no executable bits", header.Name, header.Mode)
		}
	}
	if err := json.Unmarshal(files[ocispec.ImageIndexFile], &index); err != nil {
		t.Fatalf("index.json: %v", err)
	}
	if len(index.Manifests) == 0 {
		t.Fatal("index.json lists no image")
	}
	if err := json.Unmarshal(blob(t, files, index.Manifests[0].Digest), &manifest); err != nil {
		t.Fatalf("manifest: %v", err)
	}
	return files, index, manifest
}

func blob(t *testing.T, files map[string][]byte, digest v1.Hash) []byte {
	t.Helper()
	data, ok := files["blobs/sha256/"+digest.Hex]
	if !ok {
		t.Fatalf("the archive has no blob %s", digest)
	}
	return data
}

// readTar returns the headers of a tar stream, in order, and stores the content of its regular
// files in contents; it checks every time is Epoch.
func readTar(t *testing.T, data []byte, contents map[string][]byte) []*tar.Header {
	t.Helper()
	var headers []*tar.Header
	tr := tar.NewReader(bytes.NewReader(data))
	for {
		header, err := tr.Next()
		if err == io.EOF {
			return headers
		}
		if err != nil {
			t.Fatal(err)
		}
		if !header.ModTime.Equal(epoch) {
			t.Errorf("%s: mtime %s, want Epoch", header.Name, header.ModTime)
		}
		headers = append(headers, header)
		if header.Typeflag == tar.TypeReg {
			contents[header.Name], _ = io.ReadAll(tr)
		}
	}
}

// layer returns the headers and file contents of layer i of manifest.
func layer(t *testing.T, files map[string][]byte, manifest v1.Manifest, i int) ([]*tar.Header, map[string][]byte) {
	t.Helper()
	if manifest.Layers[i].MediaType != "application/vnd.oci.image.layer.v1.tar" {
		t.Errorf("layer %d has media type %s, want an uncompressed OCI layer", i, manifest.Layers[i].MediaType)
	}
	contents := map[string][]byte{}
	return readTar(t, blob(t, files, manifest.Layers[i].Digest), contents), contents
}

func writeBinary(t *testing.T, content string) string {
	t.Helper()
	binary := filepath.Join(t.TempDir(), "binary")
	if err := os.WriteFile(binary, []byte(content), 0o755); err != nil {
		t.Fatal(err)
	}
	return binary
}

func TestPauseArchiveIsDeterministicAndNamed(t *testing.T) {
	binary := writeBinary(t, "not really an executable")
	var first, second bytes.Buffer
	for _, w := range []io.Writer{&first, &second} {
		image, err := Pause(binary)
		if err != nil {
			t.Fatal(err)
		}
		if err := WriteArchive(w, image); err != nil {
			t.Fatal(err)
		}
	}
	if !bytes.Equal(first.Bytes(), second.Bytes()) {
		t.Fatal("two pause archives of the same binary differ")
	}

	files, index, manifest := readArchive(t, first.Bytes())
	if len(index.Manifests) != 1 {
		t.Fatalf("index has %d manifests, want 1", len(index.Manifests))
	}
	desc := index.Manifests[0]
	if desc.Annotations[ImageNameAnnotation] != PauseImage || desc.Annotations[ocispec.AnnotationRefName] != "3.10" {
		t.Errorf("manifest annotations %v, want name %s and ref 3.10", desc.Annotations, PauseImage)
	}
	if desc.MediaType != "application/vnd.oci.image.manifest.v1+json" || desc.Platform == nil || desc.Platform.OS != "linux" {
		t.Errorf("index entry %+v, want an OCI manifest for linux", desc)
	}
	if _, ok := files[ocispec.ImageLayoutFile]; !ok {
		t.Errorf("the archive has no %s", ocispec.ImageLayoutFile)
	}
	_, contents := layer(t, files, manifest, 0)
	if string(contents["pause"]) != "not really an executable" {
		t.Errorf("pause layer holds %v, want /pause with the binary", contents)
	}
	var config v1.ConfigFile
	if err := json.Unmarshal(blob(t, files, manifest.Config.Digest), &config); err != nil {
		t.Fatal(err)
	}
	if !config.Created.Equal(epoch) || config.Config.Entrypoint[0] != "/pause" || len(config.RootFS.DiffIDs) != 1 {
		t.Errorf("config %+v, want Epoch, entrypoint /pause and one layer", config)
	}
}

func TestBusyboxArchiveHasApplets(t *testing.T) {
	const busybox = "/bin/busybox"
	if _, err := os.Stat(busybox); err != nil {
		t.Fatalf("%s (Debian package busybox-static): %v", busybox, err)
	}
	image, err := Busybox(busybox)
	if err != nil {
		t.Fatal(err)
	}
	var archive bytes.Buffer
	if err := WriteArchive(&archive, image); err != nil {
		t.Fatal(err)
	}
	files, _, manifest := readArchive(t, archive.Bytes())
	headers, _ := layer(t, files, manifest, 0)
	entries := map[string]*tar.Header{}
	for _, header := range headers {
		entries[header.Name] = header
	}
	for _, applet := range []string{"bin/sh", "bin/sleep", "sbin/ip"} {
		if header := entries[applet]; header == nil || header.Linkname != "/bin/busybox" {
			t.Errorf("busybox layer: %s is %+v, want a symlink to /bin/busybox", applet, header)
		}
	}
	// Directories the image lists itself keep their modes; parents of files are added.
	for dir, mode := range map[string]int64{"tmp/": 0o1777, "root/": 0o700, "usr/bin/": 0o755, "sbin/": 0o755} {
		if header := entries[dir]; header == nil || header.Typeflag != tar.TypeDir || header.Mode != mode {
			t.Errorf("busybox layer: %s is %+v, want a directory with mode %o", dir, header, mode)
		}
	}
}

func TestNRIBridgeArchiveRunsTheBinary(t *testing.T) {
	binary := writeBinary(t, "a static nri-bridge")
	const name = NRIBridgeRepository + ":v2.4.2-knext.0123456789ab"
	image, err := NRIBridge(name, binary)
	if err != nil {
		t.Fatal(err)
	}
	archive := filepath.Join(t.TempDir(), "images", NRIBridgeArchive)
	if err := WriteArchiveFile(archive, image); err != nil {
		t.Fatal(err)
	}
	if got, err := ImageName(archive); err != nil || got != name {
		t.Errorf("ImageName = %q, %v; want %s", got, err, name)
	}

	data, err := os.ReadFile(archive)
	if err != nil {
		t.Fatal(err)
	}
	files, _, manifest := readArchive(t, data)
	var config v1.ConfigFile
	if err := json.Unmarshal(blob(t, files, manifest.Config.Digest), &config); err != nil {
		t.Fatal(err)
	}
	_, contents := layer(t, files, manifest, 0)
	entrypoint := config.Config.Entrypoint
	if len(entrypoint) != 1 || string(contents[entrypoint[0][1:]]) != "a static nri-bridge" {
		t.Errorf("entrypoint %v, layer %v: want the binary as the entrypoint", entrypoint, contents)
	}

	if _, err := NRIBridge("knext.local/other:v1", binary); err == nil {
		t.Error("an nri-bridge image outside " + NRIBridgeRepository + " was accepted")
	}
}

// TestArchiveOfDeclaredImages writes two images with a common base layer, one of them under two
// names, and checks the index, the blob sharing, the entries' owners and modes, the hard-link
// order and the configuration.
func TestArchiveOfDeclaredImages(t *testing.T) {
	base := Layer{
		Hardlink("bin/ash", "bin/busybox"),
		RegularFile("bin/busybox", 0o755, []byte("busybox")),
	}.WithParents()
	config := v1.Config{
		Entrypoint: []string{"/bin/ash", "-c"}, Cmd: []string{"cat /data/owned"}, Env: []string{DefaultPath},
		User: "1000:1001", WorkingDir: "/data", Volumes: map[string]struct{}{"/data": {}}, ArgsEscaped: true,
		Labels: map[string]string{"purpose": "test"},
	}
	images := []Image{
		{Names: []string{"example.test/base:1"}, Layers: []Layer{base}},
		{Names: []string{"example.test/extra:1", "other.test/extra:2"}, Config: config, Layers: []Layer{base, {
			Dir("data", 0o750).Owner(1000, 1001),
			RegularFile("data/owned", 0o4755, []byte("x")).Owner(1000, 1001),
			Symlink("data/link", "/data/owned"),
		}}},
	}
	var archive bytes.Buffer
	if err := WriteArchive(&archive, images...); err != nil {
		t.Fatal(err)
	}
	files, index, _ := readArchive(t, archive.Bytes())
	var names []string
	for _, m := range index.Manifests {
		names = append(names, m.Annotations[ImageNameAnnotation])
	}
	if got, want := strings.Join(names, " "), "example.test/base:1 example.test/extra:1 other.test/extra:2"; got != want {
		t.Fatalf("index names %q, want %q", got, want)
	}
	if index.Manifests[1].Digest != index.Manifests[2].Digest {
		t.Error("two names of one image point to different manifests")
	}
	if digest, err := images[1].Digest(); err != nil || digest != index.Manifests[1].Digest {
		t.Errorf("Digest() = %s, %v; want the digest of the archive's manifest %s", digest, err, index.Manifests[1].Digest)
	}
	// base layer + 2 configs + 2 manifests + extra layer: the base layer is stored once.
	blobs := 0
	for name := range files {
		if strings.HasPrefix(name, "blobs/sha256/") {
			blobs++
		}
	}
	if blobs != 6 {
		t.Errorf("archive has %d blobs, want 6", blobs)
	}

	var manifest v1.Manifest
	if err := json.Unmarshal(blob(t, files, index.Manifests[1].Digest), &manifest); err != nil {
		t.Fatal(err)
	}
	if len(manifest.Layers) != 2 {
		t.Fatalf("extra image has %d layers, want 2", len(manifest.Layers))
	}
	baseHeaders, _ := layer(t, files, manifest, 0)
	var order []string
	for _, header := range baseHeaders {
		order = append(order, header.Name)
	}
	if got, want := strings.Join(order, " "), "bin/ bin/busybox bin/ash"; got != want {
		t.Errorf("base layer order %q, want %q (a hard link after its target)", got, want)
	}
	extraHeaders, _ := layer(t, files, manifest, 1)
	var extra []string
	for _, h := range extraHeaders {
		extra = append(extra, fmt.Sprintf("%s,%c,%o,%d,%d,%s", h.Name, h.Typeflag, h.Mode, h.Uid, h.Gid, h.Linkname))
	}
	if got, want := strings.Join(extra, " "), "data/,5,750,1000,1001, data/link,2,777,0,0,/data/owned data/owned,0,4755,1000,1001,"; got != want {
		t.Errorf("extra layer entries %q, want %q", got, want)
	}

	var configFile v1.ConfigFile
	if err := json.Unmarshal(blob(t, files, manifest.Config.Digest), &configFile); err != nil {
		t.Fatal(err)
	}
	gotConfig, _ := json.Marshal(configFile.Config)
	wantConfig, _ := json.Marshal(config)
	if string(gotConfig) != string(wantConfig) {
		t.Errorf("image config %s, want %s", gotConfig, wantConfig)
	}
}

func TestArchiveRejectsBadDeclarations(t *testing.T) {
	for _, tc := range []struct {
		name  string
		image Image
		want  string
	}{
		{"duplicate path", Image{Names: []string{"example.test/dup:1"}, Layers: []Layer{{
			RegularFile("a", 0o644, nil), Hardlink("a", "b"),
		}}}, "a: defined twice"},
		{"absolute path", Image{Names: []string{"example.test/abs:1"}, Layers: []Layer{{
			RegularFile("/etc/passwd", 0o644, nil),
		}}}, "/etc/passwd: not a relative path"},
		{"name without host", Image{Names: []string{"busybox:1"}}, "busybox:1"},
		{"no name", Image{}, "without a name"},
	} {
		err := WriteArchive(io.Discard, tc.image)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err = %v, want one containing %q", tc.name, err, tc.want)
		}
	}
}

// TestRootFSLayerKeptAsWritten builds two images on a root file system another tool wrote: its
// tar stream is their bottom layer byte for byte (its own times and entries kept), stored once,
// and ImageNames lists both images of the archive, which ImageName refuses.
func TestRootFSLayerKeptAsWritten(t *testing.T) {
	var rootfs bytes.Buffer
	tw := tar.NewWriter(&rootfs)
	for _, header := range []*tar.Header{
		{Typeflag: tar.TypeDir, Name: "./etc/", Mode: 0o755, ModTime: time.Unix(1700000000, 0)},
		{Typeflag: tar.TypeReg, Name: "./etc/debian_version", Mode: 0o644, Size: 5, ModTime: time.Unix(1700000000, 0)},
	} {
		if err := tw.WriteHeader(header); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := tw.Write([]byte("12.0\n")); err != nil {
		t.Fatal(err)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	rootfsFile := filepath.Join(dir, "rootfs.tar")
	if err := os.WriteFile(rootfsFile, rootfs.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	base, err := TarLayer(rootfsFile)
	if err != nil {
		t.Fatal(err)
	}
	images := []Image{
		{Names: []string{"example.test/debian:12"}, RootFS: base},
		{Names: []string{"example.test/tool:1"}, RootFS: base, Layers: []Layer{{RegularFile("tool", 0o755, []byte("tool"))}}},
	}
	archive := filepath.Join(dir, "images.tar")
	if err := WriteArchiveFile(archive, images...); err != nil {
		t.Fatal(err)
	}
	if names, err := ImageNames(archive); err != nil || strings.Join(names, " ") != "example.test/debian:12 example.test/tool:1" {
		t.Errorf("ImageNames = %q, %v; want both images", names, err)
	}
	if name, err := ImageName(archive); err == nil {
		t.Errorf("ImageName of an archive of two images = %q, want an error", name)
	}

	data, err := os.ReadFile(archive)
	if err != nil {
		t.Fatal(err)
	}
	files, index, _ := readArchive(t, data)
	var manifest v1.Manifest
	if err := json.Unmarshal(blob(t, files, index.Manifests[1].Digest), &manifest); err != nil {
		t.Fatal(err)
	}
	if len(manifest.Layers) != 2 || manifest.Layers[0].MediaType != "application/vnd.oci.image.layer.v1.tar" {
		t.Fatalf("layers %+v, want the root file system, uncompressed, below the image's own layer", manifest.Layers)
	}
	if !bytes.Equal(blob(t, files, manifest.Layers[0].Digest), rootfs.Bytes()) {
		t.Error("the bottom layer differs from the root file system's tar stream")
	}
	if _, contents := layer(t, files, manifest, 1); string(contents["tool"]) != "tool" {
		t.Errorf("the image's own layer holds %v, want /tool", contents)
	}

	notTar := filepath.Join(dir, "not.tar")
	if err := os.WriteFile(notTar, []byte("plain text, not a tar stream"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := TarLayer(notTar); err == nil {
		t.Error("TarLayer accepted a file that is not a tar archive")
	}
}
