// Package kubelet runs a real kubelet in standalone mode (static pods from a manifest directory,
// no API server) against the containerd of an integration harness, for end-to-end tests. The
// kubelet's view of its pods comes from its read-only port (`/pods`).
//
// The kubelet is made to leave the host alone:
//   - it runs in its own mount namespace, where tmpfs hide /var/lib and /var/log (it writes
//     /var/lib/kubelet/device-plugins and /var/log/containers whatever its root directory) and
//     files with the values it wants cover the sysctls it would otherwise rewrite
//     (protectKernelDefaults: true makes it check them instead of writing them);
//   - its root directory is a shared mount under the harness root, so that volume mounts it makes
//     in its namespace reach containerd, and the harness removes it at Close;
//   - its cgroup root is inside the harness's cgroup parent, so the harness kills and removes
//     what it leaves; the harness's own pods are not under it (the kubelet kills processes in
//     pod cgroups it does not know under its root);
//   - it listens on loopback only, on free ports, makes no iptables chains, and never lowers
//     its OOM score (this VM lacks CAP_SYS_RESOURCE).
//
// Stop the kubelet before closing the harness: the harness removes all pods first, and a running
// kubelet would start its static pods again.
package kubelet

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"time"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/knext-dev/knext/internal/kubelethost"
	"github.com/knext-dev/knext/internal/stack"
)

// BinaryEnv names the kubelet binary when Options.Binary is empty; `make kubelet` builds it
// (third_party/kubernetes) and the Makefile exports its path.
const BinaryEnv = "KNEXT_KUBELET"

// Options configure a Kubelet.
type Options struct {
	// Binary is the kubelet executable. Default: $KNEXT_KUBELET.
	Binary string
	// Logf receives progress messages. Default: discarded.
	Logf func(format string, args ...any)
}

// Kubelet is a standalone kubelet of one harness. Its exported fields are read-only.
type Kubelet struct {
	Dir          string // everything of the kubelet, under the harness root
	RootDir      string // --root-dir: a shared mount
	ManifestDir  string // staticPodPath
	PodLogsDir   string
	NodeName     string
	CgroupRoot   string
	ReadOnlyPort int
	LogPath      string

	h          *stack.Stack
	binary     string
	configPath string
	sysctlDir  string
	logf       func(string, ...any)
	process    *stack.Process // nil while stopped
}

// New prepares a kubelet for h (directories, configuration, mounts, cgroups) and starts it.
func New(ctx context.Context, h *stack.Stack, opts Options) (*Kubelet, error) {
	if opts.Binary == "" {
		opts.Binary = os.Getenv(BinaryEnv)
	}
	if opts.Binary == "" {
		return nil, fmt.Errorf("no kubelet binary: set $%s (`make kubelet` builds it and the Makefile exports it)", BinaryEnv)
	}
	if _, err := os.Stat(opts.Binary); err != nil {
		return nil, fmt.Errorf("kubelet binary: %w (`make kubelet` builds it)", err)
	}
	if opts.Logf == nil {
		opts.Logf = func(string, ...any) {}
	}
	dir := filepath.Join(h.Root, "kubelet")
	k := &Kubelet{
		Dir:         dir,
		RootDir:     filepath.Join(dir, "root"),
		ManifestDir: filepath.Join(dir, "manifests"),
		PodLogsDir:  filepath.Join(dir, "pod-logs"),
		NodeName:    "knext-" + h.ID,
		CgroupRoot:  h.CgroupParent + "/kubelet",
		LogPath:     filepath.Join(h.Root, "kubelet.log"), // stack.StartProcess's log of "kubelet"
		h:           h,
		binary:      opts.Binary,
		configPath:  filepath.Join(dir, "config.yaml"),
		sysctlDir:   filepath.Join(dir, "sysctl"),
		logf:        opts.Logf,
	}
	for _, d := range []string{k.RootDir, k.ManifestDir, k.PodLogsDir, k.sysctlDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, err
		}
	}
	for name, value := range kubelethost.KernelDefaults {
		if err := os.WriteFile(filepath.Join(k.sysctlDir, name), []byte(strconv.Itoa(value)+"\n"), 0o444); err != nil {
			return nil, err
		}
	}
	if err := MakeSharedMount(k.RootDir); err != nil {
		return nil, err
	}
	if err := kubelethost.CreateCgroup(k.CgroupRoot); err != nil {
		return nil, err
	}
	var err error
	if k.ReadOnlyPort, err = freePort(); err != nil {
		return nil, err
	}
	serverPort, err := freePort()
	if err != nil {
		return nil, err
	}
	config, err := k.config(serverPort)
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(k.configPath, config, 0o644); err != nil {
		return nil, err
	}
	return k, k.Start(ctx)
}

// config returns the KubeletConfiguration (see the package comment for why each setting).
func (k *Kubelet) config(serverPort int) ([]byte, error) {
	endpoint := "unix://" + k.h.Address
	return yaml.Marshal(withHostSettings(map[string]any{
		"apiVersion":               "kubelet.config.k8s.io/v1beta1",
		"kind":                     "KubeletConfiguration",
		"containerRuntimeEndpoint": endpoint,
		"imageServiceEndpoint":     endpoint,
		"staticPodPath":            k.ManifestDir,
		// The directory is watched; the periodic re-read is only a fallback.
		"fileCheckFrequency": "5s",
		"podLogsDir":         k.PodLogsDir,
		"volumePluginDir":    filepath.Join(k.Dir, "volume-plugins"),
		"address":            "127.0.0.1",
		"port":               serverPort,
		"readOnlyPort":       k.ReadOnlyPort,
		"healthzPort":        0,
		"authentication": map[string]any{
			"anonymous": map[string]any{"enabled": true},
			"webhook":   map[string]any{"enabled": false},
		},
		"authorization": map[string]any{"mode": "AlwaysAllow"},
		"cgroupRoot":    k.CgroupRoot,
	}))
}

// withHostSettings returns config with kubelethost.HostSettings added.
func withHostSettings(config map[string]any) map[string]any {
	maps.Copy(config, kubelethost.HostSettings())
	return config
}

// mountNamespaceScript runs in the kubelet's new mount namespace (unshare --propagation
// unchanged, so that the shared root directory stays a peer of the host's), then execs the
// kubelet: $1 is the sysctl directory, $2 the kubelet root directory, the rest the command.
// Every mount it makes is on a mount it first detaches from its peers, and it checks that, so
// that nothing reaches the host.
const mountNamespaceScript = `set -eu
sysctls=$1 root=$2
shift 2
private() {
	target=$(findmnt -n -o TARGET -T "$1")
	mount --make-private "$target"
	[ "$(findmnt -n -o PROPAGATION -T "$1")" = private ] || { echo "kubelet mounts: $target is not private" >&2; exit 1; }
}
for file in "$sysctls"/*; do
	path=/proc/sys/$(basename "$file" | tr . /)
	private "$path"
	mount --bind -o ro "$file" "$path"
done
for dir in /var/lib /var/log; do
	private "$dir"
	mount -t tmpfs -o mode=0755,size=64m knext-kubelet "$dir"
done
[ "$(findmnt -n -o PROPAGATION "$root")" = shared ] || { echo "kubelet mounts: $root is not shared" >&2; exit 1; }
exec "$@"
`

// Start starts the kubelet and waits until its read-only port answers /healthz.
func (k *Kubelet) Start(ctx context.Context) error {
	if k.process != nil {
		return fmt.Errorf("kubelet %s is already running (pid %d)", k.NodeName, k.process.PID())
	}
	unshare, err := exec.LookPath("unshare")
	if err != nil {
		return fmt.Errorf("unshare (util-linux): %w", err)
	}
	args := []string{"--mount", "--propagation", "unchanged", "--", "/bin/sh", "-c", mountNamespaceScript,
		"kubelet-mounts", k.sysctlDir, k.RootDir,
		k.binary, "--config", k.configPath, "--root-dir", k.RootDir, "--cert-dir", filepath.Join(k.Dir, "pki"),
		"--hostname-override", k.NodeName, "--node-ip", "127.0.0.1",
		// At 4 the kubelet logs each runtime network state it reads (tests wait for it to notice).
		"--v", "4"}
	k.logf("kubelet %s: starting %s (log %s)", k.NodeName, k.binary, k.LogPath)
	p, err := k.h.StartProcess("kubelet", unshare, args...)
	if err != nil {
		return err
	}
	k.process = p
	deadline := time.Now().Add(60 * time.Second)
	for {
		err := k.get(ctx, "/healthz", nil)
		if err == nil {
			return nil
		}
		if exited, exitErr := p.Exited(); exited {
			k.process = nil
			return fmt.Errorf("kubelet %s exited (%v) before it was healthy:\n%s", k.NodeName, exitErr, k.LogTail(30))
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("kubelet %s not healthy after 60s: %v\n%s", k.NodeName, err, k.LogTail(30))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Stop stops the kubelet (SIGTERM); its pods keep running. Stopping a stopped kubelet does nothing.
func (k *Kubelet) Stop() error {
	if k.process == nil {
		return nil
	}
	err := k.process.Stop()
	k.process = nil
	return err
}

// Restart stops the kubelet and starts it again on the same root directory.
func (k *Kubelet) Restart(ctx context.Context) error {
	if err := k.Stop(); err != nil {
		return err
	}
	return k.Start(ctx)
}

// PID returns the kubelet's process ID, 0 while stopped.
func (k *Kubelet) PID() int {
	if k.process == nil {
		return 0
	}
	return k.process.PID()
}

// AddStaticPod writes pod's manifest into the manifest directory as <name>.yaml. The file
// appears at once, complete: the kubelet ignores hidden files, which the manifest is written as
// first.
func (k *Kubelet) AddStaticPod(pod *corev1.Pod) error {
	data, err := yaml.Marshal(pod)
	if err != nil {
		return err
	}
	name := filepath.Join(k.ManifestDir, pod.Name+".yaml")
	hidden := filepath.Join(k.ManifestDir, "."+pod.Name+".yaml")
	if err := os.WriteFile(hidden, data, 0o644); err != nil {
		return err
	}
	return os.Rename(hidden, name)
}

// RemoveStaticPod removes the manifest AddStaticPod wrote for the pod named name.
func (k *Kubelet) RemoveStaticPod(name string) error {
	return os.Remove(filepath.Join(k.ManifestDir, name+".yaml"))
}

// StaticPodName is the name the kubelet gives the static pod of manifest name: <name>-<node>.
func (k *Kubelet) StaticPodName(name string) string {
	return name + "-" + k.NodeName
}

// Pods returns the pods as the kubelet's read-only port reports them, with their status.
func (k *Kubelet) Pods(ctx context.Context) ([]corev1.Pod, error) {
	var list corev1.PodList
	if err := k.get(ctx, "/pods", &list); err != nil {
		return nil, err
	}
	return list.Items, nil
}

// get fetches path from the read-only port and decodes the JSON answer into v (unless nil).
func (k *Kubelet) get(ctx context.Context, path string, v any) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	url := "http://127.0.0.1:" + strconv.Itoa(k.ReadOnlyPort) + path
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s: %s", url, resp.Status, body)
	}
	if v == nil {
		return nil
	}
	if err := json.Unmarshal(body, v); err != nil {
		return fmt.Errorf("GET %s: %w", url, err)
	}
	return nil
}

// LogTail returns the last n lines of the kubelet's log, headed by its path.
func (k *Kubelet) LogTail(n int) string {
	return stack.Tail(k.LogPath, n, nil)
}

// MakeSharedMount bind-mounts dir onto itself as a shared mount of its own peer group: mounts
// made below it in another mount namespace that was copied from this one (a kubelet's), or in
// this one, show in both. Put dir under a harness root, whose Close unmounts it.
func MakeSharedMount(dir string) error {
	mounted, err := mountinfo.Mounted(dir)
	if err != nil {
		return err
	}
	if !mounted {
		if err := unix.Mount(dir, dir, "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("bind-mount %s onto itself: %w", dir, err)
		}
	}
	// Private first: a bind mount inherits the peer group of the mount it is made on.
	for _, flag := range []uintptr{unix.MS_PRIVATE, unix.MS_SHARED} {
		if err := unix.Mount("", dir, "", flag, ""); err != nil {
			return fmt.Errorf("change the propagation of %s: %w", dir, err)
		}
	}
	return nil
}

// freePort returns a TCP port of loopback that nothing listens on right now.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
