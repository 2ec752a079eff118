package harness

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"github.com/pelletier/go-toml/v2"

	"github.com/knext-dev/knext/contrib/images/testimages"
)

// table is a TOML table.
type table = map[string]any

// containerdConfig returns the daemon's configuration: everything under the root, CRI on runc with
// cgroupfs, the instance's CNI network, NRI on its own socket, and no image ever pulled.
func (h *Harness) containerdConfig() ([]byte, error) {
	config := table{
		"version": 3,
		"root":    filepath.Join(h.Root, "root"),
		"state":   filepath.Join(h.Root, "state"),
		"temp":    filepath.Join(h.Root, "tmp"),
		"grpc":    table{"address": h.Address},
		"ttrpc":   table{"address": h.Address + ".ttrpc"},
		"debug":   table{"level": h.opts.LogLevel},
		"plugins": table{
			"io.containerd.cri.v1.runtime": table{
				// This VM lacks CAP_SYS_RESOURCE: never lower a container's oom_score_adj below ours.
				"restrict_oom_score_adj":       true,
				"netns_mounts_under_state_dir": true,
				"containerd": table{
					"default_runtime_name": "runc",
					"runtimes": table{"runc": table{
						"runtime_type": "io.containerd.runc.v2",
						"options":      table{"BinaryName": h.opts.Runc, "SystemdCgroup": false},
					}},
				},
				"cni": table{
					"bin_dirs":     []string{h.opts.CNIBinDir},
					"conf_dir":     h.CNIConfDir,
					"max_conf_num": 1,
				},
			},
			"io.containerd.cri.v1.images": table{
				"pinned_images": table{"sandbox": testimages.PauseImage},
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

// cniConfig returns the instance's CNI network: a bridge with its own name and /24, host-local
// allocations under the root, and no masquerading (no iptables rules to leak).
// With Options.CNIPortMap, portmap follows the bridge (it only acts on pods with host ports).
func (h *Harness) cniConfig() ([]byte, error) {
	plugins := []any{map[string]any{
		"type":      "bridge",
		"bridge":    h.Bridge,
		"isGateway": true,
		"ipMasq":    false,
		"ipam": map[string]any{
			"type":    "host-local",
			"dataDir": h.IPAMDataDir,
			"ranges":  [][]map[string]string{{{"subnet": h.Subnet.String()}}},
			"routes":  []map[string]string{{"dst": "0.0.0.0/0"}},
		},
	}}
	if h.opts.CNIPortMap {
		plugins = append(plugins, map[string]any{"type": "portmap", "capabilities": map[string]bool{"portMappings": true}})
	}
	return json.MarshalIndent(map[string]any{"cniVersion": "1.0.0", "name": h.Network, "plugins": plugins}, "", "  ")
}

// crictlConfig points crictl at the instance, so that CRI_CONFIG_FILE is all a shell needs.
func (h *Harness) crictlConfig() []byte {
	endpoint := "unix://" + h.Address
	return fmt.Appendf(nil, "runtime-endpoint: %s\nimage-endpoint: %s\ntimeout: 30\n", endpoint, endpoint)
}

// writeConfigs writes the daemon, CNI and crictl configuration files.
func (h *Harness) writeConfigs() error {
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
