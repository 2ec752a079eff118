package cluster

import (
	"cmp"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/knext-dev/knext/internal/ociimage"
)

// The environment the Makefile exports for `make cluster` and the cluster-e2e suite: where each
// binary and image archive of a cluster is.
const (
	KubernetesDirEnv     = "KNEXT_KUBERNETES_DIR"      // kube-apiserver, ..., kubelet, kubectl (third_party/kubernetes)
	EtcdEnv              = "KNEXT_ETCD"                // etcd (third_party/etcd)
	BinDirEnv            = "KNEXT_BIN_DIR"             // knext's containerd, shim and ctr (make build)
	UpstreamBinDirEnv    = "KNEXT_UPSTREAM_BIN_DIR"    // upstream containerd and shim (make upstream)
	ImagesDirEnv         = "KNEXT_IMAGES_DIR"          // the image archives (make images, make cluster-images)
	NRIBridgeManifestEnv = "KNEXT_NRI_BRIDGE_MANIFEST" // deploy/nri-bridge/daemonset.yaml
	// ProxyModeEnv is kube-proxy's mode (ProxyModeNFTables when unset).
	ProxyModeEnv = "KNEXT_CLUSTER_PROXY_MODE"
)

// The image archives of a cluster, in $KNEXT_IMAGES_DIR.
const (
	CoreDNSArchive  = "coredns.tar"
	NetcheckArchive = "netcheck.tar"
)

// EnvConfig returns the Config of a cluster in dir with `nodes` nodes of runtime, its binaries and
// images where the Makefile's environment says.
func EnvConfig(dir string, nodes int, runtime string) (Config, error) {
	env := map[string]string{}
	var errs []error
	for _, name := range []string{KubernetesDirEnv, EtcdEnv, BinDirEnv, UpstreamBinDirEnv, ImagesDirEnv, NRIBridgeManifestEnv} {
		if env[name] = os.Getenv(name); env[name] == "" {
			errs = append(errs, fmt.Errorf("$%s is not set (the Makefile exports it: run through make)", name))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return Config{}, err
	}
	images := env[ImagesDirEnv]
	cfg := Config{
		Dir: dir, Nodes: nodes, Runtime: runtime, ProxyMode: cmp.Or(os.Getenv(ProxyModeEnv), ProxyModeNFTables),
		Binaries: Binaries{
			Kubernetes: filepath.Clean(env[KubernetesDirEnv]), Etcd: env[EtcdEnv], Containerd: env[BinDirEnv],
			Ctr: filepath.Join(env[BinDirEnv], "ctr"), Runc: "/usr/local/bin/runc", CNIBinDir: "/usr/lib/cni",
		},
		Images: []string{filepath.Join(images, ociimage.PauseArchive), filepath.Join(images, ociimage.BusyboxArchive),
			filepath.Join(images, CoreDNSArchive), filepath.Join(images, NetcheckArchive)},
		NRIBridgeManifest: env[NRIBridgeManifestEnv],
	}
	if runtime == RuntimeUpstream {
		cfg.Binaries.Containerd = env[UpstreamBinDirEnv]
	} else {
		nriBridge := filepath.Join(images, ociimage.NRIBridgeArchive)
		cfg.Images = append(cfg.Images, nriBridge)
		var err error
		if cfg.NRIBridgeImage, err = ociimage.ImageName(nriBridge); err != nil {
			return Config{}, fmt.Errorf("nri-bridge's image (make images): %w", err)
		}
	}
	var err error
	if cfg.CoreDNSImage, err = ociimage.ImageName(filepath.Join(images, CoreDNSArchive)); err != nil {
		return Config{}, fmt.Errorf("CoreDNS's image (make cluster-images): %w", err)
	}
	return cfg, nil
}
