package config

import (
	"flag"
	"fmt"
	"io"
	"net/netip"
	"strings"
	"testing"
)

func mustValidate(t *testing.T, doc string) *Settings {
	t.Helper()
	s, err := Load([]byte(doc), &Flags{})
	if err != nil {
		t.Fatalf("Load(%q): %v", doc, err)
	}
	return s
}

func TestConfigDefaultsAndGateways(t *testing.T) {
	s := mustValidate(t, `
ipv6: {subnet: "fd00:88::/64"}
ipv4: {subnet: 10.88.0.0/16}
`)
	if s.Bridge != DefaultBridge || s.MTU != DefaultMTU || s.StateDir != DefaultStateDir || s.PodInterface != "eth0" || s.Secondary() {
		t.Errorf("defaults: got bridge %q mtu %d stateDir %q interface %q (secondary %v)", s.Bridge, s.MTU, s.StateDir, s.PodInterface, s.Secondary())
	}
	if len(s.DefaultRoutePools()) != 2 {
		t.Errorf("eth0 takes default routes through %v, want both pools", s.DefaultRoutePools())
	}
	if len(s.Pools) != 2 || s.Pools[0].Family != "IPv4" || s.Pools[1].Family != "IPv6" {
		t.Fatalf("pools %v: want IPv4 then IPv6", s.Pools)
	}
	if got := s.Pools[0].GatewayPrefix().String(); got != "10.88.0.1/16" {
		t.Errorf("IPv4 default gateway %s, want 10.88.0.1/16", got)
	}
	if got := s.Pools[1].GatewayPrefix().String(); got != "fd00:88::1/64" {
		t.Errorf("IPv6 default gateway %s, want fd00:88::1/64", got)
	}

	s = mustValidate(t, `{bridge: br-pods, mtu: 9000, stateDir: /tmp/x, ipv4: {subnet: 192.168.7.0/24, gateway: 192.168.7.254}}`)
	if s.Bridge != "br-pods" || s.MTU != 9000 || s.StateDir != "/tmp/x" || len(s.Pools) != 1 {
		t.Fatalf("explicit settings not taken: %+v", s)
	}
	if s.Pools[0].Gateway != netip.MustParseAddr("192.168.7.254") {
		t.Errorf("gateway %s, want 192.168.7.254", s.Pools[0].Gateway)
	}

	s = mustValidate(t, `{interface: net1, ipv4: {subnet: 192.168.7.0/24}}`)
	if s.PodInterface != "net1" || !s.Secondary() || s.DefaultRoutePools() != nil {
		t.Errorf("interface net1: got %q, secondary %v, default routes through %v; want a secondary interface without default routes",
			s.PodInterface, s.Secondary(), s.DefaultRoutePools())
	}
}

func TestConfigRefusesInvalid(t *testing.T) {
	for _, tc := range []struct{ doc, want string }{
		{`{}`, "no pod subnet configured"},
		{`ipv4: {subnet: 10.88.0.0/33}`, `ipv4.subnet "10.88.0.0/33": not a CIDR subnet`},
		{`ipv4: {subnet: banana}`, `ipv4.subnet "banana": not a CIDR subnet`},
		{`ipv4: {subnet: 10.88.0.0}`, `not a CIDR subnet`},
		{`ipv4: {subnet: "fd00::/64"}`, "ipv4.subnet fd00::/64: not an IPv4 subnet"},
		{`ipv6: {subnet: 10.88.0.0/16}`, "ipv6.subnet 10.88.0.0/16: not an IPv6 subnet"},
		{`ipv6: {subnet: "::ffff:10.88.0.0/112"}`, "not an IPv6 subnet"},
		{`ipv4: {subnet: 10.88.0.5/16}`, "host bits set (the subnet is 10.88.0.0/16)"},
		{`ipv4: {subnet: 127.0.0.0/8}`, "not a unicast subnet"},
		{`ipv6: {subnet: "fe80::/64"}`, "not a unicast subnet"},
		{`ipv4: {subnet: 10.88.0.0/31}`, "ipv4.subnet 10.88.0.0/31: too small"},
		{`ipv4: {subnet: 10.88.0.0/32}`, "too small"},
		{`ipv6: {subnet: "fd00::/127"}`, "ipv6.subnet fd00::/127: too small"},
		{`ipv4: {subnet: 10.88.0.0/24, gateway: 10.89.0.1}`, "ipv4.gateway 10.89.0.1: outside subnet 10.88.0.0/24"},
		{`ipv4: {subnet: 10.88.0.0/24, gateway: 10.88.0.0}`, "ipv4.gateway 10.88.0.0: the network or broadcast address"},
		{`ipv4: {subnet: 10.88.0.0/24, gateway: 10.88.0.255}`, "ipv4.gateway 10.88.0.255: the network or broadcast address"},
		{`ipv4: {subnet: 10.88.0.0/24, gateway: nope}`, `ipv4.gateway "nope": not an IP address`},
		{`ipv6: {subnet: "fd00::/64", gateway: "fd01::1"}`, "ipv6.gateway fd01::1: outside subnet fd00::/64"},
		{`{bridge: a-name-longer-than-15, ipv4: {subnet: 10.88.0.0/24}}`, `bridge: "a-name-longer-than-15" is not a valid interface name`},
		{`{bridge: "a/b", ipv4: {subnet: 10.88.0.0/24}}`, "is not a valid interface name"},
		{`{interface: "", ipv4: {subnet: 10.88.0.0/24}}`, `interface: "" is not a valid interface name`},
		{`{interface: "net 1", ipv4: {subnet: 10.88.0.0/24}}`, `interface: "net 1" is not a valid interface name`},
		{`{interface: lo, ipv4: {subnet: 10.88.0.0/24}}`, `interface "lo": the pod's loopback interface`},
		{`{interface: net1, masquerade: true, ipv4: {subnet: 10.88.0.0/24}}`, "masquerade with interface net1: "},
		{`{stateDir: relative/dir, ipv4: {subnet: 10.88.0.0/24}}`, `stateDir "relative/dir": must be an absolute path`},
		{`{mtu: 1000, ipv6: {subnet: "fd00::/64"}}`, "mtu 1000: must be between 1280 and 65535"},
		{`{mtu: 70000, ipv4: {subnet: 10.88.0.0/24}}`, "mtu 70000"},
		{`{subnet: 10.88.0.0/24}`, `unknown field "subnet"`},
		{`ipv4: [10.88.0.0/24]`, "invalid YAML configuration"},
	} {
		cfg, err := Resolve([]byte(tc.doc), &Flags{})
		if err == nil {
			_, err = cfg.Validate()
		}
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("config %s: got error %v, want one containing %q", tc.doc, err, tc.want)
		}
	}
}

func TestConfigMTUFloorDependsOnFamilies(t *testing.T) {
	if s := mustValidate(t, `{mtu: 1000, ipv4: {subnet: 10.88.0.0/24}}`); s.MTU != 1000 {
		t.Errorf("IPv4-only MTU 1000: got %d", s.MTU)
	}
}

func TestConfigFlagsOverrideYAML(t *testing.T) {
	flags := &Flags{}
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	flags.Register(fs)
	err := fs.Parse([]string{"-config", "/etc/x.yaml", "-ipv4-subnet", "10.99.0.0/24", "-mtu", "1400",
		"-ipv6-subnet", "fd00:99::/64", "-ipv6-gateway", "fd00:99::fe", "-bridge", "br9", "-state-dir", "/run/b", "-interface", "net1"})
	if err != nil {
		t.Fatal(err)
	}
	if flags.File != "/etc/x.yaml" {
		t.Errorf("config file %q", flags.File)
	}
	cfg, err := Resolve([]byte(`{mtu: 9000, bridge: br0, ipv4: {subnet: 10.1.0.0/16}, ipv6: {subnet: "fd00:1::/64", gateway: "fd00:1::1"}}`), flags)
	if err != nil {
		t.Fatal(err)
	}
	s, err := cfg.Validate()
	if err != nil {
		t.Fatal(err)
	}
	got := []string{s.Bridge, s.StateDir, s.Pools[0].String(), s.Pools[1].String(), s.PodInterface}
	want := []string{"br9", "/run/b", "IPv4 10.99.0.0/24 gateway 10.99.0.1", "IPv6 fd00:99::/64 gateway fd00:99::fe", "net1"}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("got %q, want %q", got[i], want[i])
		}
	}
	if s.MTU != 1400 {
		t.Errorf("mtu %d, want 1400", s.MTU)
	}

	if err := fs.Parse([]string{"-mtu", "big"}); err == nil || !strings.Contains(err.Error(), `not a number: "big"`) {
		t.Errorf("-mtu big: got %v", err)
	}
}

func TestCheckHostOverlap(t *testing.T) {
	s := mustValidate(t, `{bridge: nribr0, ipv4: {subnet: 10.88.0.0/16}, ipv6: {subnet: "fd00:88::/64"}}`)
	route := func(cidr, dev string) HostRoute { return HostRoute{Dst: netip.MustParsePrefix(cidr), Dev: dev} }

	ok := []HostRoute{
		route("0.0.0.0/0", "eth0"), route("::/0", "eth0"), // default routes overlap everything
		route("10.88.0.0/16", "nribr0"), route("fd00:88::/64", "nribr0"), // our own bridge
		route("10.89.0.0/16", "eth1"), route("192.168.0.0/24", "eth0"), route("fe80::/64", "eth0"),
	}
	if err := s.CheckHostOverlap(ok); err != nil {
		t.Errorf("unexpected overlap: %v", err)
	}
	for _, r := range []HostRoute{route("10.0.0.0/8", "tun0"), route("10.88.3.0/24", "eth1"), route("fd00::/16", "wg0")} {
		err := s.CheckHostOverlap(append(ok, r))
		if err == nil || !strings.Contains(err.Error(), "overlaps the host route "+r.Dst.String()+" dev "+r.Dev) {
			t.Errorf("route %s dev %s: got %v", r.Dst, r.Dev, err)
		}
	}
}

func TestPoolReservedAddresses(t *testing.T) {
	p := mustValidate(t, `ipv4: {subnet: 10.88.0.0/24, gateway: 10.88.0.9}`).Pools[0]
	for addr, want := range map[string]bool{"10.88.0.0": true, "10.88.0.9": true, "10.88.0.255": true, "10.88.0.1": false, "10.88.0.254": false} {
		if got := p.Reserved(netip.MustParseAddr(addr)); got != want {
			t.Errorf("reserved(%s) = %v, want %v", addr, got, want)
		}
	}
	p6 := mustValidate(t, `ipv6: {subnet: "fd00::/120"}`).Pools[0]
	for addr, want := range map[string]bool{"fd00::": true, "fd00::1": true, "fd00::ff": false} {
		if got := p6.Reserved(netip.MustParseAddr(addr)); got != want {
			t.Errorf("reserved(%s) = %v, want %v", addr, got, want)
		}
	}
}

func TestConfigMasquerade(t *testing.T) {
	if s := mustValidate(t, `ipv4: {subnet: 10.1.0.0/24}`); s.Masquerade {
		t.Error("masquerade is on by default")
	}
	if s := mustValidate(t, `{masquerade: true, ipv4: {subnet: 10.1.0.0/24}}`); !s.Masquerade {
		t.Error("masquerade: true is off")
	}
	flags := &Flags{}
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	flags.Register(fs)
	for _, tc := range []struct {
		args []string
		want bool
	}{{[]string{"-masquerade"}, true}, {[]string{"-masquerade=false"}, false}} {
		flags.overrides = nil
		if err := fs.Parse(tc.args); err != nil {
			t.Fatal(err)
		}
		cfg, err := Resolve([]byte(`{masquerade: true, ipv4: {subnet: 10.1.0.0/24}}`), flags)
		if err != nil {
			t.Fatal(err)
		}
		if cfg.Masquerade != tc.want {
			t.Errorf("%v over masquerade: true: got %v", tc.args, cfg.Masquerade)
		}
	}
	if err := fs.Parse([]string{"-masquerade=maybe"}); err == nil || !strings.Contains(err.Error(), `not a boolean: "maybe"`) {
		t.Errorf("-masquerade=maybe: got %v", err)
	}
	a, b := mustValidate(t, `ipv4: {subnet: 10.1.0.0/24}`), mustValidate(t, `{masquerade: true, ipv4: {subnet: 10.1.0.0/24}}`)
	if a.Equal(b) {
		t.Error("settings that differ in masquerade are equal")
	}
}

func TestValidateCluster(t *testing.T) {
	cidrs := func(texts ...string) []netip.Prefix {
		var prefixes []netip.Prefix
		for _, text := range texts {
			prefixes = append(prefixes, netip.MustParsePrefix(text))
		}
		return prefixes
	}
	cfg, err := Resolve([]byte(`{masquerade: true, clusterCIDRs: ["10.244.0.0/16", "fd00:10:244::/56"]}`), &Flags{})
	if err != nil {
		t.Fatal(err)
	}
	if err := cfg.CheckCluster(); err != nil {
		t.Fatalf("CheckCluster: %v", err)
	}
	// The Node may list IPv6 first: IPv4 still gives the primary IP.
	s, err := cfg.ValidateCluster("n1", cidrs("fd00:10:244:1::/64", "10.244.1.0/24"))
	if err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(s.Pools); !s.Cluster || got != "[IPv4 10.244.1.0/24 gateway 10.244.1.1 IPv6 fd00:10:244:1::/64 gateway fd00:10:244:1::1]" {
		t.Errorf("cluster %v, pools %s", s.Cluster, got)
	}
	if got := fmt.Sprint(s.ClusterCIDRs); got != "[10.244.0.0/16 fd00:10:244::/56]" {
		t.Errorf("clusterCIDRs %s", got)
	}
	if file := mustValidate(t, `{ipv4: {subnet: 10.244.1.0/24}}`); file.Cluster || file.Equal(s) {
		t.Error("file mode settings say cluster mode, or equal cluster mode's")
	}

	for _, tc := range []struct {
		doc      string
		podCIDRs []netip.Prefix
		want     string
	}{
		{`{ipv4: {subnet: 10.88.0.0/16}}`, cidrs("10.244.1.0/24"), "ipv4/ipv6 subnets configured in cluster mode: the pod subnets are the Node's spec.podCIDRs"},
		{`{interface: net1}`, cidrs("10.244.1.0/24"), "interface net1 in cluster mode: the Node's pod CIDRs belong to the pod network, eth0"},
		{`{}`, nil, "Node n1 has no spec.podCIDRs"},
		{`{}`, cidrs("10.244.1.0/24", "10.244.2.0/24"), "Node n1 has two IPv4 pod CIDRs [10.244.1.0/24 10.244.2.0/24]: nri-bridge takes one per family"},
		{`{}`, cidrs("10.244.1.0/31"), "Node n1's pod CIDR 10.244.1.0/31: too small, no room for a gateway and a pod"},
		{`{mtu: 1000}`, cidrs("fd00::/64"), "mtu 1000: must be between 1280 and 65535"},
		{`{clusterCIDRs: [banana]}`, cidrs("10.244.1.0/24"), `clusterCIDRs: "banana" is not a CIDR subnet`},
		{`{clusterCIDRs: [10.244.1.1/16]}`, cidrs("10.244.1.0/24"), "clusterCIDRs: 10.244.1.1/16 has host bits set (the subnet is 10.244.0.0/16)"},
		{`{clusterCIDRs: ["fe80::/10"]}`, cidrs("10.244.1.0/24"), "clusterCIDRs: fe80::/10 is not a unicast subnet"},
	} {
		cfg, err := Resolve([]byte(tc.doc), &Flags{})
		if err == nil {
			_, err = cfg.ValidateCluster("n1", tc.podCIDRs)
		}
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s with %v: got %v, want %q", tc.doc, tc.podCIDRs, err, tc.want)
		}
	}

	// clusterCIDRs also works in file mode, and as a flag.
	flags := &Flags{}
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	flags.Register(fs)
	if err := fs.Parse([]string{"-cluster-cidrs", "10.244.0.0/16,fd00:10:244::/56"}); err != nil {
		t.Fatal(err)
	}
	s, err = Load([]byte(`{clusterCIDRs: [10.0.0.0/8], ipv4: {subnet: 10.244.1.0/24}}`), flags)
	if err != nil || fmt.Sprint(s.ClusterCIDRs) != "[10.244.0.0/16 fd00:10:244::/56]" {
		t.Errorf("-cluster-cidrs over the file's: %v (%v)", s, err)
	}
	s, err = LoadCluster([]byte(`{}`), &Flags{}, "n1", cidrs("10.244.1.0/24"))
	if err != nil || s.StateDir != DefaultStateDir || s.Bridge != DefaultBridge || !s.Cluster {
		t.Errorf("cluster mode defaults: %+v (%v)", s, err)
	}
	if _, err := LoadCluster([]byte(`{ipv6: {subnet: "fd00::/64"}}`), &Flags{}, "n1", cidrs("10.244.1.0/24")); err == nil ||
		!strings.HasPrefix(err.Error(), "invalid configuration: ipv4/ipv6 subnets configured in cluster mode") {
		t.Errorf("LoadCluster with a subnet: %v", err)
	}
}
