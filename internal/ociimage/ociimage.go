// Package ociimage declares container images and writes them, with go-containerregistry, as
// OCI image-layout archives that `ctr -n k8s.io images import` accepts under their names; no
// registry is ever contacted.
//
// An image is a value: its names, its layers (files, directories, symlinks and hard links with
// their modes and owners) and its configuration. For example, on top of knext's busybox:
//
//	busybox, err := images.Busybox("/bin/busybox")
//	...
//	image := images.Image{
//		Names: []string{"knext.local/volume-owner:1"},
//		Layers: append(busybox.Layers, images.Layer{
//			images.Dir("data", 0o750).Owner(1000, 1000),
//			images.RegularFile("data/hello", 0o640, []byte("hello\n")).Owner(1000, 1000),
//			images.Symlink("hello", "/data/hello"),
//		}),
//		Config: v1.Config{User: "1000", WorkingDir: "/data", Volumes: map[string]struct{}{"/data": {}},
//			Env: []string{images.DefaultPath}, Cmd: []string{"cat", "hello"}},
//	}
//	err = images.WriteArchiveFile("volume-owner.tar", image)
//
// Image.Digest gives the digest a by-digest reference (host/repository@sha256:...) names.
//
// knext's own images (linux, the build machine's architecture):
//
//   - knext.local/pause:3.10 (archive pause.tar): the static Go program of internal/ociimage/pause as
//     /pause, entrypoint ["/pause"]. It is the CRI sandbox image of every knext test and demo.
//   - knext.local/busybox:1.35 (archive busybox.tar): Debian 12's /bin/busybox (package
//     busybox-static) with one symlink per applet at the path `busybox --list-full` names, a
//     minimal /etc/passwd and /etc/group, command ["sh"].
//   - knext.local/nri-bridge:<knext version> (archive nri-bridge.tar): a static nri-bridge as
//     /usr/local/bin/nri-bridge, its entrypoint; the image of deploy/nri-bridge's manifests.
//
// Layers are uncompressed, and every timestamp is Epoch, so the same inputs always give
// byte-identical archives.
package ociimage

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"
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

	// ImageNameAnnotation names an image in an archive's index: containerd's importer reads the
	// full name from it (org.opencontainers.image.ref.name holds only the tag).
	ImageNameAnnotation = "io.containerd.image.name"

	// DefaultPath is the PATH of every test image.
	DefaultPath = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
)

// epoch is the time of every file, layer and image configuration.
var epoch = time.Unix(0, 0).UTC()

// File is one entry of a layer; RegularFile, Dir, Symlink and Hardlink make them.
type File struct {
	Path     string // inside the root file system, relative ("bin/sh")
	Type     byte   // tar.TypeReg, tar.TypeDir, tar.TypeSymlink or tar.TypeLink
	Mode     int64  // permission bits, setuid, setgid and sticky included
	UID, GID int
	Content  []byte // of a regular file
	Target   string // a symlink's target; a hard link's linked file (relative, "bin/busybox")
}

// RegularFile is a regular file owned by root.
func RegularFile(path string, mode int64, content []byte) File {
	return File{Path: path, Type: tar.TypeReg, Mode: mode, Content: content}
}

// Dir is a directory owned by root.
func Dir(path string, mode int64) File {
	return File{Path: path, Type: tar.TypeDir, Mode: mode}
}

// Symlink is a symbolic link at path to target, owned by root.
func Symlink(path, target string) File {
	return File{Path: path, Type: tar.TypeSymlink, Mode: 0o777, Target: target}
}

// Hardlink is a hard link at path to target, a regular file of the same layer.
func Hardlink(path, target string) File {
	return File{Path: path, Type: tar.TypeLink, Mode: 0o755, Target: target}
}

// Owner returns f owned by uid:gid.
func (f File) Owner(uid, gid int) File {
	f.UID, f.GID = uid, gid
	return f
}

// Layer is one file system layer of an image.
type Layer []File

// WithParents returns the layer with a directory (0755, root) for each parent it does not list.
func (l Layer) WithParents() Layer {
	listed := map[string]bool{}
	for _, f := range l {
		listed[f.Path] = true
	}
	out := slices.Clone(l)
	for _, f := range l {
		for dir := path.Dir(f.Path); dir != "." && dir != "/" && !listed[dir]; dir = path.Dir(dir) {
			listed[dir] = true
			out = append(out, Dir(dir, 0o755))
		}
	}
	return out
}

// Image is a container image for linux and the build machine's architecture.
type Image struct {
	// Names are full references (host/repository:tag); an archive's index has one entry for
	// each, all pointing to the same manifest.
	Names []string
	// RootFS, if set, is the bottom layer as another tool wrote it: a root file system such as a
	// Debian one mmdebstrap made (TarLayer).
	RootFS v1.Layer
	Layers []Layer // bottom layer first, above RootFS
	// Config is what runs: Entrypoint, Cmd, Env, User, WorkingDir, Volumes, ExposedPorts,
	// Labels, ArgsEscaped.
	Config v1.Config
}

// Digest returns the digest of the image's manifest: what a by-digest reference
// (host/repository@sha256:...) to the image names.
func (image Image) Digest() (v1.Hash, error) {
	img, err := image.build()
	if err != nil {
		return v1.Hash{}, err
	}
	return img.Digest()
}

// build returns the image as go-containerregistry's v1.Image: OCI media types, uncompressed
// layers, Epoch times.
func (image Image) build() (v1.Image, error) {
	img := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	var adds []mutate.Addendum
	if image.RootFS != nil {
		adds = append(adds, mutate.Addendum{Layer: image.RootFS, History: v1.History{Created: v1.Time{Time: epoch}}})
	}
	for i, files := range image.Layers {
		data, err := layerTar(files)
		if err != nil {
			return nil, fmt.Errorf("layer %d: %w", i, err)
		}
		adds = append(adds, mutate.Addendum{
			Layer:   static.NewLayer(data, types.OCIUncompressedLayer),
			History: v1.History{Created: v1.Time{Time: epoch}},
		})
	}
	img, err := mutate.Append(img, adds...)
	if err != nil {
		return nil, err
	}
	configFile, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	configFile = configFile.DeepCopy()
	configFile.OS, configFile.Architecture = "linux", runtime.GOARCH
	configFile.Created = v1.Time{Time: epoch}
	configFile.Config = image.Config
	return mutate.ConfigFile(img, configFile)
}

// TarLayer is the uncompressed layer holding the tar stream in file archive as it is.
func TarLayer(archive string) (v1.Layer, error) {
	data, err := os.ReadFile(archive)
	if err != nil {
		return nil, err
	}
	if _, err := tar.NewReader(bytes.NewReader(data)).Next(); err != nil {
		return nil, fmt.Errorf("%s is not a tar archive: %w", archive, err)
	}
	return static.NewLayer(data, types.OCIUncompressedLayer), nil
}

// Pause is knext's pause image, with pauseBinary (a static executable) as /pause.
func Pause(pauseBinary string) (Image, error) {
	binary, err := os.ReadFile(pauseBinary)
	if err != nil {
		return Image{}, fmt.Errorf("pause image: %w", err)
	}
	return Image{
		Names:  []string{PauseImage},
		Layers: []Layer{{RegularFile("pause", 0o755, binary)}},
		Config: v1.Config{Env: []string{DefaultPath}, Entrypoint: []string{"/pause"}},
	}, nil
}

// Busybox is knext's busybox image, made of busyboxBinary, a statically linked busybox.
func Busybox(busyboxBinary string) (Image, error) {
	binary, err := os.ReadFile(busyboxBinary)
	if err != nil {
		return Image{}, fmt.Errorf("busybox image: %w", err)
	}
	applets, err := BusyboxApplets(busyboxBinary)
	if err != nil {
		return Image{}, fmt.Errorf("busybox image: %w", err)
	}
	layer := Layer{
		Dir("dev", 0o755), Dir("proc", 0o755), Dir("root", 0o700), Dir("sys", 0o755), Dir("tmp", 0o1777),
		Dir("var", 0o755),
		RegularFile("bin/busybox", 0o755, binary),
		RegularFile("etc/passwd", 0o644,
			[]byte("root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n")),
		RegularFile("etc/group", 0o644, []byte("root:x:0:\nnogroup:x:65534:\n")),
	}
	for _, applet := range applets {
		layer = append(layer, Symlink(applet, "/bin/busybox"))
	}
	return Image{
		Names:  []string{BusyboxImage},
		Layers: []Layer{layer.WithParents()},
		Config: v1.Config{Env: []string{DefaultPath}, Cmd: []string{"sh"}},
	}, nil
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

// NRIBridge is nri-bridge's image named name (NRIBridgeRepository:<tag>) with nriBridgeBinary, a
// static executable, as /usr/local/bin/nri-bridge.
func NRIBridge(name, nriBridgeBinary string) (Image, error) {
	if !strings.HasPrefix(name, NRIBridgeRepository+":") {
		return Image{}, fmt.Errorf("nri-bridge image: name %q is not %s:<tag>", name, NRIBridgeRepository)
	}
	return Binary(name, "nri-bridge", nriBridgeBinary)
}

// Binary is the image named name holding only binary, a static executable, as
// /usr/local/bin/<command>, its entrypoint.
func Binary(name, command, binary string) (Image, error) {
	content, err := os.ReadFile(binary)
	if err != nil {
		return Image{}, fmt.Errorf("image %s: %w", name, err)
	}
	return Image{
		Names:  []string{name},
		Layers: []Layer{Layer{RegularFile("usr/local/bin/"+command, 0o755, content)}.WithParents()},
		Config: v1.Config{Env: []string{DefaultPath}, Entrypoint: []string{"/usr/local/bin/" + command}},
	}, nil
}

// WriteArchiveFile replaces file archive (and creates its directory) with the archive of
// images, atomically: an interrupted run never leaves a truncated archive behind.
func WriteArchiveFile(archive string, images ...Image) error {
	if err := os.MkdirAll(filepath.Dir(archive), 0o755); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(archive), filepath.Base(archive)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if err := WriteArchive(tmp, images...); err != nil {
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
	return os.Rename(tmp.Name(), archive)
}

// WriteArchive writes a tar archive of the OCI image layout holding images. A blob shared by
// several images (a common base layer) is stored once.
func WriteArchive(w io.Writer, images ...Image) error {
	var manifests []mutate.IndexAddendum
	platform := &v1.Platform{OS: "linux", Architecture: runtime.GOARCH}
	for _, image := range images {
		if len(image.Names) == 0 {
			return errors.New("image without a name")
		}
		img, err := image.build()
		if err != nil {
			return fmt.Errorf("%s: %w", image.Names[0], err)
		}
		for _, imageName := range image.Names {
			tag, err := name.NewTag(imageName, name.StrictValidation)
			if err != nil {
				return fmt.Errorf("image name %q is not host/repository:tag: %w", imageName, err)
			}
			manifests = append(manifests, mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{
				Platform: platform,
				Annotations: map[string]string{
					ImageNameAnnotation:       imageName,
					ocispec.AnnotationRefName: tag.TagStr(),
				},
			}})
		}
	}
	dir, err := os.MkdirTemp("", "knext-image-layout-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	if _, err := layout.Write(dir, mutate.AppendManifests(empty.Index, manifests...)); err != nil {
		return err
	}
	return tarDirectory(w, dir)
}

// tarDirectory writes the files under dir as a tar stream (layerTar's fixed order, owners and
// times).
func tarDirectory(w io.Writer, dir string) error {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return err
	}
	defer root.Close()
	tree := root.FS()
	var files Layer
	err = fs.WalkDir(tree, ".", func(name string, entry fs.DirEntry, err error) error {
		switch {
		case err != nil || name == ".":
			return err
		case entry.IsDir():
			files = append(files, Dir(name, 0o755))
			return nil
		}
		content, err := fs.ReadFile(tree, name)
		files = append(files, RegularFile(name, 0o644, content))
		return err
	})
	if err != nil {
		return err
	}
	data, err := layerTar(files)
	if err != nil {
		return err
	}
	_, err = w.Write(data)
	return err
}

// ImageName returns the name of the image in archive, an archive of one image this package wrote.
func ImageName(archive string) (string, error) {
	names, err := ImageNames(archive)
	if err != nil {
		return "", err
	}
	if len(names) != 1 {
		return "", fmt.Errorf("%s: want one named image, the archive has %q", archive, names)
	}
	return names[0], nil
}

// ImageNames returns the name of every image in archive, an archive this package wrote, in the
// order of its index.
func ImageNames(archive string) ([]string, error) {
	f, err := os.Open(archive)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		header, err := tr.Next()
		if err == io.EOF {
			return nil, fmt.Errorf("%s: no %s", archive, ocispec.ImageIndexFile)
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", archive, err)
		}
		if header.Name != ocispec.ImageIndexFile {
			continue
		}
		index, err := v1.ParseIndexManifest(tr)
		if err != nil {
			return nil, fmt.Errorf("%s: %s: %w", archive, ocispec.ImageIndexFile, err)
		}
		var names []string
		for _, manifest := range index.Manifests {
			name := manifest.Annotations[ImageNameAnnotation]
			if name == "" {
				return nil, fmt.Errorf("%s: an image of the index has no name: %+v", archive, manifest)
			}
			names = append(names, name)
		}
		if len(names) == 0 {
			return nil, fmt.Errorf("%s: the index lists no image", archive)
		}
		return names, nil
	}
}

// layerTar returns a tar stream of files in path order, hard links last (their targets must
// come first), with Epoch times.
func layerTar(files Layer) ([]byte, error) {
	files = slices.Clone(files)
	slices.SortFunc(files, func(a, b File) int {
		if aLink, bLink := a.Type == tar.TypeLink, b.Type == tar.TypeLink; aLink != bLink {
			if aLink {
				return 1
			}
			return -1
		}
		return strings.Compare(a.Path, b.Path)
	})
	seen := map[string]bool{}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, f := range files {
		if !fs.ValidPath(f.Path) {
			return nil, fmt.Errorf("%s: not a relative path without . or .. elements", f.Path)
		}
		if seen[f.Path] {
			return nil, fmt.Errorf("%s: defined twice", f.Path)
		}
		seen[f.Path] = true
		name := f.Path
		if f.Type == tar.TypeDir {
			name += "/"
		}
		header := &tar.Header{
			Typeflag: f.Type,
			Name:     name,
			Linkname: f.Target,
			Mode:     f.Mode,
			Uid:      f.UID,
			Gid:      f.GID,
			Size:     int64(len(f.Content)),
			ModTime:  epoch,
		}
		if err := tw.WriteHeader(header); err != nil {
			return nil, fmt.Errorf("%s: %w", f.Path, err)
		}
		if _, err := tw.Write(f.Content); err != nil {
			return nil, fmt.Errorf("%s: %w", f.Path, err)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
