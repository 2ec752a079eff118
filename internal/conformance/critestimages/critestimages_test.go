package critestimages

import (
	"archive/tar"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/knext-dev/knext/internal/ociimage"
)

// dynamicBusybox is where script/ci/install-deps.sh puts Debian's dynamically linked busybox.
const dynamicBusybox = "/usr/local/lib/knext/busybox"

func inputs(t *testing.T) Inputs {
	t.Helper()
	if _, err := os.Stat(dynamicBusybox); err != nil {
		t.Fatalf("%v: run script/ci/install-deps.sh", err)
	}
	dir := t.TempDir()
	in := Inputs{Busybox: dynamicBusybox}
	for name, field := range map[string]*string{"pause": &in.Pause, "nginx": &in.FakeNginx, "nnp": &in.NoNewPrivs} {
		*field = filepath.Join(dir, name)
		if err := os.WriteFile(*field, []byte("binary "+name), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return in
}

// layer returns the entries of a layer by path.
func layer(t *testing.T, files ociimage.Layer) map[string]ociimage.File {
	t.Helper()
	byName := map[string]ociimage.File{}
	for _, f := range files {
		byName[f.Path] = f
	}
	return byName
}

func TestImagesCoverCritestReferences(t *testing.T) {
	images, err := Images(inputs(t))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, image := range images {
		names = append(names, image.Names...)
	}
	// Every reference of critest v1.37.0's Linux specs but the digest-pinned one.
	for _, want := range []string{
		"registry.k8s.io/e2e-test-images/busybox:1.29-2", "registry.k8s.io/e2e-test-images/nginx:1.14-2",
		"registry.k8s.io/e2e-test-images/httpd:2.4.39-4", "registry.k8s.io/e2e-test-images/nonewprivs:1.3",
		"registry.k8s.io/pause:3.10", "registry.k8s.io/pause:3.9", "k8s.gcr.io/pause:3.9",
		"gcr.io/k8s-staging-cri-tools/test-image-user-uid:latest", "gcr.io/k8s-staging-cri-tools/test-image-user-username:latest",
		"gcr.io/k8s-staging-cri-tools/test-image-user-uid-group:latest", "gcr.io/k8s-staging-cri-tools/test-image-user-username-group:latest",
		"gcr.io/k8s-staging-cri-tools/test-image-predefined-group:latest", "gcr.io/k8s-staging-cri-tools/hostnet-nginx-" + runtime.GOARCH + ":latest",
		"gcr.io/k8s-staging-cri-tools/test-image-1:latest", "gcr.io/k8s-staging-cri-tools/test-image-2:latest",
		"gcr.io/k8s-staging-cri-tools/test-image-3:latest", "gcr.io/k8s-staging-cri-tools/test-image-latest:latest",
		"gcr.io/k8s-staging-cri-tools/test-image-tags:1", "gcr.io/k8s-staging-cri-tools/test-image-tags:2",
		"gcr.io/k8s-staging-cri-tools/test-image-tags:3", "gcr.io/k8s-staging-cri-tools/test-image-tag:test",
		"gcr.io/k8s-staging-cri-tools/test-image-tag:all",
	} {
		if !slices.Contains(names, want) {
			t.Errorf("no image named %s", want)
		}
	}

	byName := map[string]ociimage.Image{}
	for _, image := range images {
		byName[image.Names[0]] = image
	}
	users := map[string]string{
		"gcr.io/k8s-staging-cri-tools/test-image-user-uid:latest":            "1002",
		"gcr.io/k8s-staging-cri-tools/test-image-user-username:latest":       "www-data",
		"gcr.io/k8s-staging-cri-tools/test-image-user-uid-group:latest":      "1003:1004",
		"gcr.io/k8s-staging-cri-tools/test-image-user-username-group:latest": "www-data:1004",
		"gcr.io/k8s-staging-cri-tools/test-image-predefined-group:latest":    "1000",
		"registry.k8s.io/pause:3.10":                                         "65535:65535",
	}
	for name, user := range users {
		if got := byName[name].Config.User; got != user {
			t.Errorf("%s: USER %q, want %q", name, got, user)
		}
	}
	if a, b := byName["registry.k8s.io/pause:3.10"].Config.Labels, byName["registry.k8s.io/pause:3.9"].Config.Labels; a["version"] == b["version"] {
		t.Errorf("pause 3.10 and 3.9 have the same labels %v: they would be one image", a)
	}
	nnp := layer(t, byName["registry.k8s.io/e2e-test-images/nonewprivs:1.3"].Layers[1])["usr/local/bin/nnp"]
	if nnp.Mode != 0o4755 {
		t.Errorf("nnp mode %o, want 4755 (setuid root)", nnp.Mode)
	}
	group := layer(t, byName["gcr.io/k8s-staging-cri-tools/test-image-predefined-group:latest"].Layers[1])["etc/group"]
	if !strings.Contains(string(group.Content), "group-defined-in-image:x:50000:default-user\n") {
		t.Errorf("predefined-group image's /etc/group lacks default-user in gid 50000:\n%s", group.Content)
	}
}

func TestBaseLayerHasHardLinkedAppletsAndLibraries(t *testing.T) {
	base, err := BusyboxLayer(inputs(t).Busybox)
	if err != nil {
		t.Fatal(err)
	}
	files := layer(t, base)
	for _, applet := range []string{"bin/sh", "bin/ls", "bin/sleep", "bin/top", "bin/brctl", "bin/httpd"} {
		if f := files[applet]; f.Type != tar.TypeLink || f.Target != "bin/busybox" {
			t.Errorf("%s: type %c link %q, want a hard link to bin/busybox", applet, f.Type, f.Target)
		}
	}
	for _, f := range base {
		if f.Type == tar.TypeSymlink && !strings.HasPrefix(f.Target, "/lib") {
			t.Errorf("%s is a symlink to %s: masking it would mask its target", f.Path, f.Target)
		}
	}
	for _, script := range []string{"bin/pgrep", "bin/ipcs"} {
		if f := files[script]; f.Type != tar.TypeReg || !strings.HasPrefix(string(f.Content), "#!/bin/sh\n") {
			t.Errorf("%s is not a shell script", script)
		}
	}
	if f := files["tmp"]; f.Mode != 0o1777 {
		t.Errorf("tmp mode %o, want 1777", f.Mode)
	}
}

// TestBaseLayerRuns unpacks the base layer and runs its shell and scripts chrooted in it: the
// libraries resolve, the applets are there, and pgrep and ipcs answer as critest expects.
func TestBaseLayerRuns(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("chroot needs root")
	}
	base, err := BusyboxLayer(inputs(t).Busybox)
	if err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	if err := unpack(base, root); err != nil {
		t.Fatal(err)
	}
	run := func(script string) string {
		t.Helper()
		cmd := exec.Command("/bin/sh", "-c", script)
		cmd.SysProcAttr = &syscall.SysProcAttr{Chroot: root}
		cmd.Dir = "/"
		cmd.Env = []string{ociimage.DefaultPath}
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%q in the base layer: %v\n%s", script, err, out)
		}
		return string(out)
	}
	if got := run("id -un; ls /bin/ls"); got != "root\n/bin/ls\n" {
		t.Errorf("id and ls printed %q", got)
	}
	// No /proc in the chroot: pgrep finds nothing and says so by its status.
	if got := run("pgrep sleep || echo none"); got != "none\n" {
		t.Errorf("pgrep without processes printed %q, want none", got)
	}
}

// unpack writes the files of a layer under root: directories first, hard links last.
func unpack(files ociimage.Layer, root string) error {
	ordered := slices.Clone(files)
	slices.SortStableFunc(ordered, func(a, b ociimage.File) int {
		rank := func(f ociimage.File) int {
			switch f.Type {
			case tar.TypeDir:
				return 0
			case tar.TypeLink:
				return 2
			}
			return 1
		}
		if d := rank(a) - rank(b); d != 0 {
			return d
		}
		return strings.Compare(a.Path, b.Path)
	})
	for _, f := range ordered {
		path := filepath.Join(root, f.Path)
		var err error
		switch f.Type {
		case tar.TypeDir:
			err = os.MkdirAll(path, os.FileMode(f.Mode&0o777)|os.ModeDir)
		case tar.TypeReg:
			err = os.WriteFile(path, f.Content, os.FileMode(f.Mode&0o777))
		case tar.TypeSymlink:
			err = os.Symlink(f.Target, path)
		case tar.TypeLink:
			err = os.Link(filepath.Join(root, f.Target), path)
		}
		if err != nil {
			return err
		}
	}
	return nil
}
