package e2eimages

import (
	"archive/tar"
	"bytes"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"testing"

	"github.com/knext-dev/knext/internal/ociimage"
)

// listImages is part of what `e2e.test --list-images` of Kubernetes v1.37.2 prints.
var listImages = []string{
	"registry.k8s.io/e2e-test-images/agnhost:2.55",
	"registry.k8s.io/e2e-test-images/agnhost:2.66.1",
	"gcr.io/k8s-authenticated-test/agnhost:2.6",
	"registry.k8s.io/e2e-test-images/busybox:1.37.0-2",
	"registry.k8s.io/e2e-test-images/glibc-dns-testing:2.1.1",
	"invalid.registry.k8s.io/invalid/alpine:3.1",
	"registry.k8s.io/e2e-test-images/nginx:1.27.0-2",
	"registry.k8s.io/e2e-test-images/nginx:1.28.0-2",
	"registry.k8s.io/pause:3.10.2",
	"registry.k8s.io/e2e-test-images/resource-consumer:1.14",
}

// inputs writes stand-ins for the binaries, porter's certificate and key, and a root file system
// tar archive.
func inputs(t *testing.T) Inputs {
	t.Helper()
	dir := t.TempDir()
	write := func(path, content string, mode os.FileMode) string {
		path = filepath.Join(dir, path)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(content), mode); err != nil {
			t.Fatal(err)
		}
		return path
	}
	var rootfs bytes.Buffer
	tw := tar.NewWriter(&rootfs)
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: "./usr/bin/dig", Mode: 0o755, Size: 3}); err != nil {
		t.Fatal(err)
	}
	if _, err := tw.Write([]byte("dig")); err != nil {
		t.Fatal(err)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	write("agnhost-source/porter/localhost.crt", "certificate", 0o644)
	write("agnhost-source/porter/localhost.key", "key", 0o644)
	return Inputs{
		RootFS:        write("rootfs.tar", rootfs.String(), 0o644),
		Agnhost:       write("agnhost", "agnhost binary", 0o755),
		AgnhostSource: filepath.Join(dir, "agnhost-source"),
		CoreDNS:       write("coredns", "coredns binary", 0o755),
		Pause:         write("pause", "pause binary", 0o755),
		Busybox:       "/bin/busybox",
	}
}

func files(layers []ociimage.Layer) map[string]ociimage.File {
	byPath := map[string]ociimage.File{}
	for _, layer := range layers {
		for _, f := range layer {
			byPath[f.Path] = f
		}
	}
	return byPath
}

func TestImagesUnderTheSuitesNames(t *testing.T) {
	images, left, err := Images(inputs(t), listImages)
	if err != nil {
		t.Fatal(err)
	}
	byRepository := map[string]ociimage.Image{}
	for _, image := range images {
		byRepository[image.Names[0]] = image
	}
	// Every tag of a repository names one image.
	agnhost, ok := byRepository["registry.k8s.io/e2e-test-images/agnhost:2.55"]
	if !ok || !slices.Equal(agnhost.Names, []string{"registry.k8s.io/e2e-test-images/agnhost:2.55", "registry.k8s.io/e2e-test-images/agnhost:2.66.1"}) {
		t.Errorf("agnhost names %q, want both of the suite's tags", agnhost.Names)
	}
	if nginx := byRepository["registry.k8s.io/e2e-test-images/nginx:1.27.0-2"]; len(nginx.Names) != 2 {
		t.Errorf("nginx names %q, want both of the suite's tags", nginx.Names)
	}
	for _, name := range []string{"registry.k8s.io/e2e-test-images/busybox:1.37.0-2", "registry.k8s.io/e2e-test-images/glibc-dns-testing:2.1.1", "registry.k8s.io/pause:3.10.2"} {
		if _, ok := byRepository[name]; !ok {
			t.Errorf("no image named %s", name)
		}
	}
	// What must not be pullable (a private registry, an invalid one) and the images of other
	// SIGs' specs are left out.
	if want := []string{"gcr.io/k8s-authenticated-test/agnhost:2.6", "invalid.registry.k8s.io/invalid/alpine:3.1",
		"registry.k8s.io/e2e-test-images/resource-consumer:1.14"}; !slices.Equal(left, want) {
		t.Errorf("left out %q, want %q", left, want)
	}

	// agnhost as upstream's Dockerfile lays it out, on the root file system.
	content := files(agnhost.Layers)
	for path, want := range map[string]string{"agnhost": "agnhost binary", "coredns": "coredns binary",
		"localhost.crt": "certificate", "localhost.key": "key"} {
		if string(content[path].Content) != want {
			t.Errorf("agnhost: /%s holds %q, want %q", path, content[path].Content, want)
		}
	}
	if f := content["agnhost"]; f.Mode != 0o755 {
		t.Errorf("agnhost: /agnhost has mode %o, want 755", f.Mode)
	}
	if f := content["agnhost-2"]; f.Type != tar.TypeSymlink || f.Target != "agnhost" {
		t.Errorf("agnhost: /agnhost-2 is %+v, want a link to agnhost", f)
	}
	if f := content["uploads"]; f.Type != tar.TypeDir {
		t.Errorf("agnhost: /uploads is %+v, want a directory", f)
	}
	if c := agnhost.Config; !slices.Equal(c.Entrypoint, []string{"/agnhost"}) || !slices.Equal(c.Cmd, []string{"pause"}) ||
		!slices.Contains(c.Env, ociimage.DefaultPath) {
		t.Errorf("agnhost config %+v, want entrypoint /agnhost, command pause and PATH", c)
	}

	// The Debian images share one root file system layer, and agnhost and glibc-dns-testing an
	// identical layer of /coredns: the archive stores each once.
	glibc := byRepository["registry.k8s.io/e2e-test-images/glibc-dns-testing:2.1.1"]
	nginx := byRepository["registry.k8s.io/e2e-test-images/nginx:1.27.0-2"]
	if agnhost.RootFS == nil || glibc.RootFS != agnhost.RootFS || nginx.RootFS != agnhost.RootFS {
		t.Error("agnhost, glibc-dns-testing and nginx do not share the root file system layer")
	}
	rootfs, err := os.ReadFile(inputs(t).RootFS)
	if err != nil {
		t.Fatal(err)
	}
	data, err := agnhost.RootFS.Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer data.Close()
	if got, err := io.ReadAll(data); err != nil || !bytes.Equal(got, rootfs) {
		t.Errorf("the root file system layer differs from the archive mmdebstrap wrote (%v)", err)
	}
	if !slices.Equal(glibc.Config.Cmd, []string{"bash"}) || len(glibc.Layers) != 1 || !reflect.DeepEqual(glibc.Layers[0], agnhost.Layers[0]) ||
		string(files(glibc.Layers)["coredns"].Content) != "coredns binary" {
		t.Errorf("glibc-dns-testing: config %+v, layers %+v; want bash and agnhost's layer of /coredns", glibc.Config, glibc.Layers)
	}
	if !slices.Equal(nginx.Config.Cmd, []string{"nginx", "-g", "daemon off;"}) || len(nginx.Layers) != 0 {
		t.Errorf("nginx: config %+v, layers %+v; want Debian's nginx in the foreground, nothing added", nginx.Config, nginx.Layers)
	}

	// The whole set makes one archive that names every image.
	archive := filepath.Join(t.TempDir(), "e2e-images.tar")
	if err := ociimage.WriteArchiveFile(archive, images...); err != nil {
		t.Fatal(err)
	}
	names, err := ociimage.ImageNames(archive)
	if err != nil || len(names) != 7 {
		t.Errorf("archive names %q, %v; want the 7 rebuilt names", names, err)
	}
}

func TestImagesNameTheMissingInput(t *testing.T) {
	in := inputs(t)
	in.RootFS = filepath.Join(t.TempDir(), "missing.tar")
	if _, _, err := Images(in, listImages); err == nil {
		t.Error("a missing root file system was not reported")
	}
	if _, _, err := Images(inputs(t), []string{"agnhost"}); err == nil {
		t.Error("a name without host and tag was accepted")
	}
}
