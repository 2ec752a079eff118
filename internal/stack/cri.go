package stack

import (
	"encoding/json"
	"os"
	"path/filepath"

	criruntime "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// PodNamespace is the Kubernetes namespace of PodConfig's pods.
const PodNamespace = "knext-test"

// PodConfig returns the configuration of a pod with its own network namespace, in the instance's
// cgroup parent (so Close finds whatever it leaves). Name must be unique among live pods.
func (h *Stack) PodConfig(name string) *criruntime.PodSandboxConfig {
	return &criruntime.PodSandboxConfig{
		Metadata:     &criruntime.PodSandboxMetadata{Name: name, Uid: h.ID + "-" + name, Namespace: PodNamespace},
		Hostname:     name,
		LogDirectory: filepath.Join(h.Root, "pod-logs", name),
		Linux: &criruntime.LinuxPodSandboxConfig{
			CgroupParent: h.CgroupParent,
			SecurityContext: &criruntime.LinuxSandboxSecurityContext{
				NamespaceOptions: &criruntime.NamespaceOption{Network: criruntime.NamespaceMode_POD},
			},
		},
	}
}

// HostNetworkPodConfig is PodConfig with the host's network namespace.
func (h *Stack) HostNetworkPodConfig(name string) *criruntime.PodSandboxConfig {
	config := h.PodConfig(name)
	config.Hostname = ""
	config.Linux.SecurityContext.NamespaceOptions.Network = criruntime.NamespaceMode_NODE
	return config
}

// ContainerConfig returns the configuration of a container named name running command in
// image (e.g. images.BusyboxImage); an empty command runs the image's default.
func (h *Stack) ContainerConfig(name, image string, command ...string) *criruntime.ContainerConfig {
	return &criruntime.ContainerConfig{
		Metadata: &criruntime.ContainerMetadata{Name: name},
		Image:    &criruntime.ImageSpec{Image: image},
		Command:  command,
		LogPath:  name + ".log",
		Linux:    &criruntime.LinuxContainerConfig{},
	}
}

// WriteJSON writes v (e.g. a PodSandboxConfig) as JSON under the root for crictl, and returns
// the file's path.
func (h *Stack) WriteJSON(name string, v any) (string, error) {
	data, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return "", err
	}
	dir := filepath.Join(h.Root, "requests")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	path := filepath.Join(dir, name+".json")
	return path, os.WriteFile(path, data, 0o644)
}
