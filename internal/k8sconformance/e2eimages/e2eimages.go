// Package e2eimages rebuilds, from local inputs, the images that the sig-network specs of
// Kubernetes' end-to-end suite run, under the names the suite's binary asks for (`e2e.test
// --list-images`), so that the nodes of a cluster with no registry in reach find them.
//
// What each image is made of (docs/conformance.md, "Kubernetes' own e2e suite"):
//
//   - registry.k8s.io/e2e-test-images/agnhost (every tag the suite names): the static agnhost of
//     the pinned Kubernetes as /agnhost (entrypoint, command "pause") and its /agnhost-2 link,
//     porter's localhost.crt and localhost.key, /uploads and /coredns, as upstream's Dockerfile
//     lays them out, on a Debian root file system holding the commands the specs run in it
//     (sh, curl, dig, nc, ip, ss, iperf, socat, ...). Upstream's is Alpine (musl): Alpine's
//     packages are out of reach here, so the spec's "musl" DNS prober runs glibc's resolver too.
//   - registry.k8s.io/e2e-test-images/glibc-dns-testing: that Debian root file system (dnsutils)
//     with /coredns, command "bash", as upstream's (Debian bookworm plus dnsutils).
//   - registry.k8s.io/e2e-test-images/nginx: the same root file system, whose Debian nginx serves
//     :80 in the foreground.
//   - registry.k8s.io/e2e-test-images/busybox: knext's busybox image (ociimage.Busybox).
//   - registry.k8s.io/pause: knext's pause image (ociimage.Pause).
//
// Every other name is left out (Images returns it): images of specs outside sig-network, and the
// deliberately unreachable ones (a private registry, an invalid one) whose pull must fail.
package e2eimages

import (
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/knext-dev/knext/internal/ociimage"
)

// Inputs are what the images are made of.
type Inputs struct {
	// RootFS is a tar archive of a Debian root file system (mmdebstrap) with the packages the
	// specs use: the base of agnhost, glibc-dns-testing and nginx.
	RootFS string
	// Agnhost is the static agnhost binary of the pinned Kubernetes; AgnhostSource its source
	// directory (k8s.io/kubernetes/test/images/agnhost), for porter's certificate and key.
	Agnhost, AgnhostSource string
	// CoreDNS is a static coredns, /coredns in agnhost and glibc-dns-testing as upstream's
	// images carry one.
	CoreDNS string
	// Pause is a static pause binary (internal/ociimage/pause); Busybox a statically linked busybox.
	Pause, Busybox string
}

// The repositories rebuilt here.
const (
	agnhostRepository         = "registry.k8s.io/e2e-test-images/agnhost"
	glibcDNSTestingRepository = "registry.k8s.io/e2e-test-images/glibc-dns-testing"
	nginxRepository           = "registry.k8s.io/e2e-test-images/nginx"
	busyboxRepository         = "registry.k8s.io/e2e-test-images/busybox"
	pauseRepository           = "registry.k8s.io/pause"
)

// Images returns the images of every name of names that this package rebuilds, each image
// under all its names, and the names it leaves out.
func Images(in Inputs, names []string) (images []ociimage.Image, left []string, err error) {
	byRepository := map[string][]string{}
	for _, imageName := range names {
		tag, err := name.NewTag(imageName, name.StrictValidation)
		if err != nil {
			return nil, nil, fmt.Errorf("image name %q is not host/repository:tag: %w", imageName, err)
		}
		repository := tag.Context().Name()
		byRepository[repository] = append(byRepository[repository], imageName)
	}
	b := &builder{Inputs: in}
	declare := map[string]func() (ociimage.Image, error){
		agnhostRepository: b.agnhost,
		glibcDNSTestingRepository: func() (ociimage.Image, error) {
			return b.onRootFS(v1.Config{Cmd: []string{"bash"}}, b.coreDNS)
		},
		nginxRepository: func() (ociimage.Image, error) {
			return b.onRootFS(v1.Config{Cmd: []string{"nginx", "-g", "daemon off;"}, ExposedPorts: map[string]struct{}{"80/tcp": {}}})
		},
		busyboxRepository: func() (ociimage.Image, error) { return ociimage.Busybox(in.Busybox) },
		pauseRepository:   func() (ociimage.Image, error) { return ociimage.Pause(in.Pause) },
	}
	for _, repository := range slices.Sorted(maps.Keys(byRepository)) {
		if declare[repository] == nil {
			left = append(left, byRepository[repository]...)
			continue
		}
		image, err := declare[repository]()
		if err != nil {
			return nil, nil, fmt.Errorf("image %s: %w", repository, err)
		}
		image.Names = byRepository[repository]
		images = append(images, image)
	}
	return images, left, nil
}

// builder declares the images; the root file system is read once.
type builder struct {
	Inputs
	rootFS v1.Layer
}

// onRootFS is an image on the Debian root file system with config (PATH added) and a layer of
// the files each of layers returns: a layer of the same files in two images is stored once.
func (b *builder) onRootFS(config v1.Config, layers ...func() ([]ociimage.File, error)) (ociimage.Image, error) {
	if b.rootFS == nil {
		var err error
		if b.rootFS, err = ociimage.TarLayer(b.RootFS); err != nil {
			return ociimage.Image{}, fmt.Errorf("root file system: %w", err)
		}
	}
	image := ociimage.Image{RootFS: b.rootFS, Config: config}
	image.Config.Env = append([]string{ociimage.DefaultPath}, config.Env...)
	for _, layer := range layers {
		files, err := layer()
		if err != nil {
			return ociimage.Image{}, err
		}
		image.Layers = append(image.Layers, ociimage.Layer(files).WithParents())
	}
	return image, nil
}

// agnhost is upstream's test/images/agnhost/Dockerfile on the Debian root file system.
func (b *builder) agnhost() (ociimage.Image, error) {
	config := v1.Config{
		Entrypoint: []string{"/agnhost"}, Cmd: []string{"pause"},
		ExposedPorts: map[string]struct{}{"80/tcp": {}, "8080/tcp": {}, "8081/tcp": {}, "9376/tcp": {}, "5000/tcp": {}},
	}
	return b.onRootFS(config, b.coreDNS, func() ([]ociimage.File, error) {
		files := []ociimage.File{ociimage.Dir("uploads", 0o755), ociimage.Symlink("agnhost-2", "agnhost")}
		for _, f := range []struct {
			path, source string
			mode         int64
		}{
			{"agnhost", b.Agnhost, 0o755},
			{"localhost.crt", filepath.Join(b.AgnhostSource, "porter", "localhost.crt"), 0o644},
			{"localhost.key", filepath.Join(b.AgnhostSource, "porter", "localhost.key"), 0o644},
		} {
			content, err := os.ReadFile(f.source)
			if err != nil {
				return nil, err
			}
			files = append(files, ociimage.RegularFile(f.path, f.mode, content))
		}
		return files, nil
	})
}

func (b *builder) coreDNS() ([]ociimage.File, error) {
	content, err := os.ReadFile(b.CoreDNS)
	if err != nil {
		return nil, err
	}
	return []ociimage.File{ociimage.RegularFile("coredns", 0o755, content)}, nil
}
