package cluster

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/pelletier/go-toml/v2"
	"sigs.k8s.io/yaml"

	"github.com/knext-dev/knext/internal/pki"
	"github.com/knext-dev/knext/internal/stack"
)

func TestKubeconfigTrustsTheCA(t *testing.T) {
	ca, err := pki.NewAuthority("test CA", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	client, err := ca.Issue(pki.Request{CommonName: "system:node:node-1", Organizations: []string{"system:nodes"}})
	if err != nil {
		t.Fatal(err)
	}
	data, err := kubeconfig(ca, "https://10.200.1.2:6443", "system:node:node-1", client)
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
	if err := yaml.Unmarshal(data, &parsed); err != nil {
		t.Fatal(err)
	}
	if len(parsed.Clusters) != 1 || parsed.Clusters[0].Cluster.Server != "https://10.200.1.2:6443" ||
		string(parsed.Clusters[0].Cluster.CA) != string(ca.PEM) || parsed.CurrentContext == "" {
		t.Errorf("kubeconfig:\n%s", data)
	}
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
