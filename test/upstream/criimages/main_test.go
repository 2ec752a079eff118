package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/knext-dev/knext/internal/ociimage"
)

// fakeBinaries writes stand-ins for the static binaries the images carry.
func fakeBinaries(t *testing.T) (pause, stress, nginx string) {
	t.Helper()
	dir := t.TempDir()
	paths := []string{filepath.Join(dir, "pause"), filepath.Join(dir, "stress"), filepath.Join(dir, "nginx")}
	for _, p := range paths {
		if err := os.WriteFile(p, []byte("binary "+filepath.Base(p)), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return paths[0], paths[1], paths[2]
}

// file returns the last entry for path in the image's layers: what the container sees.
func file(img ociimage.Image, path string) (ociimage.File, bool) {
	var found ociimage.File
	ok := false
	for _, layer := range img.Layers {
		for _, f := range layer {
			if f.Path == path {
				found, ok = f, true
			}
		}
	}
	return found, ok
}

func TestImagesHoldWhatTheTestsCheck(t *testing.T) {
	if _, err := os.Stat("/usr/local/lib/knext/busybox"); err != nil {
		t.Fatalf("%v: run script/ci/install-deps.sh", err)
	}
	pause, stress, nginx := fakeBinaries(t)
	images, err := build("/usr/local/lib/knext/busybox", pause, stress, nginx)
	if err != nil {
		t.Fatal(err)
	}
	byKey := map[string]ociimage.Image{}
	digests := map[string]string{}
	for _, img := range images {
		byKey[img.key] = img.Image
		digest, err := img.Digest()
		if err != nil {
			t.Fatal(err)
		}
		// CRI lists an image under every name of its ID: two keys sharing one would make
		// TestContainerdImage see two repo tags.
		if other, ok := digests[digest.String()]; ok {
			t.Errorf("%s and %s are the same image", img.key, other)
		}
		digests[digest.String()] = img.key
	}
	for _, key := range []string{"BusyBox", "Alpine", "ResourceConsumer", "VolumeCopyUp", "VolumeOwnership", "Nginx", "Pause"} {
		if _, ok := byKey[key]; !ok {
			t.Errorf("no image for %s", key)
		}
	}

	if sh, _ := file(byKey["Alpine"], "bin/sh"); sh.Target != "/bin/busybox" {
		t.Errorf("Alpine's /bin/sh: %+v, want a symlink to the absolute /bin/busybox", sh)
	}
	if release, _ := file(byKey["Alpine"], "etc/os-release"); !strings.Contains(string(release.Content), "Alpine Linux") {
		t.Errorf("Alpine's /etc/os-release: %q", release.Content)
	}
	for _, path := range []string{"test_dir/test_file", "C:/weird_test_dir/weird_test_file", ":colon_prefixed/colon_prefixed_file"} {
		if f, _ := file(byKey["VolumeCopyUp"], path); string(f.Content) != "test_content\n" {
			t.Errorf("VolumeCopyUp's %s: %q, want test_content", path, f.Content)
		}
	}
	if len(byKey["VolumeCopyUp"].Config.Volumes) != 3 {
		t.Errorf("VolumeCopyUp's volumes: %v", byKey["VolumeCopyUp"].Config.Volumes)
	}
	ownership := byKey["VolumeOwnership"]
	if dir, _ := file(ownership, "test_dir"); dir.UID != 65534 || dir.GID != 65534 {
		t.Errorf("VolumeOwnership's /test_dir: owner %d:%d, want 65534:65534", dir.UID, dir.GID)
	}
	if large, _ := file(ownership, "large"); len(large.Content) <= 3<<20 {
		t.Errorf("VolumeOwnership's large layer has %d bytes, want more than 3 MiB", len(large.Content))
	}
	for key, path := range map[string]string{"ResourceConsumer": "usr/local/bin/stress", "Nginx": "usr/sbin/nginx"} {
		if f, ok := file(byKey[key], path); !ok || f.Mode != 0o755 {
			t.Errorf("%s's %s: %+v", key, path, f)
		}
	}
	if id, _ := file(byKey["BusyBox"], "etc/group"); !strings.Contains(string(id.Content), "wheel:x:10:root") {
		t.Errorf("BusyBox's /etc/group lacks wheel with member root (TestAdditionalGids):\n%s", id.Content)
	}
}

func TestWriteNamesEveryArchiveInTheImageList(t *testing.T) {
	pause, stress, nginx := fakeBinaries(t)
	out := t.TempDir()
	if err := write("/usr/local/lib/knext/busybox", pause, stress, nginx, out); err != nil {
		t.Fatal(err)
	}
	list, err := os.ReadFile(filepath.Join(out, "image-list.toml"))
	if err != nil {
		t.Fatal(err)
	}
	for archive, key := range map[string]string{"busybox.tar": "BusyBox", "volume-ownership.tar": "VolumeOwnership", "pause.tar": "Pause"} {
		name, err := ociimage.ImageName(filepath.Join(out, archive))
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(list), key+` = "`+name+`"`) {
			t.Errorf("image-list.toml does not name %s %s:\n%s", key, name, list)
		}
	}
}
