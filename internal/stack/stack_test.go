package stack

import (
	"encoding/json"
	"net"
	"strings"
	"testing"

	"github.com/pelletier/go-toml/v2"
)

func TestContainerdConfigMergesExtraConfig(t *testing.T) {
	h := &Stack{Root: "/r", Address: "/r/c.sock", NRISocket: "/r/nri.sock", opts: Options{
		LogLevel: "info", Runc: "/usr/local/bin/runc",
		ExtraConfig: "[plugins.'io.containerd.nri.v1.nri']\nplugin_request_timeout = '50ms'\n" +
			CNILessConfig(NRIBridgePlugin),
	}}
	data, err := h.containerdConfig()
	if err != nil {
		t.Fatal(err)
	}
	var config struct {
		Version int `toml:"version"`
		Plugins struct {
			GRPC struct {
				Address string `toml:"address"`
			} `toml:"io.containerd.server.v1.grpc"`
			NRI struct {
				SocketPath     string `toml:"socket_path"`
				RequestTimeout string `toml:"plugin_request_timeout"`
			} `toml:"io.containerd.nri.v1.nri"`
			Runtime struct {
				RestrictOOMScoreAdj bool `toml:"restrict_oom_score_adj"`
				CNI                 struct {
					DisableCNI    bool     `toml:"disable_cni"`
					NetworkPlugin string   `toml:"network_plugin"`
					BinDirs       []string `toml:"bin_dirs"`
				} `toml:"cni"`
			} `toml:"io.containerd.cri.v1.runtime"`
		} `toml:"plugins"`
	}
	if err := toml.Unmarshal(data, &config); err != nil {
		t.Fatalf("generated config is not TOML: %v\n%s", err, data)
	}
	nri, runtime := config.Plugins.NRI, config.Plugins.Runtime
	if nri.RequestTimeout != "50ms" || nri.SocketPath != "/r/nri.sock" {
		t.Errorf("NRI config %+v: want the extra timeout 50ms next to the generated socket /r/nri.sock", nri)
	}
	if !runtime.CNI.DisableCNI || runtime.CNI.NetworkPlugin != NRIBridgePlugin || len(runtime.CNI.BinDirs) != 1 || !runtime.RestrictOOMScoreAdj {
		t.Errorf("CRI runtime config %+v: want the extra disable_cni and network_plugin %q merged into the generated table", runtime, NRIBridgePlugin)
	}
	// Version 4 reads the socket from the server plugin only.
	if config.Version != ConfigVersion || config.Plugins.GRPC.Address != "/r/c.sock" {
		t.Errorf("config version %d, gRPC server plugin address %q: want %d and /r/c.sock", config.Version, config.Plugins.GRPC.Address, ConfigVersion)
	}
}

// Without a network plugin, NetworkReady follows any plugin: no network_plugin key at all.
func TestCNILessConfigWithoutNetworkPlugin(t *testing.T) {
	var config map[string]map[string]map[string]map[string]any
	if err := toml.Unmarshal([]byte(CNILessConfig("")), &config); err != nil {
		t.Fatal(err)
	}
	cni := config["plugins"][criRuntimePlugin]["cni"]
	if _, ok := cni["network_plugin"]; ok || cni["disable_cni"] != true {
		t.Errorf("CNILessConfig(\"\") has cni table %v, want disable_cni and no network_plugin", cni)
	}
}

func TestContainerdConfigRejectsInvalidExtraConfig(t *testing.T) {
	h := &Stack{opts: Options{ExtraConfig: "[plugins"}}
	if _, err := h.containerdConfig(); err == nil || !strings.Contains(err.Error(), "ExtraConfig") {
		t.Errorf("invalid ExtraConfig gave error %v, want one naming ExtraConfig", err)
	}
}

func TestPickSubnetAvoidsUsedNetworks(t *testing.T) {
	// Everything of the pool but 10.250.7.0/24 is taken, partly by a wider route.
	var used []*net.IPNet
	for _, cidr := range []string{"10.240.0.0/13", "10.248.0.0/15", "10.251.0.0/16", "10.252.0.0/14",
		"10.250.0.0/22", "10.250.4.0/23", "10.250.6.0/24", "10.250.8.0/21", "10.250.16.0/20",
		"10.250.32.0/19", "10.250.64.0/18", "10.250.128.0/17"} {
		_, n, err := net.ParseCIDR(cidr)
		if err != nil {
			t.Fatal(err)
		}
		used = append(used, n)
	}
	got, err := pickSubnet(used)
	if err != nil || got.String() != "10.250.7.0/24" {
		t.Fatalf("pickSubnet = %v, %v; want the only free subnet 10.250.7.0/24", got, err)
	}
	_, whole, _ := net.ParseCIDR("10.0.0.0/8")
	if got, err := pickSubnet([]*net.IPNet{whole}); err == nil {
		t.Errorf("pickSubnet with 10.0.0.0/8 routed returned %v, want an error", got)
	}
}

func TestHasArgPair(t *testing.T) {
	for _, tc := range []struct {
		argv []string
		want bool
	}{
		{[]string{"containerd", "--config", "/r/config.toml"}, true},
		{[]string{"containerd", "--config=/r/config.toml"}, true},
		{[]string{"containerd", "--config", "/r/config.toml.bak"}, false},
		{[]string{"containerd", "/r/config.toml", "--config"}, false},
	} {
		if got := hasArgPair(tc.argv, "--config", "/r/config.toml"); got != tc.want {
			t.Errorf("hasArgPair(%q) = %v, want %v", tc.argv, got, tc.want)
		}
	}
}

func TestArgValue(t *testing.T) {
	for _, tc := range []struct {
		argv []string
		want string
	}{
		{[]string{"shim", "-namespace", "k8s.io", "-id", "3f1c", "-address", "/r/c.sock"}, "3f1c"},
		{[]string{"shim", "-id=3f1c"}, "3f1c"},
		{[]string{"shim", "-idx", "3f1c"}, ""},
		{[]string{"shim", "-id"}, ""},
	} {
		if got := argValue(tc.argv, "-id"); got != tc.want {
			t.Errorf("argValue(%q, -id) = %q, want %q", tc.argv, got, tc.want)
		}
	}
}

func TestCNIConfigDualStack(t *testing.T) {
	_, subnet, _ := net.ParseCIDR("10.250.7.0/24")
	h := &Stack{Network: "n", Bridge: "b", IPAMDataDir: "/r/ipam", Subnet: subnet, Subnet6: ula64(subnet)}
	if got := h.Subnet6.String(); got != "fd6b:6e63:fa:7::/64" {
		t.Errorf("IPv6 /64 of %s is %s, want fd6b:6e63:fa:7::/64", subnet, got)
	}
	data, err := h.cniConfig()
	if err != nil {
		t.Fatal(err)
	}
	var config struct {
		Plugins []struct {
			IPAM struct {
				Ranges [][]struct {
					Subnet string `json:"subnet"`
				} `json:"ranges"`
				Routes []struct {
					Dst string `json:"dst"`
				} `json:"routes"`
			} `json:"ipam"`
		} `json:"plugins"`
	}
	if err := json.Unmarshal(data, &config); err != nil || len(config.Plugins) != 1 {
		t.Fatalf("CNI config %s: %v", data, err)
	}
	ipam := config.Plugins[0].IPAM
	if len(ipam.Ranges) != 2 || ipam.Ranges[0][0].Subnet != "10.250.7.0/24" || ipam.Ranges[1][0].Subnet != "fd6b:6e63:fa:7::/64" ||
		len(ipam.Routes) != 2 || ipam.Routes[1].Dst != "::/0" {
		t.Errorf("dual-stack CNI config has IPAM %+v, want the /24 then the /64, with a default route for each", ipam)
	}
}

func TestCNIConfigChainsPortmapOnRequest(t *testing.T) {
	_, subnet, _ := net.ParseCIDR("10.240.3.0/24")
	for _, portMappings := range []bool{false, true} {
		h := &Stack{Network: "knext-x", Bridge: "knxx", Subnet: subnet, IPAMDataDir: "/r/ipam",
			opts: Options{CNIPortMappings: portMappings}}
		data, err := h.cniConfig()
		if err != nil {
			t.Fatal(err)
		}
		var conflist struct {
			Plugins []struct {
				Type         string          `json:"type"`
				Capabilities map[string]bool `json:"capabilities"`
			} `json:"plugins"`
		}
		if err := json.Unmarshal(data, &conflist); err != nil {
			t.Fatalf("conflist is not JSON: %v\n%s", err, data)
		}
		var types []string
		for _, p := range conflist.Plugins {
			types = append(types, p.Type)
		}
		want := "bridge"
		if portMappings {
			want = "bridge portmap"
			if !conflist.Plugins[1].Capabilities["portMappings"] {
				t.Errorf("portmap without the portMappings capability: containerd would not pass the pod's ports\n%s", data)
			}
		}
		if got := strings.Join(types, " "); got != want {
			t.Errorf("CNIPortMappings=%v: plugins %q, want %q", portMappings, got, want)
		}
	}
}
