package cluster

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/pelletier/go-toml/v2"
	"golang.org/x/sync/errgroup"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	criruntime "k8s.io/cri-api/pkg/apis/runtime/v1"
	"sigs.k8s.io/yaml"

	"github.com/knext-dev/knext/internal/kubelethost"
	"github.com/knext-dev/knext/internal/ociimage"
	"github.com/knext-dev/knext/internal/pki"
	"github.com/knext-dev/knext/internal/stack"
)

// ContainerdMetricsPort is where every node's containerd serves its metrics (/v1/metrics) on the
// node's IPs.
const ContainerdMetricsPort = 1338

// The sysctls of a node's network namespace: it routes between its pods, the underlay and the
// other nodes, and its pod bridge's traffic passes the node's netfilter rules (kube-proxy's
// Services answered from a pod on the same bridge).
var nodeSysctls = map[string]string{
	"net.ipv4.ip_forward":                 "1",
	"net.ipv6.conf.all.forwarding":        "1",
	"net.bridge.bridge-nf-call-iptables":  "1",
	"net.bridge.bridge-nf-call-ip6tables": "1",
}

// A node's directories on the host, bound over the node's own /run, /var/lib, /var/log and
// (overlaid) /etc in its mount namespace: inside, every program finds its files where it would
// on a real node.
func (n *NodeState) runDir() string    { return filepath.Join(n.Dir, "run") }
func (n *NodeState) varLibDir() string { return filepath.Join(n.Dir, "var-lib") }
func (n *NodeState) varLogDir() string { return filepath.Join(n.Dir, "var-log") }
func (n *NodeState) etcDir() string    { return filepath.Join(n.Dir, "etc", "upper") }
func (n *NodeState) logDir() string    { return filepath.Join(n.Dir, "logs") }

// ContainerdSocket is the node's containerd socket as the host sees it.
func (n *NodeState) ContainerdSocket() string {
	return filepath.Join(n.runDir(), "containerd", "containerd.sock")
}

// NRISocket is the node's NRI socket (/var/run/nri/nri.sock inside the node) as the host sees it.
func (n *NodeState) NRISocket() string {
	return filepath.Join(n.runDir(), "nri", "nri.sock")
}

// mountNamespaceScript runs in the node's new mount namespace (every mount in it private, so
// nothing reaches the host): $1 is the cluster directory, $2 the node's. It binds the node's own
// directories over /run, /var/lib and /var/log, overlays the node's /etc on the host's, covers
// the sysctls the kubelet checks with files of the values it wants, drops the copy of the cluster
// directory (other nodes' mounts) from the namespace, and makes the node's mounts shared among
// themselves.
const mountNamespaceScript = `set -eu
cluster=$1 node=$2
for file in "$node"/sysctl/*; do
	mount --bind -o ro "$file" "/proc/sys/$(basename "$file" | tr . /)"
done
# The host's /run holds other programs' mounts (network namespaces among them): detach their
# copies, deepest first (a lazy unmount takes the mounts below along: those fail, and may).
awk '$5 == "/run" || index($5, "/run/") == 1 { print $5 }' /proc/self/mountinfo | sort -r |
	while read -r target; do umount -l "$target" 2>/dev/null || true; done
mount --bind "$node/run" /run
mount --bind "$node/var-lib" /var/lib
mount --bind "$node/var-log" /var/log
mount -t overlay -o "lowerdir=/etc,upperdir=$node/etc/upper,workdir=$node/etc/work" knext-node /etc
umount -l "$cluster"
# As on a machine that systemd booted, every mount is shared, within the node: a pod's volume
# with mountPropagation (nri-bridge's /var/run/netns) receives the mounts made later below it.
mount --make-rshared /
`

// nodeFiles are the node's configuration files, by their path inside the node (all in /etc).
func (c *Cluster) nodeFiles(n *NodeState) (map[string][]byte, error) {
	containerd, err := c.containerdConfig()
	if err != nil {
		return nil, err
	}
	kubeletConfig, err := c.kubeletConfig(n)
	if err != nil {
		return nil, err
	}
	proxyConfig, err := yaml.Marshal(map[string]any{
		"apiVersion":         "kubeproxy.config.k8s.io/v1alpha1",
		"kind":               "KubeProxyConfiguration",
		"mode":               c.ProxyMode,
		"hostnameOverride":   n.Name,
		"clusterCIDR":        strings.Join(podCIDRs, ","),
		"clientConnection":   map[string]any{"kubeconfig": "/etc/kubernetes/kube-proxy.kubeconfig"},
		"metricsBindAddress": "127.0.0.1:10249",
		// The conntrack table size is the host's, shared by every namespace: leave it alone.
		"conntrack": map[string]any{"maxPerCore": 0, "tcpEstablishedTimeout": "0s", "tcpCloseWaitTimeout": "0s"},
	})
	if err != nil {
		return nil, err
	}
	files := map[string][]byte{
		"/etc/containerd/config.toml":     containerd,
		"/etc/kubernetes/kubelet.yaml":    kubeletConfig,
		"/etc/kubernetes/kube-proxy.yaml": proxyConfig,
		// No upstream resolver is reachable: pods with dnsPolicy Default get none.
		"/etc/resolv.conf": nil,
	}
	if c.Runtime == RuntimeUpstream {
		files["/etc/containerd/cni.template"] = []byte(cniTemplate)
	}
	return files, nil
}

// cniTemplate is the baseline's CNI network, which containerd writes into /etc/cni/net.d once the
// kubelet reports the node's pod CIDRs: no masquerade (pod traffic between nodes keeps its source;
// the runner routes the other nodes' pod CIDRs), hairpin for a pod reaching itself through a
// Service, hostPorts by portmap.
const cniTemplate = `{
  "cniVersion": "1.0.0",
  "name": "cluster",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "cni0",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "ranges": [{{range $i, $r := .PodCIDRRanges}}{{if $i}}, {{end}}[{"subnet": "{{$r}}"}]{{end}}],
        "routes": [{{range $i, $r := .Routes}}{{if $i}}, {{end}}{"dst": "{{$r}}"}{{end}}]
      }
    },
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
`

// containerdConfig is every node's containerd configuration (paths inside the node).
func (c *Cluster) containerdConfig() ([]byte, error) {
	cni := stack.CNILessCNI(stack.NRIBridgePlugin)
	if c.Runtime == RuntimeUpstream {
		cni = map[string]any{"bin_dirs": []string{c.Binaries.CNIBinDir}, "conf_dir": "/etc/cni/net.d",
			"conf_template": "/etc/containerd/cni.template", "max_conf_num": 1}
	}
	runtime := stack.RuntimeConfig(c.Binaries.Runc)
	runtime["cni"] = cni
	return toml.Marshal(map[string]any{
		"version": stack.ConfigVersion,
		"root":    "/var/lib/containerd",
		"state":   "/run/containerd",
		"plugins": map[string]any{
			// Version 4 reads the sockets and the metrics endpoint from the server plugins only.
			"io.containerd.server.v1.grpc":    map[string]any{"address": "/run/containerd/containerd.sock"},
			"io.containerd.server.v1.ttrpc":   map[string]any{"address": "/run/containerd/containerd.sock.ttrpc"},
			"io.containerd.server.v1.metrics": map[string]any{"address": fmt.Sprintf(":%d", ContainerdMetricsPort)},
			"io.containerd.cri.v1.runtime":    runtime,
			// Images come from archives, never from a registry.
			"io.containerd.cri.v1.images": map[string]any{"pinned_images": map[string]any{"sandbox": ociimage.PauseImage}},
			"io.containerd.nri.v1.nri":    map[string]any{"disable": false, "socket_path": "/var/run/nri/nri.sock"},
			// Upstream's default /opt/containerd is the host's.
			"io.containerd.internal.v1.opt": map[string]any{"path": "/var/lib/containerd-opt"},
		},
	})
}

// kubeletConfig is the node's KubeletConfiguration.
func (c *Cluster) kubeletConfig(n *NodeState) ([]byte, error) {
	// The settings of a kubelet that shares this kind of machine (cgroupfs, no iptables chains,
	// oomScoreAdj 0, sysctls checked, images never collected) are test/kubelet's.
	config := map[string]any{
		"apiVersion":               "kubelet.config.k8s.io/v1beta1",
		"kind":                     "KubeletConfiguration",
		"containerRuntimeEndpoint": "unix:///run/containerd/containerd.sock",
		"authentication": map[string]any{
			"anonymous": map[string]any{"enabled": false},
			"webhook":   map[string]any{"enabled": true},
			"x509":      map[string]any{"clientCAFile": "/etc/kubernetes/pki/ca.crt"},
		},
		"authorization":     map[string]any{"mode": "Webhook"},
		"tlsCertFile":       "/etc/kubernetes/pki/kubelet.crt",
		"tlsPrivateKeyFile": "/etc/kubernetes/pki/kubelet.key",
		"clusterDomain":     "cluster.local",
		"clusterDNS":        dnsServiceIPs,
		"resolvConf":        "/etc/resolv.conf",
		"readOnlyPort":      0,
		"cgroupRoot":        n.CgroupRoot,
		"volumePluginDir":   "/var/lib/kubelet/volume-plugins",
	}
	maps.Copy(config, kubelethost.HostSettings())
	return yaml.Marshal(config)
}

// createNode writes the node's directories, certificates, kubeconfigs and configuration, and
// creates its cgroup root.
func (c *Cluster) createNode(n *NodeState) error {
	for _, dir := range []string{n.runDir(), n.varLibDir(), n.varLogDir(), n.etcDir(), filepath.Join(n.Dir, "etc", "work"),
		filepath.Join(n.Dir, "sysctl"), n.logDir(), filepath.Dir(n.MountNS),
		// Host paths of nri-bridge's DaemonSet that must exist before it starts.
		filepath.Join(n.etcDir(), "nri-bridge")} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
	}
	for name, value := range kubelethost.KernelDefaults {
		if err := os.WriteFile(filepath.Join(n.Dir, "sysctl", name), []byte(strconv.Itoa(value)+"\n"), 0o444); err != nil {
			return err
		}
	}
	pkiDir := filepath.Join(n.etcDir(), "kubernetes", "pki")
	if err := pki.WriteSecret(filepath.Join(pkiDir, "ca.crt"), c.ca.PEM); err != nil {
		return err
	}
	var ips []net.IP
	for _, ip := range n.IPs {
		ips = append(ips, net.ParseIP(ip))
	}
	serving, err := c.ca.Issue(pki.Request{CommonName: n.Name, DNSNames: []string{n.Name}, IPs: ips, Server: true})
	if err != nil {
		return err
	}
	if err := serving.Write(pkiDir, "kubelet"); err != nil {
		return err
	}
	kubeconfigs := map[string]string{"kubelet.kubeconfig": "system:node:" + n.Name, "kube-proxy.kubeconfig": "system:kube-proxy"}
	for file, user := range kubeconfigs {
		var orgs []string
		if strings.HasPrefix(user, "system:node:") {
			orgs = []string{"system:nodes"}
		}
		if err := c.writeKubeconfig(c.ca, filepath.Join(n.etcDir(), "kubernetes", file), user, orgs); err != nil {
			return err
		}
	}
	files, err := c.nodeFiles(n)
	if err != nil {
		return err
	}
	for name, data := range files {
		if err := writeFile(filepath.Join(n.etcDir(), strings.TrimPrefix(name, "/etc/")), data); err != nil {
			return err
		}
	}
	return kubelethost.CreateCgroup(n.CgroupRoot)
}

// nodeProcesses returns the node's commands, in start order: containerd, kubelet, kube-proxy.
func (c *Cluster) nodeProcesses(n *NodeState) []*Process {
	process := func(name string, env []string, argv ...string) *Process {
		if old := n.Processes[name]; old != nil {
			return old
		}
		p := &Process{Name: n.Name + "/" + name, Argv: inNamespaces(n.Netns, n.MountNS, argv...), Env: env,
			Log: filepath.Join(n.logDir(), name+".log")}
		n.Processes[name] = p
		return p
	}
	k8s := c.Binaries.Kubernetes
	return []*Process{
		// The shim next to containerd comes first in its PATH.
		process("containerd", []string{"PATH=" + c.Binaries.Containerd + ":/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
			filepath.Join(c.Binaries.Containerd, "containerd"), "--config", "/etc/containerd/config.toml"),
		process("kubelet", nil, filepath.Join(k8s, "kubelet"), "--config", "/etc/kubernetes/kubelet.yaml",
			"--kubeconfig", "/etc/kubernetes/kubelet.kubeconfig", "--hostname-override", n.Name,
			"--node-ip", strings.Join(n.IPs, ","), "--v", "2"),
		process("kube-proxy", nil, filepath.Join(k8s, "kube-proxy"), "--config", "/etc/kubernetes/kube-proxy.yaml", "--v", "2"),
	}
}

// bootNode brings the node up from its state, as a machine boots: its network namespace on the
// underlay, its mount namespace, containerd (images imported once), the kubelet (registered with
// the API server) and kube-proxy.
func (c *Cluster) bootNode(ctx context.Context, n *NodeState) error {
	if err := createNetns(n.Netns); err != nil {
		return err
	}
	if err := plugInto(c.Bridge, n.HostVeth, n.Netns, c.underlayAddrs(n.IPs)); err != nil {
		return err
	}
	if err := setSysctls(n.Netns, nodeSysctls); err != nil {
		return err
	}
	if err := addOnLinkRoutes(n.Netns, serviceCIDRs); err != nil {
		return err
	}
	if err := c.addPodRoutes(n); err != nil {
		return err
	}
	if err := c.createMountNamespace(n); err != nil {
		return err
	}
	procs := c.nodeProcesses(n)
	if err := c.startProcess(procs[0]); err != nil {
		return err
	}
	if err := c.waitContainerd(ctx, n, procs[0]); err != nil {
		return err
	}
	if err := c.importImages(ctx, n); err != nil {
		return err
	}
	for _, p := range procs[1:] {
		if err := c.startProcess(p); err != nil {
			return err
		}
	}
	return c.waitNodeRegistered(ctx, n)
}

// createMountNamespace mounts the node's /run (a tmpfs of its own: a boot starts with an empty
// one) and creates the node's mount namespace bound at n.MountNS.
func (c *Cluster) createMountNamespace(n *NodeState) error {
	// unshare --mount=FILE needs FILE on a mount that does not propagate: the cluster directory is
	// a private mount of its own.
	if err := privateMount(c.Dir); err != nil {
		return err
	}
	if err := unix.Mount("knext-node-run", n.runDir(), "tmpfs", 0, "mode=0755,size=256m"); err != nil {
		return fmt.Errorf("mount %s: %w", n.runDir(), err)
	}
	if err := os.WriteFile(n.MountNS, nil, 0o644); err != nil {
		return err
	}
	if _, err := runInput(context.Background(), nil, "unshare", "--mount="+n.MountNS, "--propagation", "private",
		"--", "/bin/sh", "-c", mountNamespaceScript, "node-mounts", c.Dir, n.Dir); err != nil {
		return fmt.Errorf("mount namespace: %w", err)
	}
	return nil
}

// privateMount bind-mounts dir onto itself, unless it is a mount already, and makes it private.
func privateMount(dir string) error {
	mounted, err := isMountPoint(dir)
	if err != nil {
		return err
	}
	if !mounted {
		if err := unix.Mount(dir, dir, "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("bind-mount %s onto itself: %w", dir, err)
		}
	}
	if err := unix.Mount("", dir, "", unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make %s private: %w", dir, err)
	}
	return nil
}

func isMountPoint(dir string) (bool, error) {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return false, err
	}
	for line := range strings.SplitSeq(string(data), "\n") {
		if fields := strings.Fields(line); len(fields) > 4 && fields[4] == dir {
			return true, nil
		}
	}
	return false, nil
}

// CRI connects to the node's containerd; call the returned function to close the connection.
func (n *NodeState) CRI() (criruntime.RuntimeServiceClient, criruntime.ImageServiceClient, func() error, error) {
	conn, err := grpc.NewClient("unix://"+n.ContainerdSocket(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, nil, nil, err
	}
	return criruntime.NewRuntimeServiceClient(conn), criruntime.NewImageServiceClient(conn), conn.Close, nil
}

// RemoveGoneSandboxes waits until the kubelet has stopped the sandbox of every pod of namespace
// that the API no longer holds, and removes the node's stopped sandboxes of namespace, 8 at a
// time, until none is left: what deleted pods leave behind on the node, and what the kubelet
// would otherwise stop and collect later. A pod deleted without a grace period leaves the API at
// once, long before the kubelet has stopped it. Only the kubelet's sandboxes count (those with a
// pod UID); a static pod's would never match its mirror pod's UID.
func (n *NodeState) RemoveGoneSandboxes(ctx context.Context, client kubernetes.Interface, namespace string) error {
	rt, _, closeConn, err := n.CRI()
	if err != nil {
		return err
	}
	defer closeConn()
	return stack.Poll(ctx, 5*time.Minute, time.Second, func() error {
		pods, err := client.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + n.Name})
		if err != nil {
			return err
		}
		inAPI := map[string]bool{}
		for _, pod := range pods.Items {
			inAPI[string(pod.UID)] = true
		}
		resp, err := rt.ListPodSandbox(ctx, &criruntime.ListPodSandboxRequest{Filter: &criruntime.PodSandboxFilter{
			LabelSelector: map[string]string{"io.kubernetes.pod.namespace": namespace}}})
		if err != nil {
			return err
		}
		stopped, stopping := goneSandboxes(resp.GetItems(), inAPI)
		var g errgroup.Group
		g.SetLimit(8)
		for _, id := range stopped {
			g.Go(func() error { // what fails is listed again, its error returned meanwhile
				_, err := rt.RemovePodSandbox(ctx, &criruntime.RemovePodSandboxRequest{PodSandboxId: id})
				return err
			})
		}
		if err := g.Wait(); err != nil || len(stopped) > 0 || len(stopping) > 0 {
			return errors.Join(fmt.Errorf("%s: namespace %s: the sandboxes of %d deleted pods not stopped yet by the kubelet %v, %d stopped ones to remove",
				n.Name, namespace, len(stopping), stopping, len(stopped)), err)
		}
		return nil
	})
}

// goneSandboxes sorts a node's sandboxes: the IDs of the stopped ones, to remove, and the names of
// the ready ones whose pod the API no longer holds (inAPI, by pod UID), still to be stopped by the
// kubelet. A sandbox without a pod UID is not the kubelet's: it is neither.
func goneSandboxes(sandboxes []*criruntime.PodSandbox, inAPI map[string]bool) (stopped, stopping []string) {
	for _, sandbox := range sandboxes {
		switch uid := sandbox.GetMetadata().GetUid(); {
		case sandbox.GetState() == criruntime.PodSandboxState_SANDBOX_NOTREADY:
			stopped = append(stopped, sandbox.GetId())
		case uid != "" && !inAPI[uid]:
			stopping = append(stopping, sandbox.GetMetadata().GetName())
		}
	}
	return stopped, stopping
}

// waitContainerd waits until the node's containerd answers CRI with RuntimeReady (the network
// becomes ready later: with CNI once the kubelet reports the pod CIDRs, without once nri-bridge
// runs).
func (c *Cluster) waitContainerd(ctx context.Context, n *NodeState, p *Process) error {
	rt, _, closeConn, err := n.CRI()
	if err != nil {
		return err
	}
	defer closeConn()
	return poll(ctx, time.Minute, func() error {
		if !p.running() {
			return stack.Permanent(fmt.Errorf("%s exited:\n%s", p.Name, tail(p.Log, 30)))
		}
		callCtx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		resp, err := rt.Status(callCtx, &criruntime.StatusRequest{})
		if err != nil {
			return fmt.Errorf("%s: %w", p.Name, err)
		}
		for _, cond := range resp.GetStatus().GetConditions() {
			if cond.Type == criruntime.RuntimeReady && !cond.Status {
				return fmt.Errorf("%s: RuntimeReady is false: %s %s", p.Name, cond.Reason, cond.Message)
			}
		}
		return nil
	})
}

// importImages imports the cluster's image archives into the node's containerd unless CRI knows
// every image of an archive already (a rebooted node keeps its images).
func (c *Cluster) importImages(ctx context.Context, n *NodeState) error {
	_, images, closeConn, err := n.CRI()
	if err != nil {
		return err
	}
	defer closeConn()
	unknown := func(name string) bool {
		resp, err := images.ImageStatus(ctx, &criruntime.ImageStatusRequest{Image: &criruntime.ImageSpec{Image: name}})
		return err != nil || resp.GetImage() == nil
	}
	for _, archive := range c.Images {
		names, err := ociimage.ImageNames(archive)
		if err != nil {
			return err
		}
		if !slices.ContainsFunc(names, unknown) {
			continue
		}
		if err := c.importImage(ctx, n, archive); err != nil {
			return err
		}
	}
	return nil
}

// ImportImage imports an image archive into the node's containerd, as `ctr -n k8s.io images
// import` does on a real node: the images of a new version of an add-on, for example.
func (c *Cluster) ImportImage(ctx context.Context, node, archive string) error {
	n := c.Node(node)
	if n == nil {
		return fmt.Errorf("no node %s", node)
	}
	return c.importImage(ctx, n, archive)
}

func (c *Cluster) importImage(ctx context.Context, n *NodeState, archive string) error {
	if _, err := runInput(ctx, nil, c.Binaries.Ctr, "--address", n.ContainerdSocket(), "--namespace", stack.Namespace,
		"images", "import", archive); err != nil {
		return fmt.Errorf("node %s: import %s: %w", n.Name, archive, err)
	}
	return nil
}

// waitNodeRegistered waits until the node's kubelet has registered the Node.
func (c *Cluster) waitNodeRegistered(ctx context.Context, n *NodeState) error {
	client, err := c.Client()
	if err != nil {
		return err
	}
	kubeletProcess := n.Processes["kubelet"]
	return poll(ctx, 2*time.Minute, func() error {
		if !kubeletProcess.running() {
			return stack.Permanent(fmt.Errorf("%s exited:\n%s", kubeletProcess.Name, tail(kubeletProcess.Log, 30)))
		}
		_, err := client.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
		if err != nil {
			return fmt.Errorf("node %s not registered: %w", n.Name, err)
		}
		return nil
	})
}

// waitPodCIDRs waits until the controller-manager has given every node its pod CIDRs, records
// them, and routes them: in the control plane's network namespace (it is no node: nothing else
// routes its answers to pods there, a pod reaching the API server through the kubernetes Service
// among them) and, in the baseline, on every other node.
func (c *Cluster) waitPodCIDRs(ctx context.Context) error {
	client, err := c.Client()
	if err != nil {
		return err
	}
	if err := poll(ctx, 2*time.Minute, func() error {
		for _, n := range c.Nodes {
			node, err := client.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if len(node.Spec.PodCIDRs) != len(podCIDRs) {
				return fmt.Errorf("node %s has pod CIDRs %v, want one of each family", n.Name, node.Spec.PodCIDRs)
			}
			n.PodCIDRs = node.Spec.PodCIDRs
		}
		return nil
	}); err != nil {
		return err
	}
	if err := c.save(); err != nil {
		return err
	}
	for _, n := range c.Nodes {
		if err := routePodCIDRs(c.ControlPlane.Netns, n); err != nil {
			return err
		}
		if err := c.addPodRoutes(n); err != nil {
			return err
		}
	}
	return nil
}

// addPodRoutes routes, in the baseline, every other node's pod CIDRs in n's network namespace
// (knext's nri-bridge keeps these routes itself).
func (c *Cluster) addPodRoutes(n *NodeState) error {
	if c.Runtime != RuntimeUpstream {
		return nil
	}
	for _, other := range c.Nodes {
		if other != n {
			if err := routePodCIDRs(n.Netns, other); err != nil {
				return err
			}
		}
	}
	return nil
}

// routePodCIDRs routes node's pod CIDRs via its IP of the same family in the network namespace
// netnsName.
func routePodCIDRs(netnsName string, node *NodeState) error {
	for _, cidr := range node.PodCIDRs {
		dst := mustPrefix(cidr)
		for _, ip := range node.IPs {
			if gw := netip.MustParseAddr(ip); gw.Is4() == dst.Addr().Is4() {
				if err := replaceRoute(netnsName, dst, gw); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// shutdownNode stops everything of the node as a power cut would: its processes (kube-proxy,
// kubelet and containerd by PID, containerd's shims, every process in the node's pod cgroups),
// its mount namespace and /run, and its network namespace (pods' interfaces, its routes and
// firewall rules go with it). Its directories are kept: bootNode starts it again from them.
func (c *Cluster) shutdownNode(n *NodeState) error {
	var errs []error
	for _, name := range []string{"kube-proxy", "kubelet", "containerd"} {
		if p := n.Processes[name]; p != nil {
			errs = append(errs, p.kill())
		}
	}
	errs = append(errs, stack.KillInMountNamespace(n.MountNS))
	errs = append(errs, stack.KillCgroupTree(n.CgroupRoot))
	errs = append(errs, stack.UnmountUnder(n.MountNS))
	errs = append(errs, stack.UnmountUnder(n.runDir()))
	errs = append(errs, deleteNetns(n.Netns))
	errs = append(errs, stack.DeleteLink(n.HostVeth))
	errs = append(errs, c.save())
	return errors.Join(errs...)
}

// RestartNode restarts the whole node: shutdownNode, then bootNode from its state.
func (c *Cluster) RestartNode(ctx context.Context, name string) error {
	n := c.Node(name)
	if n == nil {
		return fmt.Errorf("no node %s", name)
	}
	c.logf("cluster %s: restarting node %s", c.ID, name)
	if err := c.shutdownNode(n); err != nil {
		return err
	}
	return c.bootNode(ctx, n)
}

// RestartProcess stops the node's process component ("containerd", "kubelet", "kube-proxy") with
// SIGTERM and starts it again.
func (c *Cluster) RestartProcess(ctx context.Context, node, component string) error {
	n := c.Node(node)
	if n == nil || n.Processes[component] == nil {
		return fmt.Errorf("no process %s on node %s", component, node)
	}
	p := n.Processes[component]
	if err := p.stop(30 * time.Second); err != nil {
		return err
	}
	if err := c.startProcess(p); err != nil {
		return err
	}
	if component == "containerd" {
		return c.waitContainerd(ctx, n, p)
	}
	return nil
}

// Crictl runs crictl against the node's containerd and returns its standard output.
func (c *Cluster) Crictl(ctx context.Context, node string, args ...string) ([]byte, error) {
	n := c.Node(node)
	if n == nil {
		return nil, fmt.Errorf("no node %s", node)
	}
	endpoint := "unix://" + n.ContainerdSocket()
	return runInput(ctx, nil, append([]string{"crictl", "--runtime-endpoint", endpoint, "--image-endpoint", endpoint, "--timeout", "30s"}, args...)...)
}
