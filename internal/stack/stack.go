// Package stack runs a private containerd for end-to-end tests, benchmarks and the demo.
//
// It is the one home of the code they share (as containerd keeps integration/remote and
// pkg/testutil): under internal/, since demo, conformance, bench, cluster and the integration
// tests all import it and none of them owns it.
//
// A Stack owns a root directory with the daemon's root, state and temp directories, its gRPC,
// ttrpc and NRI sockets, a CNI bridge network of its own (unique bridge name, network name and
// /24), a cgroup parent for its pods, and the local test images (package ociimage) imported
// into the k8s.io namespace. Everything is named after a random instance ID, and a lease under
// /run/knext-harness keeps concurrent instances (in one or several processes) apart; the
// resources of an instance whose process died without Close are removed by the next New.
//
// The daemon runs runc (Options.Runc) with cgroupfs, restrict_oom_score_adj, netns mounts under
// its state directory, NRI enabled on its own socket, and the sandbox image pinned to
// ociimage.PauseImage, so nothing is ever pulled. A CNI-less node adds CNILessConfig to
// Options.ExtraConfig and starts nri-bridge with StartNRIBridge, which waits for NetworkReady.
//
// The package does not depend on package testing: New and Close return errors.
//
//	h, err := stack.New(ctx, stack.Options{})
//	if err != nil { ... }
//	defer h.Close()
//	id, err := h.Runtime.RunPodSandbox(ctx, &runtime.RunPodSandboxRequest{Config: h.PodConfig("web")})
//
// It needs root, the binaries of `make build`, the archives of `make images`, runc, crictl and the
// CNI plugins (script/ci/install-deps.sh).
package stack

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"
	criruntime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/knext-dev/knext/internal/ociimage"
)

// Namespace is the containerd namespace of CRI, where the images are imported.
const Namespace = "k8s.io"

// maxSocketPath keeps socket paths well below the kernel's 108-byte sun_path limit.
const maxSocketPath = 100

// Options configure a Stack. The zero value runs build/bin/containerd of this repository.
type Options struct {
	// BinDir holds containerd, containerd-shim-runc-v2 and ctr.
	// Default: $KNEXT_BIN_DIR, else build/bin of the repository around the working directory.
	BinDir string
	// Containerd is the daemon binary; its directory comes first in the daemon's PATH, so a
	// shim next to it is preferred. Default: BinDir/containerd.
	Containerd string
	// ImageDir holds the archives of `make images`.
	// Default: $KNEXT_IMAGES_DIR, else build/images of the repository.
	ImageDir string
	// Root is the instance's directory; it must not exist or be empty, and is removed by Close.
	// Default: a new directory under os.TempDir().
	Root string
	// Runc is the OCI runtime binary. Default: /usr/local/bin/runc.
	Runc string
	// Crictl is the crictl binary. Default: crictl from PATH.
	Crictl string
	// CNIBinDir holds the CNI plugins (bridge, host-local, loopback; portmap with CNIPortMappings).
	// Default: /usr/lib/cni.
	CNIBinDir string
	// CNIDualStack gives the instance's CNI network an IPv6 /64 (Stack.Subnet6) next to its
	// IPv4 /24: pods get an address of each, IPv4 first. The CNI bridge plugin then turns the
	// host's IPv6 forwarding on (net.ipv6.conf.all.forwarding), as it does IPv4's for any instance.
	CNIDualStack bool
	// CNIPortMappings chains CNI's portmap plugin after the bridge, so that pods' hostPort
	// mappings are set up (iptables rules in the daemon's network namespace).
	CNIPortMappings bool
	// NRIRequestTimeout is NRI's plugin_request_timeout. Default: 2s.
	NRIRequestTimeout time.Duration
	// NRIRegistrationTimeout is NRI's plugin_registration_timeout. Default: 5s.
	NRIRegistrationTimeout time.Duration
	// ExtraConfig is TOML merged over the generated daemon configuration (its tables merge
	// recursively, its values win), e.g. "[plugins.'io.containerd.nri.v1.nri']\ndisable = true".
	ExtraConfig string
	// LogLevel is the daemon's log level. Default: info.
	LogLevel string
	// SkipNetworkReadyWait makes readiness need only RuntimeReady, for configurations whose
	// network becomes ready later (for example when an NRI plugin provides it).
	SkipNetworkReadyWait bool
	// StartTimeout bounds each daemon start until CRI readiness. Default: 60s.
	StartTimeout time.Duration
	// Logf receives progress messages (t.Logf, log.Printf). Default: discarded.
	Logf func(format string, args ...any)
}

// Stack is a running private containerd. Its exported fields are read-only.
type Stack struct {
	ID   string // random instance ID every name below derives from
	Root string

	Address            string // containerd's gRPC socket (CRI and containerd API)
	NRISocket          string
	NRIPluginDir       string // NRI plugin_path: pre-installed plugins containerd starts
	NRIPluginConfigDir string // NRI plugin_config_path
	ConfigPath         string // the daemon's config.toml
	CrictlConfigPath   string // crictl.yaml pointing at Address
	LogPath            string // daemon output, appended across restarts

	Network      string     // CNI network name
	Bridge       string     // CNI bridge interface name
	Subnet       *net.IPNet // the bridge's IPv4 /24
	Subnet6      *net.IPNet // with Options.CNIDualStack, the bridge's IPv6 /64, else nil
	CNIConfDir   string
	IPAMDataDir  string // host-local's dataDir; allocations are in IPAMDataDir/Network/<ip>
	CgroupParent string // cgroup parent of PodConfig's pods
	NetNSDir     string // where containerd mounts pods' network namespaces (created with the first)

	Runtime criruntime.RuntimeServiceClient
	Images  criruntime.ImageServiceClient

	opts  Options
	res   resources
	lease *lease
	conn  *grpc.ClientConn

	mu       sync.Mutex
	daemon   *daemon // nil while stopped
	cleanups []func() error
	closed   bool
}

// New starts a containerd instance and returns once CRI is ready and the test images are
// imported. On error everything it created is already removed.
func New(ctx context.Context, opts Options) (*Stack, error) {
	if err := opts.complete(); err != nil {
		return nil, err
	}
	root, tempRoot := opts.Root, opts.Root == ""
	var err error
	if tempRoot {
		root, err = os.MkdirTemp("", "knx-")
	} else {
		root, err = filepath.Abs(root)
	}
	if err != nil {
		return nil, err
	}

	h := &Stack{opts: opts, Root: root}
	l, res, err := acquireLease(h.claim, opts.Logf)
	if err != nil {
		if tempRoot {
			os.Remove(root)
		}
		return nil, err
	}
	h.lease, h.res = l, res
	if err := h.setUp(ctx); err != nil {
		return nil, errors.Join(err, h.Close())
	}
	return h, nil
}

// claim names everything after the lease's ID and subnet, and creates the root. It refuses a
// root that is not empty: Close removes the root, so it must hold nothing but the instance.
func (h *Stack) claim(id string, subnet *net.IPNet) (resources, error) {
	h.ID, h.Subnet = id, subnet
	h.Address = filepath.Join(h.Root, "containerd.sock")
	h.NRISocket = filepath.Join(h.Root, "nri.sock")
	h.NRIPluginDir = filepath.Join(h.Root, "nri", "plugins")
	h.NRIPluginConfigDir = filepath.Join(h.Root, "nri", "conf.d")
	h.ConfigPath = filepath.Join(h.Root, "config.toml")
	h.CrictlConfigPath = filepath.Join(h.Root, "crictl.yaml")
	h.LogPath = filepath.Join(h.Root, "containerd.log")
	h.Network = "knext-" + id
	h.Bridge = "knx" + id
	h.CNIConfDir = filepath.Join(h.Root, "cni", "net.d")
	h.IPAMDataDir = filepath.Join(h.Root, "cni", "ipam")
	h.CgroupParent = "/knext-" + id
	if h.opts.CNIDualStack {
		h.Subnet6 = ula64(subnet)
	}
	// netns_mounts_under_state_dir: the CRI plugin's state directory instead of /var/run/netns.
	h.NetNSDir = filepath.Join(h.Root, "state", "io.containerd.grpc.v1.cri", "netns")

	for _, socket := range []string{h.Address + ".ttrpc", h.NRISocket} {
		if len(socket) >= maxSocketPath {
			return resources{}, fmt.Errorf("socket path %s is %d bytes, the limit is %d: use a shorter Options.Root", socket, len(socket), maxSocketPath)
		}
	}
	if entries, err := os.ReadDir(h.Root); err == nil && len(entries) > 0 {
		return resources{}, fmt.Errorf("root %s is not empty: the harness removes its root at Close, give it an empty or new directory", h.Root)
	}
	if err := os.MkdirAll(h.Root, 0o711); err != nil {
		return resources{}, err
	}
	// Like containerd's own root and state (0711): a container in a user namespace runs as an
	// unprivileged host user, and must traverse every directory above its rootfs. MkdirTemp
	// made the root 0700.
	if err := os.Chmod(h.Root, 0o711); err != nil {
		return resources{}, err
	}
	return resources{ID: id, Root: h.Root, ConfigPath: h.ConfigPath, Address: h.Address, Bridge: h.Bridge,
		Network: h.Network, Subnet: subnet.String(), CgroupParent: h.CgroupParent}, nil
}

func (h *Stack) setUp(ctx context.Context) error {
	for _, dir := range []string{h.NRIPluginDir, h.NRIPluginConfigDir, h.CNIConfDir, h.IPAMDataDir, filepath.Join(h.Root, "tmp")} {
		if err := os.MkdirAll(dir, 0o711); err != nil {
			return err
		}
	}
	if err := h.writeConfigs(); err != nil {
		return err
	}
	conn, err := grpc.NewClient("unix://"+h.Address,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		// Reconnect quickly after a restart; gRPC's default backoff grows to two minutes.
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 50 * time.Millisecond, Multiplier: 1.6, MaxDelay: time.Second},
			MinConnectTimeout: time.Second,
		}))
	if err != nil {
		return err
	}
	h.conn = conn
	h.Runtime = criruntime.NewRuntimeServiceClient(conn)
	h.Images = criruntime.NewImageServiceClient(conn)

	h.opts.Logf("harness %s: starting %s in %s (bridge %s, subnet %s)", h.ID, h.opts.Containerd, h.Root, h.Bridge, h.Subnet)
	if err := h.Start(ctx); err != nil {
		return err
	}
	return h.importImages(ctx)
}

// importImages imports the test image archives and waits until CRI sees them.
func (h *Stack) importImages(ctx context.Context) error {
	for _, archive := range []string{ociimage.PauseArchive, ociimage.BusyboxArchive} {
		if _, err := h.Ctr(ctx, "images", "import", filepath.Join(h.opts.ImageDir, archive)); err != nil {
			return err
		}
	}
	for _, image := range []string{ociimage.PauseImage, ociimage.BusyboxImage} {
		if err := poll(ctx, 30*time.Second, func() error {
			resp, err := h.Images.ImageStatus(ctx, &criruntime.ImageStatusRequest{Image: &criruntime.ImageSpec{Image: image}})
			if err == nil && resp.GetImage() == nil {
				err = errors.New("not known to CRI yet")
			}
			return err
		}); err != nil {
			return fmt.Errorf("image %s after import: %w", image, err)
		}
	}
	return nil
}

// Start starts the daemon (Options.Containerd) on the instance's root and waits for CRI
// readiness. It fails if the daemon is already running.
func (h *Stack) Start(ctx context.Context) error {
	return h.StartBinary(ctx, h.opts.Containerd)
}

// StartBinary is Start with another containerd binary on the same root and configuration, e.g.
// an upstream build; its directory comes first in the daemon's PATH.
func (h *Stack) StartBinary(ctx context.Context, binary string) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return errors.New("harness is closed")
	}
	if h.daemon != nil && !h.daemon.exited() {
		return fmt.Errorf("containerd %s is already running (pid %d)", h.daemon.binary, h.daemon.pid)
	}
	log, err := os.OpenFile(h.LogPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer log.Close() // the child has its own descriptor
	fmt.Fprintf(log, "=== harness %s: %s starting %s\n", h.ID, time.Now().UTC().Format(time.RFC3339Nano), binary)
	env := append(os.Environ(), "PATH="+strings.Join([]string{filepath.Dir(binary), h.opts.BinDir,
		"/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"}, ":"))
	d, err := startDaemon(binary, []string{"--config", h.ConfigPath}, env, log)
	if err != nil {
		return err
	}
	h.daemon = d
	if err := h.waitReady(ctx, d); err != nil {
		return fmt.Errorf("containerd %s (pid %d) not ready: %w\n%s", binary, d.pid, err, h.LogTail(30))
	}
	return nil
}

// waitReady polls CRI Status until the runtime (and, unless skipped, the network) is ready.
func (h *Stack) waitReady(ctx context.Context, d *daemon) error {
	return poll(ctx, h.opts.StartTimeout, func() error {
		if d.exited() {
			return Permanent(fmt.Errorf("exited: %v", d.err))
		}
		callCtx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		resp, err := h.Runtime.Status(callCtx, &criruntime.StatusRequest{})
		if err != nil {
			return err
		}
		for _, c := range resp.GetStatus().GetConditions() {
			wanted := c.Type == criruntime.RuntimeReady || (c.Type == criruntime.NetworkReady && !h.opts.SkipNetworkReadyWait)
			if wanted && !c.Status {
				return fmt.Errorf("%s is false: %s %s", c.Type, c.Reason, c.Message)
			}
		}
		return nil
	})
}

// Stop stops the daemon with SIGTERM (SIGKILL after 30 s). Pods and shims keep running.
func (h *Stack) Stop() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.daemon == nil {
		return errors.New("containerd is not running")
	}
	err := h.daemon.stop(30 * time.Second)
	h.daemon = nil
	return err
}

// Kill SIGKILLs the daemon, as a crash would, and waits for its exit. Pods and shims keep running.
func (h *Stack) Kill() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.daemon == nil {
		return errors.New("containerd is not running")
	}
	err := h.daemon.kill()
	h.daemon = nil
	return err
}

// Restart stops the daemon and starts Options.Containerd again on the same root.
func (h *Stack) Restart(ctx context.Context) error {
	return h.RestartBinary(ctx, h.opts.Containerd)
}

// RestartBinary stops the daemon and starts binary on the same root.
func (h *Stack) RestartBinary(ctx context.Context, binary string) error {
	if err := h.Stop(); err != nil {
		return err
	}
	return h.StartBinary(ctx, binary)
}

// PID returns the daemon's process ID, 0 while stopped.
func (h *Stack) PID() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.daemon == nil || h.daemon.exited() {
		return 0
	}
	return h.daemon.pid
}

// Env returns the environment that points ctr and crictl at this instance.
func (h *Stack) Env() []string {
	return []string{"CONTAINERD_ADDRESS=" + h.Address, "CONTAINERD_NAMESPACE=" + Namespace,
		"CRI_CONFIG_FILE=" + h.CrictlConfigPath}
}

// Crictl runs crictl against the instance and returns its standard output; an error carries
// the command and its standard error.
func (h *Stack) Crictl(ctx context.Context, args ...string) ([]byte, error) {
	endpoint := "unix://" + h.Address
	return run(ctx, h.opts.Crictl, append([]string{"--config", h.CrictlConfigPath,
		"--runtime-endpoint", endpoint, "--image-endpoint", endpoint}, args...)...)
}

// Ctr runs ctr against the instance in the CRI namespace.
func (h *Stack) Ctr(ctx context.Context, args ...string) ([]byte, error) {
	return run(ctx, filepath.Join(h.opts.BinDir, "ctr"),
		append([]string{"--address", h.Address, "--namespace", Namespace}, args...)...)
}

func run(ctx context.Context, binary string, args ...string) ([]byte, error) {
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, binary, args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.Bytes(), fmt.Errorf("%s %s: %w: %s", binary, strings.Join(args, " "), err, bytes.TrimSpace(stderr.Bytes()))
	}
	return stdout.Bytes(), nil
}

// Reconfigure replaces Options.ExtraConfig and Options.SkipNetworkReadyWait and rewrites the
// daemon's configuration; the change takes effect at the next Start (or Restart), e.g. to turn
// disable_cni on for pods that already run.
func (h *Stack) Reconfigure(extraConfig string, skipNetworkReadyWait bool) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.opts.ExtraConfig, h.opts.SkipNetworkReadyWait = extraConfig, skipNetworkReadyWait
	config, err := h.containerdConfig()
	if err != nil {
		return err
	}
	return os.WriteFile(h.ConfigPath, config, 0o644)
}

// AddCleanup registers fn to run at Close after the pods are removed and before the daemon
// stops, last registered first (e.g. stopping an NRI plugin the caller started).
func (h *Stack) AddCleanup(fn func() error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.cleanups = append(h.cleanups, fn)
}

// RemoveAllPods stops and removes every pod sandbox (and so every container) of the instance.
func (h *Stack) RemoveAllPods(ctx context.Context) error {
	resp, err := h.Runtime.ListPodSandbox(ctx, &criruntime.ListPodSandboxRequest{})
	if err != nil {
		return fmt.Errorf("list pods: %w", err)
	}
	var errs []error
	for _, pod := range resp.GetItems() {
		if err := h.RemovePod(ctx, pod.Id); err != nil {
			errs = append(errs, fmt.Errorf("pod %s: %w", pod.GetMetadata().GetName(), err))
		}
	}
	return errors.Join(errs...)
}

// RemovePod stops and removes pod sandbox id (and so its containers).
func (h *Stack) RemovePod(ctx context.Context, id string) error {
	if _, err := h.Runtime.StopPodSandbox(ctx, &criruntime.StopPodSandboxRequest{PodSandboxId: id}); err != nil {
		return fmt.Errorf("stop pod %s: %w", id, err)
	}
	if _, err := h.Runtime.RemovePodSandbox(ctx, &criruntime.RemovePodSandboxRequest{PodSandboxId: id}); err != nil {
		return fmt.Errorf("remove pod %s: %w", id, err)
	}
	return nil
}

// Close removes everything the instance created: pods (through CRI while the daemon runs), the
// registered cleanups, the daemon, leftover shims and container processes, mounts, the bridge,
// cgroups, CNI cache entries and the root. It is safe to call more than once.
func (h *Stack) Close() error {
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return nil
	}
	h.closed = true
	d, cleanups := h.daemon, h.cleanups
	h.daemon = nil
	h.mu.Unlock()

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var errs []error
	if d != nil && !d.exited() && h.Runtime != nil {
		errs = append(errs, h.RemoveAllPods(ctx))
	}
	for _, cleanup := range slices.Backward(cleanups) {
		errs = append(errs, cleanup())
	}
	if d != nil {
		errs = append(errs, d.stop(30*time.Second))
	}
	if h.conn != nil {
		errs = append(errs, h.conn.Close())
	}
	if err := teardown(h.res); err != nil {
		// Keep the lease file: the next harness retries the teardown.
		errs = append(errs, err, h.lease.file.Close())
	} else {
		errs = append(errs, h.lease.release())
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("close harness %s: %w", h.ID, err)
	}
	return nil
}

// LogTail returns the last n lines of the daemon log, headed by its path. Trace lines (every CRI
// request and response, when Options.LogLevel is trace) are left out: they would crowd out the rest.
func (h *Stack) LogTail(n int) string {
	return Tail(h.LogPath, n, func(line string) bool { return !strings.Contains(line, "level=trace") })
}

// Tail returns the last n lines of the log file path that keep accepts (all if keep is nil),
// headed by the path.
func Tail(path string, n int, keep func(line string) bool) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(no log: %v)", err)
	}
	var lines []string
	for line := range strings.SplitSeq(strings.TrimRight(string(data), "\n"), "\n") {
		if keep == nil || keep(line) {
			lines = append(lines, line)
		}
	}
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return "last lines of " + path + ":\n" + strings.Join(lines, "\n")
}

// permanent marks an error Poll must not retry.
type permanent struct{ error }

// Permanent marks err as an error Poll returns at once instead of retrying.
func Permanent(err error) error { return permanent{err} }

// poll is Poll every 50 ms.
func poll(ctx context.Context, timeout time.Duration, check func() error) error {
	return Poll(ctx, timeout, 50*time.Millisecond, check)
}

// Poll calls check every interval until it returns nil, returns a Permanent error, ctx ends or
// timeout passes; the error is check's last.
func Poll(ctx context.Context, timeout, interval time.Duration, check func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		err := check()
		if err == nil {
			return nil
		}
		if p, ok := errors.AsType[permanent](err); ok {
			return p.error
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("still failing after %s: %w", timeout, err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last: %v)", ctx.Err(), err)
		case <-time.After(interval):
		}
	}
}
