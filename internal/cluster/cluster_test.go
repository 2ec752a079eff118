package cluster

import (
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"

	"github.com/pelletier/go-toml/v2"
	"sigs.k8s.io/yaml"

	"github.com/knext-dev/knext/internal/stack"
)

func TestIssuedCertificatesVerifyAgainstTheCA(t *testing.T) {
	ca, err := newAuthority(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca.cert)
	serving, err := ca.issue(certRequest{commonName: "node-1", dnsNames: []string{"node-1"},
		ips: []net.IP{net.ParseIP("10.200.1.11"), net.ParseIP("fd6b:6e63:ffff:c801::b")}, server: true})
	if err != nil {
		t.Fatal(err)
	}
	cert := parseCert(t, serving.CertPEM)
	for _, host := range []string{"node-1", "10.200.1.11", "fd6b:6e63:ffff:c801::b"} {
		if _, err := cert.Verify(x509.VerifyOptions{DNSName: host, Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
			t.Errorf("serving certificate for %s: %v", host, err)
		}
	}
	if _, err := cert.Verify(x509.VerifyOptions{DNSName: "node-2", Roots: roots}); err == nil {
		t.Error("the serving certificate of node-1 verifies for node-2")
	}
	client, err := ca.issue(certRequest{commonName: "system:node:node-1", organizations: []string{"system:nodes"}})
	if err != nil {
		t.Fatal(err)
	}
	cert = parseCert(t, client.CertPEM)
	if _, err := cert.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Errorf("client certificate: %v", err)
	}
	if _, err := cert.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err == nil {
		t.Error("a client certificate verifies as a serving one")
	}
	if cert.Subject.CommonName != "system:node:node-1" || len(cert.Subject.Organization) != 1 || cert.Subject.Organization[0] != "system:nodes" {
		t.Errorf("client certificate subject %v, want CN system:node:node-1, O system:nodes", cert.Subject)
	}
	kubeconfig, err := ca.kubeconfig("https://10.200.1.2:6443", "system:node:node-1", client)
	if err != nil {
		t.Fatal(err)
	}
	var parsed struct {
		Clusters []struct {
			Cluster struct {
				Server string `json:"server"`
				CA     []byte `json:"certificate-authority-data"`
			} `json:"cluster"`
		} `json:"clusters"`
		CurrentContext string `json:"current-context"`
	}
	if err := yaml.Unmarshal(kubeconfig, &parsed); err != nil {
		t.Fatal(err)
	}
	if len(parsed.Clusters) != 1 || parsed.Clusters[0].Cluster.Server != "https://10.200.1.2:6443" ||
		string(parsed.Clusters[0].Cluster.CA) != string(ca.pem) || parsed.CurrentContext == "" {
		t.Errorf("kubeconfig:\n%s", kubeconfig)
	}
}

func parseCert(t *testing.T, data []byte) *x509.Certificate {
	t.Helper()
	block, _ := pem.Decode(data)
	if block == nil {
		t.Fatalf("no PEM in %q", data)
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return cert
}

func TestUnderlayAddresses(t *testing.T) {
	subnet := netip.MustParsePrefix("10.200.135.0/24")
	if got, want := underlay6(subnet).String(), "fd6b:6e63:ffff:c887::/64"; got != want {
		t.Errorf("underlay6(%s) = %s, want %s", subnet, got, want)
	}
	if got := hostAddr(subnet, 11).String(); got != "10.200.135.11" {
		t.Errorf("hostAddr = %s", got)
	}
	if got := hostAddr(underlay6(subnet), 11).String(); got != "fd6b:6e63:ffff:c887::b" {
		t.Errorf("hostAddr v6 = %s", got)
	}
	used := []netip.Prefix{netip.MustParsePrefix("10.200.0.0/16")}
	if !overlapsAny(subnet, used) || overlapsAny(netip.MustParsePrefix("10.201.0.0/24"), used) {
		t.Error("overlapsAny")
	}
}

// The nodes' containerd runs without CNI and follows nri-bridge in knext mode, and renders the
// baseline's CNI network from its template; both keep the OOM score of this VM.
func TestContainerdConfig(t *testing.T) {
	for runtime, want := range map[string]map[string]any{
		RuntimeKnext:    {"disable_cni": true, "network_plugin": stack.NRIBridgePlugin},
		RuntimeUpstream: {"conf_template": "/etc/containerd/cni.template", "conf_dir": "/etc/cni/net.d"},
	} {
		c := &Cluster{State: State{Runtime: runtime, Binaries: Binaries{Runc: "/usr/local/bin/runc", CNIBinDir: "/usr/lib/cni"}}}
		data, err := c.containerdConfig()
		if err != nil {
			t.Fatal(err)
		}
		var config struct {
			Version int                       `toml:"version"`
			Plugins map[string]map[string]any `toml:"plugins"`
		}
		if err := toml.Unmarshal(data, &config); err != nil {
			t.Fatal(err)
		}
		cri := config.Plugins["io.containerd.cri.v1.runtime"]
		cni, _ := cri["cni"].(map[string]any)
		for key, value := range want {
			if cni[key] != value {
				t.Errorf("%s: cni.%s = %v, want %v\n%s", runtime, key, cni[key], value, data)
			}
		}
		if runtime == RuntimeUpstream && cni["disable_cni"] != nil {
			t.Errorf("upstream: disable_cni is set:\n%s", data)
		}
		if cri["restrict_oom_score_adj"] != true {
			t.Errorf("%s: restrict_oom_score_adj is not true", runtime)
		}
		// Version 4 reads the addresses from the server plugins only.
		if config.Version != stack.ConfigVersion || config.Plugins["io.containerd.server.v1.grpc"]["address"] != "/run/containerd/containerd.sock" ||
			config.Plugins["io.containerd.server.v1.metrics"]["address"] != fmt.Sprintf(":%d", ContainerdMetricsPort) {
			t.Errorf("%s: version %d, want %d with the gRPC socket and the metrics endpoint in the server plugins:\n%s",
				runtime, config.Version, stack.ConfigVersion, data)
		}
	}
	if !strings.Contains(cniTemplate, `"ipMasq": false`) || !strings.Contains(cniTemplate, `"hairpinMode": true`) {
		t.Error("the baseline's CNI network must not masquerade and must hairpin")
	}
}
