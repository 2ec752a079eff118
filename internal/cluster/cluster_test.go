package cluster

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
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

func TestEndpointSliceSyncs(t *testing.T) {
	log := filepath.Join(t.TempDir(), "kube-controller-manager.log")
	const (
		finished = `endpointslice_controller.go:371] "Finished syncing service endpoint slices" logger="endpointslice-controller" `
		retrying = `endpointslice_controller.go:358] "Error syncing endpoint slices for service, retrying" logger="endpointslice-controller" `
	)
	lines := []string{
		// Ended before from: left out, and so is its retry.
		`I1205 09:11:35.000000    6039 ` + finished + `key="bench/web" elapsedTime="2ms"`,
		`I1205 09:11:35.000100    6039 ` + retrying + `key="bench/web" err="EndpointSlice informer cache is out of date"`,
		// A sync that failed, another Service's in between, one that succeeded.
		`I1205 09:11:36.163343    6039 ` + finished + `key="bench/web" elapsedTime="1.5µs"`,
		`I1205 09:11:36.163400    6039 ` + finished + `key="bench/web2" elapsedTime="1ms"`,
		`I1205 09:11:36.163500    6039 ` + retrying + `key="bench/web" err="EndpointSlice informer cache is out of date"`,
		`I1205 09:11:36.200000    6039 ` + retrying + `key="bench/web2" err="conflict"`,
		`I1205 09:11:37.156615    6039 ` + finished + `key="bench/web" elapsedTime="12.000001ms"`,
		`I1205 09:11:38.000000    6039 endpointslice_controller.go:491] "Finished syncing pod" PodProjectionKey={"Namespace":"bench","Name":"web-1"} elapsedTime="1ms"`,
	}
	if err := os.WriteFile(log, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	c := &Cluster{State: State{ControlPlane: ControlPlaneState{Processes: map[string]*Process{"kube-controller-manager": {Log: log}}}}}
	at := func(sec, nsec int) time.Time { return time.Date(2026, 12, 5, 9, 11, sec, nsec, time.Local) }
	want := []EndpointSliceSync{
		{Start: at(36, 163341500), End: at(36, 163343000), Failed: true},
		{Start: at(37, 144614999), End: at(37, 156615000)},
	}
	got, err := c.EndpointSliceSyncs("bench", "web", at(36, 0))
	if err != nil || !slices.EqualFunc(got, want, func(a, b EndpointSliceSync) bool {
		return a.Start.Equal(b.Start) && a.End.Equal(b.End) && a.Failed == b.Failed
	}) {
		t.Errorf("syncs %v (%v), want %v", got, err, want)
	}
	// klog's time has no year: a sync logged on 1 January after a start on 31 December is the next year's.
	if err := os.WriteFile(log, []byte(`I0101 00:00:01.000000    6039 `+finished+`key="bench/web" elapsedTime="1s"`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	newYear := time.Date(2027, 1, 1, 0, 0, 0, 0, time.Local)
	if got, err := c.EndpointSliceSyncs("bench", "web", newYear.Add(-time.Hour)); len(got) != 1 || !got[0].Start.Equal(newYear) || err != nil {
		t.Errorf("syncs around the new year: %v (%v), want one starting at %v", got, err, newYear)
	}
	if err := os.Remove(log); err != nil {
		t.Fatal(err)
	}
	if _, err := c.EndpointSliceSyncs("bench", "web", at(36, 0)); err == nil {
		t.Error("no error without a log")
	}
}
