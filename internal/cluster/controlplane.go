package cluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/knext-dev/knext/internal/pki"
	"github.com/knext-dev/knext/internal/stack"
)

// Control-plane users: the certificates' subjects the API server authenticates them as.
const (
	adminUser         = "kubernetes-admin"
	apiserverKubelets = "kube-apiserver-kubelet-client"
)

func (c *Cluster) pkiDir() string          { return filepath.Join(c.Dir, "pki") }
func (c *Cluster) controlPlaneDir() string { return filepath.Join(c.Dir, "control-plane") }

// createPKI writes the CA, the service-account key pair and the control plane's certificates and
// kubeconfigs. Each node's are written by createNode.
func (c *Cluster) createPKI() error {
	dir := c.pkiDir()
	ca, err := pki.NewAuthority("knext-cluster-ca", certValidity)
	if err != nil {
		return err
	}
	if err := ca.Write(dir); err != nil {
		return err
	}
	if err := pki.WriteKeyPair(dir, "sa"); err != nil {
		return err
	}
	ips := []net.IP{net.ParseIP(c.ControlPlane.IPs[0]), net.IPv4(127, 0, 0, 1)}
	for _, cidr := range serviceCIDRs {
		// The first address of each Service range is the `kubernetes` Service's.
		ips = append(ips, mustPrefix(cidr).Addr().Next().AsSlice())
	}
	serving, err := ca.Issue(pki.Request{CommonName: "kube-apiserver", Server: true, IPs: ips,
		DNSNames: []string{"kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local", "localhost"}})
	if err != nil {
		return err
	}
	if err := serving.Write(dir, "apiserver"); err != nil {
		return err
	}
	kubeletClient, err := ca.Issue(pki.Request{CommonName: apiserverKubelets})
	if err != nil {
		return err
	}
	if err := kubeletClient.Write(dir, "apiserver-kubelet-client"); err != nil {
		return err
	}
	kubeconfigs := []struct {
		path, user string
		orgs       []string
	}{
		{c.Kubeconfig(), adminUser, []string{"system:masters"}},
		{filepath.Join(c.controlPlaneDir(), "controller-manager.kubeconfig"), "system:kube-controller-manager", nil},
		{filepath.Join(c.controlPlaneDir(), "scheduler.kubeconfig"), "system:kube-scheduler", nil},
	}
	for _, k := range kubeconfigs {
		if err := c.writeKubeconfig(ca, k.path, k.user, k.orgs); err != nil {
			return err
		}
	}
	c.ca = ca
	return nil
}

// writeKubeconfig writes a kubeconfig for the API server with a new client certificate of user.
func (c *Cluster) writeKubeconfig(ca *pki.Authority, path, user string, orgs []string) error {
	cert, err := ca.Issue(pki.Request{CommonName: user, Organizations: orgs})
	if err != nil {
		return err
	}
	data, err := kubeconfig(ca, c.ControlPlaneURL(), user, cert)
	if err != nil {
		return err
	}
	return pki.WriteSecret(path, data)
}

// certValidity is long enough for a cluster that is kept for a while, short enough to say "test".
const certValidity = 365 * 24 * time.Hour

// kubeconfig returns a kubeconfig for server that authenticates with c and trusts ca.
func kubeconfig(ca *pki.Authority, server, user string, c pki.Certificate) ([]byte, error) {
	return yaml.Marshal(map[string]any{
		"apiVersion": "v1",
		"kind":       "Config",
		"clusters": []any{map[string]any{
			"name":    "knext",
			"cluster": map[string]any{"server": server, "certificate-authority-data": ca.PEM},
		}},
		"users": []any{map[string]any{
			"name": user,
			"user": map[string]any{"client-certificate-data": c.CertPEM, "client-key-data": c.KeyPEM},
		}},
		"contexts": []any{map[string]any{
			"name":    user + "@knext",
			"context": map[string]any{"cluster": "knext", "user": user},
		}},
		"current-context": user + "@knext",
	})
}

// createUnderlay creates the host's bridge and the control plane's network namespace on it.
func (c *Cluster) createUnderlay() error {
	if err := createBridge(c.Bridge, c.underlayAddrs(c.HostIPs)...); err != nil {
		return err
	}
	if err := createNetns(c.ControlPlane.Netns); err != nil {
		return err
	}
	return plugInto(c.Bridge, c.ControlPlane.HostVeth, c.ControlPlane.Netns, c.underlayAddrs(c.ControlPlane.IPs))
}

// underlayAddrs returns ips (IPv4, IPv6) with the underlay's prefix lengths.
func (c *Cluster) underlayAddrs(ips []string) []netip.Prefix {
	var addrs []netip.Prefix
	for i, ip := range ips {
		addrs = append(addrs, netip.PrefixFrom(netip.MustParseAddr(ip), mustPrefix(c.Underlay[i]).Bits()))
	}
	return addrs
}

// controlPlaneProcesses returns the control plane's commands, in start order.
func (c *Cluster) controlPlaneProcesses() []*Process {
	pkiDir, cp, k8s := c.pkiDir(), c.controlPlaneDir(), c.Binaries.Kubernetes
	logs := filepath.Join(cp, "logs")
	process := func(name string, argv ...string) *Process {
		if old := c.ControlPlane.Processes[name]; old != nil {
			return old
		}
		p := &Process{Name: name, Argv: inNamespaces(c.ControlPlane.Netns, "", argv...), Log: filepath.Join(logs, name+".log")}
		c.ControlPlane.Processes[name] = p
		return p
	}
	const etcdURL = "http://127.0.0.1:2379"
	return []*Process{
		process("etcd", c.Binaries.Etcd, "--name=etcd", "--data-dir="+filepath.Join(cp, "etcd"),
			"--listen-client-urls="+etcdURL, "--advertise-client-urls="+etcdURL,
			"--listen-peer-urls=http://127.0.0.1:2380", "--initial-advertise-peer-urls=http://127.0.0.1:2380",
			"--initial-cluster=etcd=http://127.0.0.1:2380", "--log-level=warn"),
		process("kube-apiserver", filepath.Join(k8s, "kube-apiserver"),
			"--etcd-servers="+etcdURL,
			"--advertise-address="+c.ControlPlane.IPs[0], "--secure-port=6443",
			"--tls-cert-file="+filepath.Join(pkiDir, "apiserver.crt"), "--tls-private-key-file="+filepath.Join(pkiDir, "apiserver.key"),
			"--client-ca-file="+filepath.Join(pkiDir, "ca.crt"),
			"--kubelet-client-certificate="+filepath.Join(pkiDir, "apiserver-kubelet-client.crt"),
			"--kubelet-client-key="+filepath.Join(pkiDir, "apiserver-kubelet-client.key"),
			"--kubelet-certificate-authority="+filepath.Join(pkiDir, "ca.crt"),
			"--kubelet-preferred-address-types=InternalIP",
			"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
			"--service-account-key-file="+filepath.Join(pkiDir, "sa.pub"),
			"--service-account-signing-key-file="+filepath.Join(pkiDir, "sa.key"),
			"--service-cluster-ip-range="+strings.Join(serviceCIDRs, ","),
			"--authorization-mode=Node,RBAC", "--enable-admission-plugins=NodeRestriction",
			"--allow-privileged=true", "--profiling=false", "--v=1"),
		process("kube-controller-manager", filepath.Join(k8s, "kube-controller-manager"),
			"--kubeconfig="+filepath.Join(cp, "controller-manager.kubeconfig"),
			"--authentication-kubeconfig="+filepath.Join(cp, "controller-manager.kubeconfig"),
			"--authorization-kubeconfig="+filepath.Join(cp, "controller-manager.kubeconfig"),
			"--bind-address=127.0.0.1", "--leader-elect=false",
			"--allocate-node-cidrs=true", "--cluster-cidr="+strings.Join(podCIDRs, ","),
			fmt.Sprintf("--node-cidr-mask-size-ipv4=%d", nodeCIDRMasks[0]),
			fmt.Sprintf("--node-cidr-mask-size-ipv6=%d", nodeCIDRMasks[1]),
			"--service-cluster-ip-range="+strings.Join(serviceCIDRs, ","),
			"--use-service-account-credentials=true",
			"--service-account-private-key-file="+filepath.Join(pkiDir, "sa.key"),
			"--root-ca-file="+filepath.Join(pkiDir, "ca.crt"),
			"--cluster-signing-cert-file="+filepath.Join(pkiDir, "ca.crt"),
			"--cluster-signing-key-file="+filepath.Join(pkiDir, "ca.key"),
			"--configure-cloud-routes=false", "--profiling=false", "--v=1",
			"--vmodule=endpointslice_controller=4"), // each sync of a Service's EndpointSlices (EndpointSliceSyncs)
		process("kube-scheduler", filepath.Join(k8s, "kube-scheduler"),
			"--kubeconfig="+filepath.Join(cp, "scheduler.kubeconfig"),
			"--authentication-kubeconfig="+filepath.Join(cp, "scheduler.kubeconfig"),
			"--authorization-kubeconfig="+filepath.Join(cp, "scheduler.kubeconfig"),
			"--bind-address=127.0.0.1", "--leader-elect=false", "--profiling=false", "--v=1"),
	}
}

// startControlPlane starts etcd and the API server, waits until the API server is ready, grants
// it the kubelets' API, and starts the controller-manager and the scheduler.
func (c *Cluster) startControlPlane(ctx context.Context) error {
	procs := c.controlPlaneProcesses()
	for _, p := range procs[:2] {
		if err := c.startProcess(p); err != nil {
			return err
		}
	}
	if err := c.waitAPIServer(ctx); err != nil {
		return err
	}
	// The API server's client certificate may use every kubelet's API (logs, exec, port-forward).
	if _, err := c.Kubectl(ctx, nil, "create", "clusterrolebinding", "knext:apiserver-kubelet-client",
		"--clusterrole=system:kubelet-api-admin", "--user="+apiserverKubelets); err != nil && !strings.Contains(err.Error(), "AlreadyExists") {
		return err
	}
	for _, p := range procs[2:] {
		if err := c.startProcess(p); err != nil {
			return err
		}
	}
	return nil
}

// startProcess starts p and records it.
func (c *Cluster) startProcess(p *Process) error {
	c.logf("cluster %s: starting %s (log %s)", c.ID, p.Name, p.Log)
	err := p.start()
	return errors.Join(err, c.save())
}

// waitAPIServer waits until the API server answers /readyz ok, or fails with its log if it exits.
func (c *Cluster) waitAPIServer(ctx context.Context) error {
	apiserver := c.ControlPlane.Processes["kube-apiserver"]
	err := poll(ctx, 2*time.Minute, func() error {
		if !apiserver.running() {
			return stack.Permanent(fmt.Errorf("kube-apiserver exited:\n%s", tail(apiserver.Log, 30)))
		}
		client, err := c.Client()
		if err != nil {
			return err
		}
		body, err := client.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		if err != nil {
			return fmt.Errorf("kube-apiserver /readyz: %w: %s", err, body)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("kube-apiserver not ready: %w\n%s", err, tail(apiserver.Log, 20))
	}
	return nil
}

// RestartAPIServer stops the API server (SIGTERM; SIGKILL after 15 s, as its graceful
// termination can wait longer for clients that keep their connections) and starts it again, then
// waits until it is ready.
func (c *Cluster) RestartAPIServer(ctx context.Context) error {
	apiserver := c.ControlPlane.Processes["kube-apiserver"]
	if err := apiserver.stop(15 * time.Second); errors.Is(err, errKilled) {
		c.logf("cluster %s: %v", c.ID, err)
	} else if err != nil {
		return err
	}
	if err := c.startProcess(apiserver); err != nil {
		return err
	}
	return c.waitAPIServer(ctx)
}

// EndpointSliceSync is one sync of a Service's EndpointSlices by the controller-manager.
type EndpointSliceSync struct {
	Start, End time.Time
	// Failed: the sync failed or found its cache older than its own last write, and is retried
	// after a backoff of a second or more, unless a change of the Service's pods queues it first.
	Failed bool
}

// EndpointSliceSyncs returns the controller-manager's syncs of the EndpointSlices of Service
// namespace/name that ended after from, in order, by its log: it logs each sync of that
// controller (at verbosity 4, set for its file alone) and then, if it failed, its retry.
func (c *Cluster) EndpointSliceSyncs(namespace, name string, from time.Time) ([]EndpointSliceSync, error) {
	log, err := os.ReadFile(c.ControlPlane.Processes["kube-controller-manager"].Log)
	line := regexp.MustCompile(`(?m)^[IWE](\d{4} [\d:.]{15}) .*"(Finished syncing service endpoint slices|Error syncing endpoint ` +
		`slices for service, retrying)".* key="` + regexp.QuoteMeta(namespace+"/"+name) + `"(?: elapsedTime="([^"]+)")?`)
	var syncs []EndpointSliceSync
	for _, m := range line.FindAllSubmatch(log, -1) {
		// klog's header has the local time without the year: from's, or the next one's in January.
		end, parseErr := time.ParseInLocation("0102 15:04:05.000000", string(m[1]), time.Local)
		if end = end.AddDate(from.Year(), 0, 0); end.Before(from.AddDate(0, -6, 0)) {
			end = end.AddDate(1, 0, 0)
		}
		took, durationErr := time.ParseDuration(string(m[3]))
		switch {
		case parseErr != nil || !end.After(from):
		case len(m[3]) > 0 && durationErr == nil:
			syncs = append(syncs, EndpointSliceSync{Start: end.Add(-took), End: end})
		case len(m[3]) == 0 && len(syncs) > 0: // the retry of the sync logged before it
			syncs[len(syncs)-1].Failed = true
		}
	}
	return syncs, err
}

// killControlPlane kills the control plane's processes, last started first: the cluster goes, and
// nothing of their state is kept.
func (c *Cluster) killControlPlane() error {
	var errs []error
	for _, name := range []string{"kube-scheduler", "kube-controller-manager", "kube-apiserver", "etcd"} {
		if p := c.ControlPlane.Processes[name]; p != nil {
			errs = append(errs, p.kill())
		}
	}
	return errors.Join(append(errs, c.save())...)
}

// runInput runs argv with stdin (if not nil) and returns its standard output; an error carries
// the command and its standard error.
func runInput(ctx context.Context, stdin []byte, argv ...string) ([]byte, error) {
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.Bytes(), fmt.Errorf("%s: %w: %s", strings.Join(argv, " "), err, bytes.TrimSpace(stderr.Bytes()))
	}
	return stdout.Bytes(), nil
}

// writeFile writes data to name, creating its directory.
func writeFile(name string, data []byte) error {
	if err := os.MkdirAll(filepath.Dir(name), 0o755); err != nil {
		return err
	}
	return os.WriteFile(name, data, 0o644)
}
