package stack

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"

	"github.com/pelletier/go-toml/v2"

	"github.com/knext-dev/knext/internal/ociimage"
)

// table is a TOML table.
type table = map[string]any

// ConfigVersion is the configuration version every containerd of ours is given: the one
// containerd v2.4.2 writes (`containerd config default`).
const ConfigVersion = 4

// NRIBridgePlugin is the name nri-bridge registers with NRI (without its index): a CNI-less
// node's network_plugin.
const NRIBridgePlugin = "bridge"

// criRuntimePlugin is the CRI runtime plugin's table under "plugins".
const criRuntimePlugin = "io.containerd.cri.v1.runtime"

// RuntimeConfig returns the CRI runtime plugin's table of every containerd of ours: runc (the
// binary runc) with cgroupfs, and restrict_oom_score_adj.
func RuntimeConfig(runc string) map[string]any {
	return table{
		// The machines we test on lack CAP_SYS_RESOURCE: never lower a container's
		// oom_score_adj below ours.
		"restrict_oom_score_adj": true,
		"containerd": table{
			"default_runtime_name": "runc",
			"runtimes": table{"runc": table{
				"runtime_type": "io.containerd.runc.v2",
				"options":      table{"BinaryName": runc, "SystemdCgroup": false},
			}},
		},
	}
}

// CNILessCNI returns the CRI runtime's cni table of a CNI-less node (docs/cni-less.md): CNI
// disabled, and NetworkReady following the NRI plugin networkPlugin only (network_plugin;
// NRIBridgePlugin for nri-bridge), or any plugin subscribed to PodSandboxStatus if
// networkPlugin is "".
func CNILessCNI(networkPlugin string) map[string]any {
	cni := table{"disable_cni": true}
	if networkPlugin != "" {
		cni["network_plugin"] = networkPlugin
	}
	return cni
}

// CNILessConfig is CNILessCNI as Options.ExtraConfig: one table header (no [plugins]), so that
// it concatenates with other TOML.
func CNILessConfig(networkPlugin string) string {
	cni, err := toml.Marshal(CNILessCNI(networkPlugin))
	if err != nil {
		panic(err) // a table of a string and a boolean always marshals
	}
	return fmt.Sprintf("[plugins.'%s'.cni]\n%s", criRuntimePlugin, cni)
}

// containerdConfig returns the daemon's configuration: everything under the root, CRI on runc with
// cgroupfs, the instance's CNI network, NRI on its own socket, and no image ever pulled.
func (h *Stack) containerdConfig() ([]byte, error) {
	runtime := RuntimeConfig(h.opts.Runc)
	runtime["netns_mounts_under_state_dir"] = true
	runtime["cni"] = table{
		"bin_dirs":     []string{h.opts.CNIBinDir},
		"conf_dir":     h.CNIConfDir,
		"max_conf_num": 1,
	}
	config := table{
		"version": ConfigVersion,
		"root":    filepath.Join(h.Root, "root"),
		"state":   filepath.Join(h.Root, "state"),
		"temp":    filepath.Join(h.Root, "tmp"),
		"debug":   table{"level": h.opts.LogLevel},
		"plugins": table{
			// Version 4 reads the sockets from the server plugins only.
			"io.containerd.server.v1.grpc":  table{"address": h.Address},
			"io.containerd.server.v1.ttrpc": table{"address": h.Address + ".ttrpc"},
			criRuntimePlugin:                runtime,
			"io.containerd.cri.v1.images": table{
				"pinned_images": table{"sandbox": ociimage.PauseImage},
			},
			"io.containerd.grpc.v1.cri": table{
				"stream_server_address": "127.0.0.1",
				"stream_server_port":    "0", // any free port: instances run side by side
			},
			"io.containerd.nri.v1.nri": table{
				"disable":                     false,
				"socket_path":                 h.NRISocket,
				"plugin_path":                 h.NRIPluginDir,
				"plugin_config_path":          h.NRIPluginConfigDir,
				"plugin_registration_timeout": h.opts.NRIRegistrationTimeout.String(),
				"plugin_request_timeout":      h.opts.NRIRequestTimeout.String(),
			},
			// Upstream's default /opt/containerd is shared by every containerd of the host.
			"io.containerd.internal.v1.opt": table{"path": filepath.Join(h.Root, "opt")},
		},
	}
	if h.opts.ExtraConfig != "" {
		var extra table
		if err := toml.Unmarshal([]byte(h.opts.ExtraConfig), &extra); err != nil {
			return nil, fmt.Errorf("Options.ExtraConfig is not valid TOML: %w", err)
		}
		mergeTables(config, extra)
	}
	return toml.Marshal(config)
}

// mergeTables merges src into dst: tables recursively, any other value of src replaces dst's.
func mergeTables(dst, src table) {
	for key, value := range src {
		if srcTable, ok := value.(table); ok {
			if dstTable, ok := dst[key].(table); ok {
				mergeTables(dstTable, srcTable)
				continue
			}
		}
		dst[key] = value
	}
}

// cniConfig returns the instance's CNI network: a bridge with its own name and /24 (and /64 when
// dual-stack), host-local allocations under the root, and no masquerading (no iptables rules to
// leak); with Options.CNIPortMappings, portmap after it (its rules go when the pods go).
func (h *Stack) cniConfig() ([]byte, error) {
	ranges := [][]map[string]string{{{"subnet": h.Subnet.String()}}}
	routes := []map[string]string{{"dst": "0.0.0.0/0"}}
	if h.Subnet6 != nil {
		ranges = append(ranges, []map[string]string{{"subnet": h.Subnet6.String()}})
		routes = append(routes, map[string]string{"dst": "::/0"})
	}
	plugins := []any{map[string]any{
		"type":      "bridge",
		"bridge":    h.Bridge,
		"isGateway": true,
		"ipMasq":    false,
		"ipam": map[string]any{
			"type":    "host-local",
			"dataDir": h.IPAMDataDir,
			"ranges":  ranges,
			"routes":  routes,
		},
	}}
	if h.opts.CNIPortMappings {
		plugins = append(plugins, map[string]any{"type": "portmap", "capabilities": map[string]bool{"portMappings": true}})
	}
	return json.MarshalIndent(map[string]any{"cniVersion": "1.0.0", "name": h.Network, "plugins": plugins}, "", "  ")
}

// ula64 returns the IPv6 /64 of an instance whose IPv4 /24 is subnet: fd6b:6e63 ("knc") and the
// /24's second and third bytes, as unique among instances as their /24s.
func ula64(subnet *net.IPNet) *net.IPNet {
	v4 := subnet.IP.To4()
	return &net.IPNet{
		IP:   net.IP{0xfd, 0x6b, 0x6e, 0x63, 0, v4[1], 0, v4[2], 0, 0, 0, 0, 0, 0, 0, 0},
		Mask: net.CIDRMask(64, 128),
	}
}

// crictlConfig points crictl at the instance, so that CRI_CONFIG_FILE is all a shell needs.
func (h *Stack) crictlConfig() []byte {
	endpoint := "unix://" + h.Address
	return fmt.Appendf(nil, "runtime-endpoint: %s\nimage-endpoint: %s\ntimeout: 30\n", endpoint, endpoint)
}

// writeConfigs writes the daemon, CNI and crictl configuration files.
func (h *Stack) writeConfigs() error {
	daemon, err := h.containerdConfig()
	if err != nil {
		return err
	}
	cni, err := h.cniConfig()
	if err != nil {
		return err
	}
	files := map[string][]byte{
		h.ConfigPath: daemon,
		filepath.Join(h.CNIConfDir, "10-"+h.Network+".conflist"): cni,
		h.CrictlConfigPath: h.crictlConfig(),
	}
	for name, data := range files {
		if err := os.WriteFile(name, data, 0o644); err != nil {
			return err
		}
	}
	return nil
}
