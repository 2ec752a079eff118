// Command criimages builds the images containerd's CRI integration tests (the integration package
// of the pinned containerd module) pull, with the content each test relies on, and writes one
// OCI archive per image and the -image-list file that names them:
//
//	criimages -busybox BUSYBOX -pause PAUSE -stress STRESS -nginx NGINX -out DIR
//
// Upstream's images come from registries no test here can reach; these stand in for them under
// names of their own (knext.local/cri-integration/...). Each is built on the busybox image's root
// file system (package critestimages), as upstream's are, with what the tests check of it:
//
//   - BusyBox: that file system as it is (the tests run sh, sleep with day suffixes, id, stat, ip,
//     top...; TestAdditionalGids reads the users and groups);
//   - Alpine: /etc/os-release naming Alpine Linux (TestImageVolumeReusableAfterFailure reads it
//     through an image volume) and /bin/sh a symlink to the absolute /bin/busybox, as Alpine's is
//     (TestImageVolumeBasic mounts it through a subpath that the symlink must not escape);
//   - ResourceConsumer: a stress that holds memory (TestContainerConsumedStats runs
//     `stress -m 1 --vm-bytes 100M --vm-hang 0 -t 30`, test/upstream/criimages/stress);
//   - VolumeCopyUp: test_content in /test_dir/test_file and in two oddly named volumes, as
//     upstream's integration/images/volume-copy-up;
//   - VolumeOwnership: /test_dir owned by nobody:nogroup (65534) as a volume, as upstream's
//     integration/images/volume-ownership, and a 4 MiB layer: TestCRIImagePullTimeout pulls this
//     image and needs a blob larger than the 3 MiB after which its proxy stops sending;
//   - Nginx: knext's stand-in for nginx (internal/conformance/fakenginx), which, like nginx, logs
//     through /dev/stderr opened by path (TestIssue10598);
//   - Pause: knext's pause image.
//
// BusyBoxByDigest and ArgsEscaped are used by no test of the package on Linux: they keep
// upstream's names.
package main

import (
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/knext-dev/knext/internal/conformance/critestimages"
	"github.com/knext-dev/knext/internal/ociimage"
)

// repository is where the images are named.
const repository = "knext.local/cri-integration/"

// image is one of the -image-list's images: its key there and its archive's file name.
type image struct {
	key, archive string
	ociimage.Image
}

func main() {
	busybox := flag.String("busybox", "/usr/local/lib/knext/busybox", "a dynamically linked busybox (Debian package busybox)")
	pause := flag.String("pause", "", "the static pause binary (internal/ociimage/pause)")
	stress := flag.String("stress", "", "the static stress binary (test/upstream/criimages/stress)")
	nginx := flag.String("nginx", "", "the static nginx stand-in (internal/conformance/fakenginx)")
	out := flag.String("out", "", "directory to write the archives and image-list.toml to")
	flag.Parse()
	if *pause == "" || *stress == "" || *nginx == "" || *out == "" {
		fmt.Fprintln(os.Stderr, "usage: criimages [-busybox BUSYBOX] -pause PAUSE -stress STRESS -nginx NGINX -out DIR")
		os.Exit(2)
	}
	if err := write(*busybox, *pause, *stress, *nginx, *out); err != nil {
		fmt.Fprintln(os.Stderr, "criimages:", err)
		os.Exit(1)
	}
}

func write(busybox, pause, stress, nginx, out string) error {
	images, err := build(busybox, pause, stress, nginx)
	if err != nil {
		return err
	}
	var list strings.Builder
	list.WriteString("# The images of containerd's CRI integration tests (criimages), for -image-list.\n")
	for _, img := range images {
		if err := ociimage.WriteArchiveFile(filepath.Join(out, img.archive), img.Image); err != nil {
			return fmt.Errorf("image %s: %w", img.key, err)
		}
		fmt.Fprintf(&list, "%s = %q\n", img.key, img.Names[0])
	}
	return os.WriteFile(filepath.Join(out, "image-list.toml"), []byte(list.String()), 0o644)
}

func build(busybox, pause, stress, nginx string) ([]image, error) {
	base, err := critestimages.BusyboxLayer(busybox)
	if err != nil {
		return nil, err
	}
	pauseImage, err := ociimage.Pause(pause)
	if err != nil {
		return nil, err
	}
	binaries := map[string][]byte{}
	for name, path := range map[string]string{"stress": stress, "nginx": nginx} {
		if binaries[name], err = os.ReadFile(path); err != nil {
			return nil, err
		}
	}
	// A layer whose blob is larger than 3 MiB whatever the compression: random bytes, from a fixed
	// seed so that the archive is the same in every build.
	large := make([]byte, 4<<20)
	rand.NewChaCha8([32]byte{}).Read(large)

	shell := v1.Config{Env: []string{ociimage.DefaultPath}, Cmd: []string{"sh"}}
	with := func(change func(*v1.Config)) v1.Config {
		config := shell
		change(&config)
		return config
	}
	onBase := func(name string, config v1.Config, layers ...ociimage.Layer) ociimage.Image {
		return ociimage.Image{Names: []string{repository + name}, Layers: append([]ociimage.Layer{base}, layers...), Config: config}
	}
	testContent := []byte("test_content\n")
	return []image{
		{"BusyBox", "busybox.tar", onBase("busybox:1.36", shell)},
		{"Alpine", "alpine.tar", onBase("alpine:3.14.0", shell, ociimage.Layer{
			ociimage.RegularFile("etc/os-release", 0o644, []byte(
				"NAME=\"Alpine Linux\"\nID=alpine\nVERSION_ID=3.14.0\nPRETTY_NAME=\"Alpine Linux v3.14 (knext's stand-in: busybox)\"\n")),
			ociimage.Symlink("bin/sh", "/bin/busybox"),
		})},
		{"ResourceConsumer", "resource-consumer.tar", onBase("resource-consumer:1.10",
			with(func(c *v1.Config) { c.Cmd = []string{"sleep", "3650d"} }),
			ociimage.Layer{ociimage.RegularFile("usr/local/bin/stress", 0o755, binaries["stress"])}.WithParents())},
		{"VolumeCopyUp", "volume-copy-up.tar", onBase("volume-copy-up:2.2",
			with(func(c *v1.Config) {
				c.Volumes = map[string]struct{}{"/test_dir": {}, "C:/weird_test_dir": {}, "/:colon_prefixed": {}}
			}),
			ociimage.Layer{
				ociimage.RegularFile("test_dir/test_file", 0o644, testContent),
				ociimage.RegularFile("C:/weird_test_dir/weird_test_file", 0o644, testContent),
				ociimage.RegularFile(":colon_prefixed/colon_prefixed_file", 0o644, testContent),
			}.WithParents())},
		{"VolumeOwnership", "volume-ownership.tar", onBase("volume-ownership:2.1",
			with(func(c *v1.Config) { c.Volumes = map[string]struct{}{"/test_dir": {}} }),
			ociimage.Layer{ociimage.Dir("test_dir", 0o755).Owner(65534, 65534)},
			ociimage.Layer{ociimage.RegularFile("large", 0o644, large)})},
		{"Nginx", "nginx.tar", onBase("nginx:1.27.0",
			with(func(c *v1.Config) { c.Cmd = []string{"nginx", "-g", "daemon off;"} }),
			ociimage.Layer{ociimage.RegularFile("usr/sbin/nginx", 0o755, binaries["nginx"])}.WithParents())},
		{"Pause", "pause.tar", pauseImage},
	}, nil
}
