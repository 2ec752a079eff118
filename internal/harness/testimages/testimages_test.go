package testimages

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// readTar returns the regular files and symlink targets of a tar stream.
// readArchive returns an image archive's files, its index and the manifest of its first image.
func readArchive(t *testing.T, data []byte) (files map[string][]byte, index ocispec.Index, manifest ocispec.Manifest) {
	t.Helper()
	files, _ = readTar(t, data)
	if err := json.Unmarshal(files[ocispec.ImageIndexFile], &index); err != nil {
		t.Fatalf("index.json: %v", err)
	}
	if len(index.Manifests) == 0 {
		t.Fatal("index.json lists no image")
	}
	if err := json.Unmarshal(files["blobs/sha256/"+index.Manifests[0].Digest.Encoded()], &manifest); err != nil {
		t.Fatalf("manifest: %v", err)
	}
	return files, index, manifest
}

func readTar(t *testing.T, data []byte) (files map[string][]byte, links map[string]string) {
	t.Helper()
	files, links = map[string][]byte{}, map[string]string{}
	tr := tar.NewReader(bytes.NewReader(data))
	for {
		header, err := tr.Next()
		if err == io.EOF {
			return files, links
		}
		if err != nil {
			t.Fatal(err)
		}
		if !header.ModTime.Equal(epoch) || header.Uid != 0 || header.Gid != 0 {
			t.Errorf("%s: mtime %s owner %d:%d, want Epoch and root", header.Name, header.ModTime, header.Uid, header.Gid)
		}
		switch header.Typeflag {
		case tar.TypeReg:
			files[header.Name], _ = io.ReadAll(tr)
		case tar.TypeSymlink:
			links[header.Name] = header.Linkname
		}
	}
}

func TestPauseArchiveIsDeterministicAndNamed(t *testing.T) {
	binary := filepath.Join(t.TempDir(), "pause")
	if err := os.WriteFile(binary, []byte("not really an executable"), 0o755); err != nil {
		t.Fatal(err)
	}
	var first, second bytes.Buffer
	if err := WritePause(&first, binary); err != nil {
		t.Fatal(err)
	}
	if err := WritePause(&second, binary); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(first.Bytes(), second.Bytes()) {
		t.Fatal("two pause archives of the same binary differ")
	}

	files, index, manifest := readArchive(t, first.Bytes())
	if len(index.Manifests) != 1 {
		t.Fatalf("index has %d manifests, want 1", len(index.Manifests))
	}
	annotations := index.Manifests[0].Annotations
	if annotations["io.containerd.image.name"] != PauseImage || annotations[ocispec.AnnotationRefName] != "3.10" {
		t.Errorf("manifest annotations %v, want name %s and ref 3.10", annotations, PauseImage)
	}
	layerFiles, _ := readTar(t, files["blobs/sha256/"+manifest.Layers[0].Digest.Encoded()])
	if string(layerFiles["pause"]) != "not really an executable" {
		t.Errorf("pause layer holds %v, want /pause with the binary", layerFiles)
	}
}

func TestBusyboxArchiveHasApplets(t *testing.T) {
	const busybox = "/bin/busybox"
	if _, err := os.Stat(busybox); err != nil {
		t.Fatalf("%s (Debian package busybox-static): %v", busybox, err)
	}
	var archive bytes.Buffer
	if err := WriteBusybox(&archive, busybox); err != nil {
		t.Fatal(err)
	}
	files, _, manifest := readArchive(t, archive.Bytes())
	_, links := readTar(t, files["blobs/sha256/"+manifest.Layers[0].Digest.Encoded()])
	for _, applet := range []string{"bin/sh", "bin/sleep", "sbin/ip"} {
		if links[applet] != "/bin/busybox" {
			t.Errorf("busybox layer: %s links to %q, want /bin/busybox", applet, links[applet])
		}
	}
}

func TestNRIBridgeArchiveRunsTheBinary(t *testing.T) {
	binary := filepath.Join(t.TempDir(), "nri-bridge")
	if err := os.WriteFile(binary, []byte("a static nri-bridge"), 0o755); err != nil {
		t.Fatal(err)
	}
	const name = NRIBridgeRepository + ":v2.4.2-knext.0123456789ab"
	archive := filepath.Join(t.TempDir(), NRIBridgeArchive)
	f, err := os.Create(archive)
	if err != nil {
		t.Fatal(err)
	}
	if err := WriteNRIBridge(f, name, binary); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
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
	var config ocispec.Image
	if err := json.Unmarshal(files["blobs/sha256/"+manifest.Config.Digest.Encoded()], &config); err != nil {
		t.Fatal(err)
	}
	layerFiles, _ := readTar(t, files["blobs/sha256/"+manifest.Layers[0].Digest.Encoded()])
	entrypoint := config.Config.Entrypoint
	if len(entrypoint) != 1 || string(layerFiles[entrypoint[0][1:]]) != "a static nri-bridge" {
		t.Errorf("entrypoint %v, layer %v: want the binary as the entrypoint", entrypoint, layerFiles)
	}

	if err := WriteNRIBridge(io.Discard, "knext.local/other:v1", binary); err == nil {
		t.Error("an nri-bridge image outside " + NRIBridgeRepository + " was written")
	}
}

// TestArchiveSharesBlobsAndOrdersHardLinks writes two images with a common base layer, one of
// them under two names, and checks the index, the blob sharing and the hard-link order.
func TestArchiveSharesBlobsAndOrdersHardLinks(t *testing.T) {
	base := []File{
		{Name: "bin", Mode: 0o755, Type: tar.TypeDir},
		{Name: "bin/ash", Mode: 0o755, Type: tar.TypeLink, Linkname: "bin/busybox"},
		{Name: "bin/busybox", Mode: 0o755, Type: tar.TypeReg, Content: []byte("busybox")},
	}
	images := []Image{
		{Names: []string{"example.test/base:1"}, Layers: [][]File{base}},
		{Names: []string{"example.test/extra:1", "other.test/extra:2"},
			Layers: [][]File{base, {{Name: "extra", Mode: 0o4755, Type: tar.TypeReg, Content: []byte("x")}}},
			Config: ocispec.ImageConfig{User: "1000"}},
	}
	var archive bytes.Buffer
	if err := WriteArchive(&archive, images...); err != nil {
		t.Fatal(err)
	}
	files, index, _ := readArchive(t, archive.Bytes())
	var names []string
	for _, m := range index.Manifests {
		names = append(names, m.Annotations["io.containerd.image.name"])
	}
	if got, want := strings.Join(names, " "), "example.test/base:1 example.test/extra:1 other.test/extra:2"; got != want {
		t.Fatalf("index names %q, want %q", got, want)
	}
	if index.Manifests[1].Digest != index.Manifests[2].Digest {
		t.Error("two names of one image point to different manifests")
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

	var manifest ocispec.Manifest
	if err := json.Unmarshal(files["blobs/sha256/"+index.Manifests[1].Digest.Encoded()], &manifest); err != nil {
		t.Fatal(err)
	}
	if len(manifest.Layers) != 2 {
		t.Fatalf("extra image has %d layers, want 2", len(manifest.Layers))
	}
	tr := tar.NewReader(bytes.NewReader(files["blobs/sha256/"+manifest.Layers[0].Digest.Encoded()]))
	var order []string
	for {
		header, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		order = append(order, header.Name)
	}
	if got, want := strings.Join(order, " "), "bin/ bin/busybox bin/ash"; got != want {
		t.Errorf("base layer order %q, want %q (a hard link after its target)", got, want)
	}
	extraTar := tar.NewReader(bytes.NewReader(files["blobs/sha256/"+manifest.Layers[1].Digest.Encoded()]))
	header, err := extraTar.Next()
	if err != nil {
		t.Fatal(err)
	}
	if header.Mode != 0o4755 {
		t.Errorf("extra mode %o, want 4755 (setuid kept)", header.Mode)
	}
}

func TestArchiveRejectsDuplicatePaths(t *testing.T) {
	layer := []File{
		{Name: "a", Mode: 0o644, Type: tar.TypeReg},
		{Name: "a", Mode: 0o644, Type: tar.TypeLink, Linkname: "b"},
	}
	err := WriteArchive(io.Discard, Image{Names: []string{"example.test/dup:1"}, Layers: [][]File{layer}})
	if err == nil || !strings.Contains(err.Error(), "a: defined twice") {
		t.Errorf("err = %v, want the duplicate path named", err)
	}
}
