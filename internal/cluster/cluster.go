// Package cluster runs a real multi-node Kubernetes cluster on this one machine: etcd,
// kube-apiserver, kube-controller-manager and kube-scheduler in a network namespace of their own,
// and N nodes, each a network namespace and a mount namespace with its own containerd, kubelet
// and kube-proxy, all on one underlay bridge on the host. CoreDNS runs as the cluster DNS, and in
// knext mode nri-bridge's DaemonSet is the pod network.
//
// The processes outlive the program that starts them: everything a cluster is (its ID, addresses,
// processes by PID and command line, namespaces, cgroups) is recorded in Dir/cluster.json, so
// that another program (`knext-cluster down`, a test's fault injection) finds, restarts and removes
// it. Up brings a cluster up; Load opens a running one; Down removes every trace of it.
//
// Two runtimes (Config.Runtime): RuntimeKnext is knext's containerd without CNI
// (`disable_cni`, `network_plugin = "bridge"`) with nri-bridge deployed through the API;
// RuntimeUpstream is upstream containerd with a CNI bridge, host-local on the node's pod CIDRs
// (containerd's conf_template, filled in when the kubelet reports the node's pod CIDRs), portmap
// and loopback, with the routes between nodes added by this package: the baseline.
package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/knext-dev/knext/internal/pki"
	"github.com/knext-dev/knext/internal/stack"
)

// Runtimes of the nodes.
const (
	RuntimeKnext    = "knext"
	RuntimeUpstream = "upstream"
)

// kube-proxy's modes: nri-bridge's rules live beside either (docs/cni-less.md, "Services").
const (
	ProxyModeNFTables = "nftables"
	ProxyModeIPTables = "iptables"
)

// Binaries are the programs of a cluster.
type Binaries struct {
	// Kubernetes is the directory of kube-apiserver, kube-controller-manager, kube-scheduler,
	// kubelet, kube-proxy and kubectl (third_party/kubernetes/build.sh).
	Kubernetes string `json:"kubernetes"`
	Etcd       string `json:"etcd"`
	// Containerd is the directory of the nodes' containerd and containerd-shim-runc-v2: knext's
	// (make build) or upstream's (make upstream), as Config.Runtime says.
	Containerd string `json:"containerd"`
	Ctr        string `json:"ctr"`
	Runc       string `json:"runc"`
	CNIBinDir  string `json:"cniBinDir"`
}

// Config configures Up.
type Config struct {
	// Dir holds everything of the cluster; it must not exist or be empty. Keep it short: unix
	// socket paths under it are limited to 108 bytes.
	Dir     string
	Nodes   int
	Runtime string
	// ProxyMode is kube-proxy's mode on every node: ProxyModeNFTables (default) or
	// ProxyModeIPTables.
	ProxyMode string
	Binaries  Binaries
	// Images are image archives imported into every node's containerd (the sandbox image
	// images.PauseImage, CoreDNSImage's, nri-bridge's, the test workloads').
	Images []string
	// CoreDNSImage is the name of CoreDNS's image in Images.
	CoreDNSImage string
	// NRIBridgeManifest is deploy/nri-bridge/daemonset.yaml, applied as shipped with
	// NRIBridgeImage in place of its image placeholder (RuntimeKnext only).
	NRIBridgeManifest string
	NRIBridgeImage    string
	// SkipNRIBridge leaves nri-bridge out in knext mode: the nodes stay NotReady until the caller
	// applies it (ApplyNRIBridge), as a real cluster's bootstrap does.
	SkipNRIBridge bool
	// Logf receives progress messages. Default: discarded.
	Logf func(format string, args ...any)
}

// State is what cluster.json records.
type State struct {
	ID        string `json:"id"`
	Dir       string `json:"dir"`
	Runtime   string `json:"runtime"`
	ProxyMode string `json:"proxyMode"`
	// Bridge is the underlay bridge on the host; HostIPs its addresses there.
	Bridge         string            `json:"bridge"`
	Underlay       []string          `json:"underlay"` // IPv4 /24, IPv6 /64
	HostIPs        []string          `json:"hostIPs"`
	ControlPlane   ControlPlaneState `json:"controlPlane"`
	Nodes          []*NodeState      `json:"nodes"`
	Binaries       Binaries          `json:"binaries"`
	Images         []string          `json:"images"`
	CoreDNSImage   string            `json:"coreDNSImage"`
	NRIBridge      string            `json:"nriBridgeManifest,omitempty"`
	NRIBridgeImage string            `json:"nriBridgeImage,omitempty"`
}

// ControlPlaneState is the control plane's network namespace and processes.
type ControlPlaneState struct {
	Netns     string              `json:"netns"`
	HostVeth  string              `json:"hostVeth"`
	IPs       []string            `json:"ips"` // IPv4 (the API server's), IPv6 on the underlay
	Processes map[string]*Process `json:"processes"`
}

// NodeState is one node.
type NodeState struct {
	Name     string   `json:"name"`
	Dir      string   `json:"dir"`
	Netns    string   `json:"netns"`
	MountNS  string   `json:"mountNS"` // the file the node's mount namespace is bound at
	HostVeth string   `json:"hostVeth"`
	IPs      []string `json:"ips"` // IPv4, IPv6 on the underlay: the kubelet's --node-ip
	// CgroupRoot is the kubelet's cgroupRoot: every pod of the node is below it.
	CgroupRoot string              `json:"cgroupRoot"`
	PodCIDRs   []string            `json:"podCIDRs,omitempty"` // as the controller-manager allocated them
	Processes  map[string]*Process `json:"processes"`
}

// Cluster is a cluster recorded in a state directory.
type Cluster struct {
	State
	logf   func(string, ...any)
	ca     *pki.Authority // while Up creates the cluster
	paused bool           // by Pause, until Resume
}

const stateFile = "cluster.json"

// Kubeconfig is the admin kubeconfig's path (user kubernetes-admin, group system:masters).
func (c *Cluster) Kubeconfig() string {
	return filepath.Join(c.Dir, "kubeconfig")
}

// Client returns a client of the API server with the admin's credentials.
func (c *Cluster) Client() (*kubernetes.Clientset, error) {
	config, err := clientcmd.BuildConfigFromFlags("", c.Kubeconfig())
	if err != nil {
		return nil, err
	}
	config.QPS, config.Burst = 50, 100
	return kubernetes.NewForConfig(config)
}

// Kubectl runs kubectl with the admin kubeconfig and returns its standard output.
func (c *Cluster) Kubectl(ctx context.Context, stdin []byte, args ...string) ([]byte, error) {
	return runInput(ctx, stdin, append([]string{filepath.Join(c.Binaries.Kubernetes, "kubectl"), "--kubeconfig", c.Kubeconfig()}, args...)...)
}

// Load opens the cluster recorded in dir.
func Load(dir string, logf func(string, ...any)) (*Cluster, error) {
	data, err := os.ReadFile(filepath.Join(dir, stateFile))
	if err != nil {
		return nil, fmt.Errorf("no cluster in %s: %w", dir, err)
	}
	c := &Cluster{logf: logf}
	if err := json.Unmarshal(data, &c.State); err != nil {
		return nil, fmt.Errorf("%s: %w", filepath.Join(dir, stateFile), err)
	}
	if c.logf == nil {
		c.logf = func(string, ...any) {}
	}
	return c, nil
}

// save writes the state; every step that creates something outside Dir saves first, so that Down
// finds it whatever happens next.
func (c *Cluster) save() error {
	data, err := json.MarshalIndent(c.State, "", "  ")
	if err != nil {
		return err
	}
	tmp := filepath.Join(c.Dir, "."+stateFile+".tmp")
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(c.Dir, stateFile))
}

// Up brings up a cluster as cfg says and returns once every node is Ready and CoreDNS runs (in
// knext mode with SkipNRIBridge: once every node is registered). On error the cluster is left as
// it is, for its logs; Down removes it.
func Up(ctx context.Context, cfg Config) (*Cluster, error) {
	if cfg.Logf == nil {
		cfg.Logf = func(string, ...any) {}
	}
	if err := cfg.check(); err != nil {
		return nil, err
	}
	dir, err := filepath.Abs(cfg.Dir)
	if err != nil {
		return nil, err
	}
	if entries, err := os.ReadDir(dir); err == nil && len(entries) > 0 {
		return nil, fmt.Errorf("cluster directory %s is not empty: a cluster may be up there (`knext-cluster down -dir %s` removes it)", dir, dir)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	id, subnet, err := claim(dir)
	if err != nil {
		return nil, err
	}
	subnet6 := underlay6(subnet)
	prefix := "knc" + id
	c := &Cluster{logf: cfg.Logf, State: State{
		ID: id, Dir: dir, Runtime: cfg.Runtime, ProxyMode: cfg.ProxyMode, Bridge: prefix,
		Underlay: []string{subnet.String(), subnet6.String()},
		HostIPs:  []string{hostAddr(subnet, 1).String(), hostAddr(subnet6, 1).String()},
		ControlPlane: ControlPlaneState{
			Netns: "knc-" + id + "-cp", HostVeth: prefix + "cp",
			IPs:       []string{hostAddr(subnet, 2).String(), hostAddr(subnet6, 2).String()},
			Processes: map[string]*Process{},
		},
		Binaries: cfg.Binaries, Images: cfg.Images, CoreDNSImage: cfg.CoreDNSImage,
		NRIBridge: cfg.NRIBridgeManifest, NRIBridgeImage: cfg.NRIBridgeImage,
	}}
	for i := 1; i <= cfg.Nodes; i++ {
		name := fmt.Sprintf("node-%d", i)
		c.Nodes = append(c.Nodes, &NodeState{
			Name: name, Dir: filepath.Join(dir, name), Netns: "knc-" + id + "-" + name,
			MountNS: filepath.Join(dir, "ns", name), HostVeth: fmt.Sprintf("%sn%d", prefix, i),
			IPs:        []string{hostAddr(subnet, 10+i).String(), hostAddr(subnet6, 10+i).String()},
			CgroupRoot: "/knc-" + id + "/" + name,
			Processes:  map[string]*Process{},
		})
	}
	if err := c.save(); err != nil {
		return nil, errors.Join(err, unregister(id))
	}
	c.logf("cluster %s: %d nodes (%s), underlay %s and %s on bridge %s, state in %s",
		id, cfg.Nodes, cfg.Runtime, subnet, subnet6, c.Bridge, dir)
	return c, c.up(ctx, cfg.SkipNRIBridge)
}

func (cfg *Config) check() error {
	if cfg.Dir == "" {
		return errors.New("no cluster directory")
	}
	if cfg.Nodes < 1 || cfg.Nodes > 200 {
		return fmt.Errorf("nodes: %d is not between 1 and 200", cfg.Nodes)
	}
	if cfg.Runtime != RuntimeKnext && cfg.Runtime != RuntimeUpstream {
		return fmt.Errorf("runtime %q is neither %q nor %q", cfg.Runtime, RuntimeKnext, RuntimeUpstream)
	}
	if cfg.ProxyMode != ProxyModeNFTables && cfg.ProxyMode != ProxyModeIPTables {
		return fmt.Errorf("kube-proxy mode %q is neither %q nor %q", cfg.ProxyMode, ProxyModeNFTables, ProxyModeIPTables)
	}
	b := cfg.Binaries
	required := []string{b.Etcd, b.Ctr, b.Runc,
		filepath.Join(b.Containerd, "containerd"), filepath.Join(b.Containerd, "containerd-shim-runc-v2")}
	for _, name := range []string{"kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet", "kube-proxy", "kubectl"} {
		required = append(required, filepath.Join(b.Kubernetes, name))
	}
	if cfg.Runtime == RuntimeUpstream {
		for _, plugin := range []string{"bridge", "host-local", "portmap", "loopback"} {
			required = append(required, filepath.Join(b.CNIBinDir, plugin))
		}
	} else {
		required = append(required, cfg.NRIBridgeManifest)
	}
	required = append(required, cfg.Images...)
	var errs []error
	for _, path := range required {
		if path == "" {
			errs = append(errs, errors.New("a required binary or file is not configured"))
		} else if _, err := os.Stat(path); err != nil {
			errs = append(errs, fmt.Errorf("missing %s", path))
		}
	}
	return errors.Join(errs...)
}

func (c *Cluster) up(ctx context.Context, skipNRIBridge bool) error {
	if err := c.createPKI(); err != nil {
		return fmt.Errorf("PKI: %w", err)
	}
	if err := c.createUnderlay(); err != nil {
		return err
	}
	if err := c.startControlPlane(ctx); err != nil {
		return err
	}
	for _, n := range c.Nodes {
		if err := c.createNode(n); err != nil {
			return fmt.Errorf("node %s: %w", n.Name, err)
		}
		if err := c.bootNode(ctx, n); err != nil {
			return fmt.Errorf("node %s: %w", n.Name, err)
		}
	}
	if err := c.waitPodCIDRs(ctx); err != nil {
		return err
	}
	if err := c.applyAddons(ctx); err != nil {
		return err
	}
	if c.Runtime == RuntimeKnext && skipNRIBridge {
		return nil
	}
	if c.Runtime == RuntimeKnext {
		if err := c.ApplyNRIBridge(ctx); err != nil {
			return err
		}
	}
	return c.WaitReady(ctx)
}

// Down removes everything of the cluster recorded in dir: processes (by PID, then the shims and
// pods of every node's containerd), mount and network namespaces, the underlay, cgroups, the
// registry entry, and the directory. It is idempotent, and works on a partly created cluster.
func Down(dir string, logf func(string, ...any)) error {
	c, err := Load(dir, logf)
	if err != nil {
		if os.IsNotExist(errors.Unwrap(err)) {
			return nil
		}
		return err
	}
	var errs []error // SIGKILL ends a paused cluster's processes too
	for _, n := range c.Nodes {
		errs = append(errs, c.shutdownNode(n))
		errs = append(errs, stack.RemoveCgroupTree(n.CgroupRoot))
	}
	errs = append(errs, stack.RemoveCgroupTree("/knc-"+c.ID))
	errs = append(errs, c.killControlPlane())
	errs = append(errs, deleteNetns(c.ControlPlane.Netns))
	// The veth goes with its namespace only once nothing in the kernel holds that any more.
	errs = append(errs, stack.DeleteLink(c.ControlPlane.HostVeth))
	errs = append(errs, stack.DeleteLink(c.Bridge))
	unmountErr := stack.UnmountUnder(c.Dir)
	errs = append(errs, unmountErr)
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("cluster %s: %w (state kept in %s: run down again)", c.ID, err, c.Dir)
	}
	// Never delete through a mount that is still there: it could reach outside the directory.
	if err := os.RemoveAll(c.Dir); err != nil {
		return err
	}
	c.logf("cluster %s: removed", c.ID)
	return unregister(c.ID)
}

// WaitReady waits until every node is Ready and untainted, and CoreDNS's pods are Ready.
func (c *Cluster) WaitReady(ctx context.Context) error {
	client, err := c.Client()
	if err != nil {
		return err
	}
	c.logf("cluster %s: waiting for %d nodes to be Ready and for CoreDNS", c.ID, len(c.Nodes))
	return poll(ctx, 5*time.Minute, func() error {
		if err := nodesReady(ctx, client, len(c.Nodes)); err != nil {
			return err
		}
		return DeploymentReady(ctx, client, "kube-system", "coredns")
	})
}

// Node returns the node named name, or nil.
func (c *Cluster) Node(name string) *NodeState {
	for _, n := range c.Nodes {
		if n.Name == name {
			return n
		}
	}
	return nil
}

// ControlPlaneURL is the API server's URL on the underlay.
func (c *Cluster) ControlPlaneURL() string {
	return "https://" + c.ControlPlane.IPs[0] + ":6443"
}

func mustPrefix(s string) netip.Prefix {
	return netip.MustParsePrefix(s)
}

// poll is stack.Poll every 200 ms.
func poll(ctx context.Context, timeout time.Duration, check func() error) error {
	return stack.Poll(ctx, timeout, 200*time.Millisecond, check)
}

// tail returns the last n lines of the log at path, headed by the path.
func tail(path string, n int) string {
	return stack.Tail(path, n, nil)
}
