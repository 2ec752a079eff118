package integration

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	criruntime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/knext-dev/knext/internal/ociimage"
	"github.com/knext-dev/knext/internal/registry"
	"github.com/knext-dev/knext/internal/stack"
)

// reportScript is the entrypoint of the declared image: it prints what the container sees.
const reportScript = `#!/bin/sh
echo "args=$*"
echo "user=$(id -u):$(id -g)"
echo "pwd=$(pwd)"
echo "greeting=$GREETING"
echo "data=$(stat -c '%u:%g %a' /data)"
echo "owned=$(stat -c '%u:%g %a' /data/owned) $(cat /data/owned)"
echo "link=$(readlink /data/link)"
echo "volume=$(grep -c ' /data ' /proc/self/mountinfo)"
`

// TestDeclaredImageRunsAsDeclared declares an image with the image builder, imports its archive
// with ctr and runs it: its files keep their owners, modes and link target, and its configuration
// (entrypoint, command, environment, user, working directory, volume) is what runs.
func TestDeclaredImageRunsAsDeclared(t *testing.T) {
	t.Parallel()
	const name = "knext.local/declared:1"
	image := busyboxWith(t, name,
		ociimage.Dir("data", 0o750).Owner(1000, 1001),
		ociimage.RegularFile("data/owned", 0o640, []byte("hello")).Owner(1000, 1001),
		ociimage.Symlink("data/link", "owned"),
		ociimage.RegularFile("usr/local/bin/report", 0o755, []byte(reportScript)))
	image.Config = v1.Config{
		Entrypoint: []string{"/usr/local/bin/report"}, Cmd: []string{"from-cmd"},
		Env:  []string{ociimage.DefaultPath, "GREETING=declared"},
		User: "1000:1001", WorkingDir: "/data", Volumes: map[string]struct{}{"/data": {}},
	}
	archive := filepath.Join(t.TempDir(), "declared.tar")
	if err := ociimage.WriteArchiveFile(archive, image); err != nil {
		t.Fatal(err)
	}

	h, ctx := startHarness(t, stack.Options{})
	if _, err := h.Ctr(ctx, "images", "import", archive); err != nil {
		t.Fatal(err)
	}
	podConfig := h.PodConfig("declared")
	podID := runPod(t, ctx, h, podConfig)
	out := runToCompletion(t, ctx, h, podID, podConfig, h.ContainerConfig("declared", name))
	want := "args=from-cmd\nuser=1000:1001\npwd=/data\ngreeting=declared\ndata=1000:1001 750\n" +
		"owned=1000:1001 640 hello\nlink=owned\nvolume=1\n"
	if out != want {
		t.Errorf("the declared image printed\n%s\nwant\n%s", out, want)
	}
}

// TestPullFromTestRegistry serves a declared image from the test registry over TLS and lets
// containerd pull it through a hosts.toml, by tag and by the digest the builder computes, then
// runs a container of it.
func TestPullFromTestRegistry(t *testing.T) {
	t.Parallel()
	const repository = "pull.knext.test/tools/pulled"
	image := busyboxWith(t, repository+":1", ociimage.RegularFile("pulled", 0o644, []byte("pulled\n")))
	digest, err := image.Digest()
	if err != nil {
		t.Fatal(err)
	}
	archive := filepath.Join(t.TempDir(), "pulled.tar")
	if err := ociimage.WriteArchiveFile(archive, image); err != nil {
		t.Fatal(err)
	}
	// containerd reads the hosts directory at each pull: it may be filled once containerd runs.
	certsDir := t.TempDir()
	h, ctx := startHarness(t, stack.Options{
		ExtraConfig: fmt.Sprintf("[plugins.'io.containerd.cri.v1.images'.registry]\nconfig_path = %q\n", certsDir),
	})
	srv, err := registry.Serve(registry.Options{
		Listen: "127.0.0.1:0", Archives: []string{archive}, Log: log.New(t.Output(), "registry: ", 0),
	})
	if err != nil {
		t.Fatal(err)
	}
	h.AddCleanup(srv.Close)
	if err := srv.WriteHostsDir(certsDir); err != nil {
		t.Fatal(err)
	}

	byDigest := repository + "@" + digest.String()
	for _, ref := range []string{repository + ":1", byDigest} {
		if _, err := h.Images.PullImage(ctx, &criruntime.PullImageRequest{Image: &criruntime.ImageSpec{Image: ref}}); err != nil {
			t.Fatalf("pull %s: %v", ref, err)
		}
	}
	podConfig := h.PodConfig("pulled")
	podID := runPod(t, ctx, h, podConfig)
	if out := runToCompletion(t, ctx, h, podID, podConfig, h.ContainerConfig("pulled", byDigest, "cat", "/pulled")); out != "pulled\n" {
		t.Errorf("a container of %s printed %q, want %q", byDigest, out, "pulled\n")
	}
}

// busyboxWith declares the image name: knext's busybox image with a layer of files on top.
func busyboxWith(t *testing.T, name string, files ...ociimage.File) ociimage.Image {
	t.Helper()
	image, err := ociimage.Busybox("/bin/busybox")
	if err != nil {
		t.Fatal(err)
	}
	image.Names = []string{name}
	image.Layers = append(image.Layers, ociimage.Layer(files).WithParents())
	return image
}

// imageArchive returns the path of an archive of `make images`.
func imageArchive(t *testing.T, archive string) string {
	t.Helper()
	dir := os.Getenv("KNEXT_IMAGES_DIR")
	if dir == "" {
		t.Fatal("KNEXT_IMAGES_DIR is not set: run the tests through make (make images builds the archives)")
	}
	return filepath.Join(dir, archive)
}

// runToCompletion runs config's container in the pod, waits for it to exit 0, and returns what it
// printed.
func runToCompletion(t *testing.T, ctx context.Context, h *stack.Stack, podID string,
	podConfig *criruntime.PodSandboxConfig, config *criruntime.ContainerConfig) string {
	t.Helper()
	created, err := h.Runtime.CreateContainer(ctx, &criruntime.CreateContainerRequest{
		PodSandboxId: podID, Config: config, SandboxConfig: podConfig,
	})
	if err != nil {
		t.Fatalf("create container %s: %v", config.Metadata.Name, err)
	}
	id := created.ContainerId
	if _, err := h.Runtime.StartContainer(ctx, &criruntime.StartContainerRequest{ContainerId: id}); err != nil {
		t.Fatalf("start container %s: %v", id, err)
	}
	var status *criruntime.ContainerStatus
	if err := stack.Poll(ctx, time.Minute, 100*time.Millisecond, func() error {
		resp, err := h.Runtime.ContainerStatus(ctx, &criruntime.ContainerStatusRequest{ContainerId: id})
		if err != nil {
			return err
		}
		status = resp.GetStatus()
		if status.GetState() != criruntime.ContainerState_CONTAINER_EXITED {
			return errors.New(status.GetState().String())
		}
		return nil
	}); err != nil {
		t.Fatalf("container %s did not exit: %v", id, err)
	}
	data, err := os.ReadFile(status.GetLogPath())
	if err != nil {
		t.Fatal(err)
	}
	// CRI log lines are "<time> <stream> <tag> <text>".
	var out strings.Builder
	for line := range strings.Lines(string(data)) {
		if fields := strings.SplitN(line, " ", 4); len(fields) == 4 {
			out.WriteString(fields[3])
		}
	}
	if status.GetExitCode() != 0 {
		t.Fatalf("container %s exited %d: %s", id, status.GetExitCode(), out.String())
	}
	return out.String()
}
