// Package testimages writes knext's local test images, and nri-bridge's deployment image, as OCI
// image-layout archives that `ctr -n k8s.io images import` accepts; no registry is ever contacted.
//
// Images (linux, the build machine's architecture):
//
//   - knext.local/pause:3.10 (archive pause.tar): the static Go program of contrib/images/pause as
//     /pause, entrypoint ["/pause"]. It is the CRI sandbox image of every knext test and demo.
//   - knext.local/busybox:1.35 (archive busybox.tar): Debian 12's /bin/busybox (package
//     busybox-static) with one symlink per applet at the path `busybox --list-full` names, a
//     minimal /etc/passwd and /etc/group, command ["sh"].
//   - knext.local/nri-bridge:<knext version> (archive nri-bridge.tar): a static nri-bridge as
//     /usr/local/bin/nri-bridge, its entrypoint; the image of contrib/nri-bridge's manifests.
//
// Each archive holds one uncompressed layer; every timestamp is Epoch and every owner root, so the
// same input binaries always give byte-identical archives.
package testimages

import (
	"archive/tar"
	"bytes"
	_ "crypto/sha256" // registers the digest algorithm go-digest uses
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"runtime"
	"sort"
	"strings"
	"time"

	"github.com/opencontainers/go-digest"
	specs "github.com/opencontainers/image-spec/specs-go"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

const (
	// PauseImage is the CRI sandbox image of knext tests.
	PauseImage = "knext.local/pause:3.10"
	// BusyboxImage is the general-purpose container image of knext tests.
	BusyboxImage = "knext.local/busybox:1.35"

	// NRIBridgeRepository is the repository of nri-bridge's image; its tag is knext's version.
	NRIBridgeRepository = "knext.local/nri-bridge"

	// PauseArchive, BusyboxArchive and NRIBridgeArchive are the archive file names the images
	// command writes.
	PauseArchive     = "pause.tar"
	BusyboxArchive   = "busybox.tar"
	NRIBridgeArchive = "nri-bridge.tar"

	// containerdImageNameAnnotation tells containerd's importer the full image name.
	containerdImageNameAnnotation = "io.containerd.image.name"

	defaultPath = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
)

// epoch is the modification time of every file and of the image configuration.
var epoch = time.Unix(0, 0).UTC()

// file is one entry of an image layer.
type file struct {
	name     string // relative path inside the rootfs
	mode     int64
	typeflag byte
	content  []byte
	linkname string
}

// WritePause writes the pause image archive, with pauseBinary (a static executable) as /pause.
func WritePause(w io.Writer, pauseBinary string) error {
	binary, err := os.ReadFile(pauseBinary)
	if err != nil {
		return fmt.Errorf("pause image: %w", err)
	}
	files := []file{{name: "pause", mode: 0o755, typeflag: tar.TypeReg, content: binary}}
	config := ocispec.ImageConfig{Env: []string{defaultPath}, Entrypoint: []string{"/pause"}}
	return writeImage(w, PauseImage, files, config)
}

// WriteBusybox writes the busybox image archive from busyboxBinary, a statically linked busybox.
func WriteBusybox(w io.Writer, busyboxBinary string) error {
	binary, err := os.ReadFile(busyboxBinary)
	if err != nil {
		return fmt.Errorf("busybox image: %w", err)
	}
	// The binary itself knows where each applet belongs (bin/sh, usr/bin/wc, ...).
	list, err := exec.Command(busyboxBinary, "--list-full").Output()
	if err != nil {
		return fmt.Errorf("busybox image: %s --list-full: %w", busyboxBinary, err)
	}

	dirs := map[string]int64{"bin": 0o755, "dev": 0o755, "etc": 0o755, "proc": 0o755, "root": 0o700,
		"sbin": 0o755, "sys": 0o755, "tmp": 0o1777, "usr": 0o755, "usr/bin": 0o755, "usr/sbin": 0o755,
		"var": 0o755}
	files := []file{
		{name: "bin/busybox", mode: 0o755, typeflag: tar.TypeReg, content: binary},
		{name: "etc/passwd", mode: 0o644, typeflag: tar.TypeReg,
			content: []byte("root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n")},
		{name: "etc/group", mode: 0o644, typeflag: tar.TypeReg, content: []byte("root:x:0:\nnogroup:x:65534:\n")},
	}
	for _, applet := range strings.Fields(string(list)) {
		if applet == "bin/busybox" || !strings.Contains(applet, "/") {
			continue // the binary itself, and root-level oddities such as linuxrc
		}
		for dir := path.Dir(applet); dir != "."; dir = path.Dir(dir) {
			if _, ok := dirs[dir]; !ok {
				dirs[dir] = 0o755
			}
		}
		files = append(files, file{name: applet, mode: 0o777, typeflag: tar.TypeSymlink, linkname: "/bin/busybox"})
	}
	for dir, mode := range dirs {
		files = append(files, file{name: dir, mode: mode, typeflag: tar.TypeDir})
	}
	config := ocispec.ImageConfig{Env: []string{defaultPath}, Cmd: []string{"sh"}}
	return writeImage(w, BusyboxImage, files, config)
}

// WriteNRIBridge writes nri-bridge's image named name (NRIBridgeRepository:<tag>) with
// nriBridgeBinary, a static executable, as /usr/local/bin/nri-bridge.
func WriteNRIBridge(w io.Writer, name, nriBridgeBinary string) error {
	if !strings.HasPrefix(name, NRIBridgeRepository+":") {
		return fmt.Errorf("nri-bridge image: name %q is not %s:<tag>", name, NRIBridgeRepository)
	}
	binary, err := os.ReadFile(nriBridgeBinary)
	if err != nil {
		return fmt.Errorf("nri-bridge image: %w", err)
	}
	files := []file{
		{name: "usr", mode: 0o755, typeflag: tar.TypeDir},
		{name: "usr/local", mode: 0o755, typeflag: tar.TypeDir},
		{name: "usr/local/bin", mode: 0o755, typeflag: tar.TypeDir},
		{name: "usr/local/bin/nri-bridge", mode: 0o755, typeflag: tar.TypeReg, content: binary},
	}
	config := ocispec.ImageConfig{Env: []string{defaultPath}, Entrypoint: []string{"/usr/local/bin/nri-bridge"}}
	return writeImage(w, name, files, config)
}

// ImageName returns the name of the image in archive, an archive this package wrote.
func ImageName(archive string) (string, error) {
	f, err := os.Open(archive)
	if err != nil {
		return "", err
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		header, err := tr.Next()
		if err == io.EOF {
			return "", fmt.Errorf("%s: no %s", archive, ocispec.ImageIndexFile)
		}
		if err != nil {
			return "", fmt.Errorf("%s: %w", archive, err)
		}
		if header.Name != ocispec.ImageIndexFile {
			continue
		}
		var index ocispec.Index
		if err := json.NewDecoder(tr).Decode(&index); err != nil {
			return "", fmt.Errorf("%s: %s: %w", archive, ocispec.ImageIndexFile, err)
		}
		if len(index.Manifests) != 1 || index.Manifests[0].Annotations[containerdImageNameAnnotation] == "" {
			return "", fmt.Errorf("%s: want one named image, the index has %+v", archive, index.Manifests)
		}
		return index.Manifests[0].Annotations[containerdImageNameAnnotation], nil
	}
}

// blob is a content-addressed object of the image layout.
type blob struct {
	mediaType string
	data      []byte
}

func (b blob) descriptor() ocispec.Descriptor {
	return ocispec.Descriptor{MediaType: b.mediaType, Digest: digest.FromBytes(b.data), Size: int64(len(b.data))}
}

// writeImage writes an OCI image layout archive holding one single-layer image named name.
func writeImage(w io.Writer, name string, files []file, imageConfig ocispec.ImageConfig) error {
	layerData, err := layerTar(files)
	if err != nil {
		return fmt.Errorf("%s: layer: %w", name, err)
	}
	layer := blob{mediaType: ocispec.MediaTypeImageLayer, data: layerData}

	created := epoch
	platform := ocispec.Platform{OS: "linux", Architecture: runtime.GOARCH}
	configData, err := json.Marshal(ocispec.Image{
		Created:  &created,
		Platform: platform,
		Config:   imageConfig,
		// The layer is uncompressed, so its diff ID is its digest.
		RootFS: ocispec.RootFS{Type: "layers", DiffIDs: []digest.Digest{layer.descriptor().Digest}},
	})
	if err != nil {
		return err
	}
	config := blob{mediaType: ocispec.MediaTypeImageConfig, data: configData}

	manifestData, err := json.Marshal(ocispec.Manifest{
		Versioned: specs.Versioned{SchemaVersion: 2},
		MediaType: ocispec.MediaTypeImageManifest,
		Config:    config.descriptor(),
		Layers:    []ocispec.Descriptor{layer.descriptor()},
	})
	if err != nil {
		return err
	}
	manifest := blob{mediaType: ocispec.MediaTypeImageManifest, data: manifestData}

	manifestDesc := manifest.descriptor()
	manifestDesc.Platform = &platform
	manifestDesc.Annotations = map[string]string{
		containerdImageNameAnnotation: name,
		ocispec.AnnotationRefName:     name[strings.LastIndex(name, ":")+1:],
	}
	indexData, err := json.Marshal(ocispec.Index{
		Versioned: specs.Versioned{SchemaVersion: 2},
		MediaType: ocispec.MediaTypeImageIndex,
		Manifests: []ocispec.Descriptor{manifestDesc},
	})
	if err != nil {
		return err
	}
	layoutData, err := json.Marshal(ocispec.ImageLayout{Version: ocispec.ImageLayoutVersion})
	if err != nil {
		return err
	}

	archive := []file{
		{name: ocispec.ImageLayoutFile, mode: 0o644, typeflag: tar.TypeReg, content: layoutData},
		{name: ocispec.ImageIndexFile, mode: 0o644, typeflag: tar.TypeReg, content: indexData},
		{name: "blobs", mode: 0o755, typeflag: tar.TypeDir},
		{name: "blobs/sha256", mode: 0o755, typeflag: tar.TypeDir},
	}
	for _, b := range []blob{layer, config, manifest} {
		archive = append(archive, file{name: "blobs/sha256/" + b.descriptor().Digest.Encoded(),
			mode: 0o644, typeflag: tar.TypeReg, content: b.data})
	}
	data, err := layerTar(archive)
	if err != nil {
		return fmt.Errorf("%s: archive: %w", name, err)
	}
	_, err = w.Write(data)
	return err
}

// layerTar returns a tar stream of files in path order, with fixed owners and timestamps.
func layerTar(files []file) ([]byte, error) {
	sort.Slice(files, func(i, j int) bool { return files[i].name < files[j].name })
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, f := range files {
		name := f.name
		if f.typeflag == tar.TypeDir {
			name += "/"
		}
		header := &tar.Header{
			Typeflag: f.typeflag,
			Name:     name,
			Linkname: f.linkname,
			Mode:     f.mode,
			Size:     int64(len(f.content)),
			ModTime:  epoch,
		}
		if err := tw.WriteHeader(header); err != nil {
			return nil, fmt.Errorf("%s: %w", f.name, err)
		}
		if _, err := tw.Write(f.content); err != nil {
			return nil, fmt.Errorf("%s: %w", f.name, err)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
