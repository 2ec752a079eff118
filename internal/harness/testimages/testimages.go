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
// same input binaries always give byte-identical archives. WriteArchive writes archives of other
// image sets (several images, names and layers) the same way.
package testimages

import (
	"archive/tar"
	"bytes"
	_ "crypto/sha256" // registers the digest algorithm go-digest uses
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"runtime"
	"slices"
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

	// DefaultPath is the PATH of every test image.
	DefaultPath = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
)

// epoch is the modification time of every file and of the image configuration.
var epoch = time.Unix(0, 0).UTC()

// File is one entry of an image layer. Owners are always root and times always Epoch.
type File struct {
	Name     string // path inside the rootfs, relative ("bin/sh")
	Mode     int64  // permission bits, setuid, setgid and sticky included
	Type     byte   // tar.TypeReg, tar.TypeDir, tar.TypeSymlink or tar.TypeLink (hard link)
	Content  []byte // of a regular file
	Linkname string // a symlink's target; a hard link's linked file (relative, "bin/busybox")
}

// Image is one image of an archive.
type Image struct {
	// Names are full references (host/repository:tag); each one is an entry of the archive's
	// index, all pointing to the same manifest.
	Names  []string
	Layers [][]File // bottom layer first
	Config ocispec.ImageConfig
}

// WritePause writes the pause image archive, with pauseBinary (a static executable) as /pause.
func WritePause(w io.Writer, pauseBinary string) error {
	binary, err := os.ReadFile(pauseBinary)
	if err != nil {
		return fmt.Errorf("pause image: %w", err)
	}
	files := []File{{Name: "pause", Mode: 0o755, Type: tar.TypeReg, Content: binary}}
	config := ocispec.ImageConfig{Env: []string{DefaultPath}, Entrypoint: []string{"/pause"}}
	return WriteArchive(w, Image{Names: []string{PauseImage}, Layers: [][]File{files}, Config: config})
}

// WriteBusybox writes the busybox image archive from busyboxBinary, a statically linked busybox.
func WriteBusybox(w io.Writer, busyboxBinary string) error {
	binary, err := os.ReadFile(busyboxBinary)
	if err != nil {
		return fmt.Errorf("busybox image: %w", err)
	}
	applets, err := BusyboxApplets(busyboxBinary)
	if err != nil {
		return fmt.Errorf("busybox image: %w", err)
	}

	dirs := map[string]int64{"bin": 0o755, "dev": 0o755, "etc": 0o755, "proc": 0o755, "root": 0o700,
		"sbin": 0o755, "sys": 0o755, "tmp": 0o1777, "usr": 0o755, "usr/bin": 0o755, "usr/sbin": 0o755,
		"var": 0o755}
	files := []File{
		{Name: "bin/busybox", Mode: 0o755, Type: tar.TypeReg, Content: binary},
		{Name: "etc/passwd", Mode: 0o644, Type: tar.TypeReg,
			Content: []byte("root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n")},
		{Name: "etc/group", Mode: 0o644, Type: tar.TypeReg, Content: []byte("root:x:0:\nnogroup:x:65534:\n")},
	}
	for _, applet := range applets {
		for dir := path.Dir(applet); dir != "."; dir = path.Dir(dir) {
			if _, ok := dirs[dir]; !ok {
				dirs[dir] = 0o755
			}
		}
		files = append(files, File{Name: applet, Mode: 0o777, Type: tar.TypeSymlink, Linkname: "/bin/busybox"})
	}
	for dir, mode := range dirs {
		files = append(files, File{Name: dir, Mode: mode, Type: tar.TypeDir})
	}
	config := ocispec.ImageConfig{Env: []string{DefaultPath}, Cmd: []string{"sh"}}
	return WriteArchive(w, Image{Names: []string{BusyboxImage}, Layers: [][]File{files}, Config: config})
}

// BusyboxApplets returns where busyboxBinary puts each of its applets (`busybox --list-full`:
// "bin/sh", "usr/bin/wc", ...), without the binary itself and root-level oddities such as linuxrc.
func BusyboxApplets(busyboxBinary string) ([]string, error) {
	list, err := exec.Command(busyboxBinary, "--list-full").Output()
	if err != nil {
		return nil, fmt.Errorf("%s --list-full: %w", busyboxBinary, err)
	}
	var applets []string
	for applet := range strings.FieldsSeq(string(list)) {
		if applet != "bin/busybox" && strings.Contains(applet, "/") {
			applets = append(applets, applet)
		}
	}
	return applets, nil
}

// WriteFile replaces file name (and creates its directory) with what write writes, atomically:
// an interrupted run never leaves a truncated archive behind.
func WriteFile(name string, write func(io.Writer) error) error {
	if err := os.MkdirAll(filepath.Dir(name), 0o755); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(name), filepath.Base(name)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if err := write(tmp); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(0o644); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), name)
}

// WriteNRIBridge writes nri-bridge's image named name (NRIBridgeRepository:<tag>) with
// nriBridgeBinary, a static executable, as /usr/local/bin/nri-bridge.
func WriteNRIBridge(w io.Writer, name, nriBridgeBinary string) error {
	if !strings.HasPrefix(name, NRIBridgeRepository+":") {
		return fmt.Errorf("nri-bridge image: name %q is not %s:<tag>", name, NRIBridgeRepository)
	}
	return WriteBinaryImage(w, name, "nri-bridge", nriBridgeBinary)
}

// WriteBinaryImage writes the image named name holding only binary, a static executable, as
// /usr/local/bin/<command>, its entrypoint.
func WriteBinaryImage(w io.Writer, name, command, binary string) error {
	content, err := os.ReadFile(binary)
	if err != nil {
		return fmt.Errorf("image %s: %w", name, err)
	}
	files := []File{
		{Name: "usr", Mode: 0o755, Type: tar.TypeDir},
		{Name: "usr/local", Mode: 0o755, Type: tar.TypeDir},
		{Name: "usr/local/bin", Mode: 0o755, Type: tar.TypeDir},
		{Name: "usr/local/bin/" + command, Mode: 0o755, Type: tar.TypeReg, Content: content},
	}
	config := ocispec.ImageConfig{Env: []string{DefaultPath}, Entrypoint: []string{"/usr/local/bin/" + command}}
	return WriteArchive(w, Image{Names: []string{name}, Layers: [][]File{files}, Config: config})
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

// WriteArchive writes an OCI image layout archive holding images, for the build machine's
// architecture, with uncompressed layers. A blob shared by several images (a common base
// layer) is stored once. The same input always gives the same bytes.
func WriteArchive(w io.Writer, images ...Image) error {
	var index []ocispec.Descriptor
	blobs := map[digest.Digest]blob{}
	for _, image := range images {
		if len(image.Names) == 0 {
			return errors.New("image without a name")
		}
		manifest, err := imageBlobs(image, blobs)
		if err != nil {
			return fmt.Errorf("%s: %w", image.Names[0], err)
		}
		for _, name := range image.Names {
			desc := manifest.descriptor()
			desc.Platform = &ocispec.Platform{OS: "linux", Architecture: runtime.GOARCH}
			desc.Annotations = map[string]string{
				containerdImageNameAnnotation: name,
				ocispec.AnnotationRefName:     name[strings.LastIndex(name, ":")+1:],
			}
			index = append(index, desc)
		}
	}
	indexData, err := json.Marshal(ocispec.Index{
		Versioned: specs.Versioned{SchemaVersion: 2},
		MediaType: ocispec.MediaTypeImageIndex,
		Manifests: index,
	})
	if err != nil {
		return err
	}
	layoutData, err := json.Marshal(ocispec.ImageLayout{Version: ocispec.ImageLayoutVersion})
	if err != nil {
		return err
	}

	archive := []File{
		{Name: ocispec.ImageLayoutFile, Mode: 0o644, Type: tar.TypeReg, Content: layoutData},
		{Name: ocispec.ImageIndexFile, Mode: 0o644, Type: tar.TypeReg, Content: indexData},
		{Name: "blobs", Mode: 0o755, Type: tar.TypeDir},
		{Name: "blobs/sha256", Mode: 0o755, Type: tar.TypeDir},
	}
	for d, b := range blobs {
		archive = append(archive, File{Name: "blobs/sha256/" + d.Encoded(), Mode: 0o644, Type: tar.TypeReg, Content: b.data})
	}
	data, err := layerTar(archive)
	if err != nil {
		return fmt.Errorf("archive: %w", err)
	}
	_, err = w.Write(data)
	return err
}

// imageBlobs adds the layers, configuration and manifest of image to blobs and returns the
// manifest.
func imageBlobs(image Image, blobs map[digest.Digest]blob) (blob, error) {
	add := func(b blob) ocispec.Descriptor {
		desc := b.descriptor()
		blobs[desc.Digest] = b
		return desc
	}
	var layers []ocispec.Descriptor
	var diffIDs []digest.Digest
	for i, files := range image.Layers {
		data, err := layerTar(files)
		if err != nil {
			return blob{}, fmt.Errorf("layer %d: %w", i, err)
		}
		desc := add(blob{mediaType: ocispec.MediaTypeImageLayer, data: data})
		layers = append(layers, desc)
		// The layers are uncompressed, so a diff ID is the layer's digest.
		diffIDs = append(diffIDs, desc.Digest)
	}
	created := epoch
	configData, err := json.Marshal(ocispec.Image{
		Created:  &created,
		Platform: ocispec.Platform{OS: "linux", Architecture: runtime.GOARCH},
		Config:   image.Config,
		RootFS:   ocispec.RootFS{Type: "layers", DiffIDs: diffIDs},
	})
	if err != nil {
		return blob{}, err
	}
	manifestData, err := json.Marshal(ocispec.Manifest{
		Versioned: specs.Versioned{SchemaVersion: 2},
		MediaType: ocispec.MediaTypeImageManifest,
		Config:    add(blob{mediaType: ocispec.MediaTypeImageConfig, data: configData}),
		Layers:    layers,
	})
	if err != nil {
		return blob{}, err
	}
	manifest := blob{mediaType: ocispec.MediaTypeImageManifest, data: manifestData}
	add(manifest)
	return manifest, nil
}

// layerTar returns a tar stream of files in path order, hard links last (their targets must
// come first), with fixed owners and timestamps.
func layerTar(files []File) ([]byte, error) {
	files = slices.Clone(files)
	sort.Slice(files, func(i, j int) bool {
		if li, lj := files[i].Type == tar.TypeLink, files[j].Type == tar.TypeLink; li != lj {
			return lj
		}
		return files[i].Name < files[j].Name
	})
	seen := map[string]bool{}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, f := range files {
		if seen[f.Name] {
			return nil, fmt.Errorf("%s: defined twice", f.Name)
		}
		seen[f.Name] = true
		name := f.Name
		if f.Type == tar.TypeDir {
			name += "/"
		}
		header := &tar.Header{
			Typeflag: f.Type,
			Name:     name,
			Linkname: f.Linkname,
			Mode:     f.Mode,
			Size:     int64(len(f.Content)),
			ModTime:  epoch,
		}
		if err := tw.WriteHeader(header); err != nil {
			return nil, fmt.Errorf("%s: %w", f.Name, err)
		}
		if _, err := tw.Write(f.Content); err != nil {
			return nil, fmt.Errorf("%s: %w", f.Name, err)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
