package main

import (
	"flag"
	"io"
	"net/netip"
	"strings"
	"testing"
)

func mustValidate(t *testing.T, doc string) *settings {
	t.Helper()
	cfg, err := resolveConfig([]byte(doc), &configFlags{})
	if err != nil {
		t.Fatalf("resolveConfig(%q): %v", doc, err)
	}
	s, err := cfg.validate()
	if err != nil {
		t.Fatalf("validate(%q): %v", doc, err)
	}
	return s
}

func TestConfigDefaultsAndGateways(t *testing.T) {
	s := mustValidate(t, `
ipv6: {subnet: "fd00:88::/64"}
ipv4: {subnet: 10.88.0.0/16}
`)
	if s.bridge != defaultBridge || s.mtu != defaultMTU || s.stateDir != defaultStateDir || s.podInterface != "eth0" || s.secondary() {
		t.Errorf("defaults: got bridge %q mtu %d stateDir %q interface %q (secondary %v)", s.bridge, s.mtu, s.stateDir, s.podInterface, s.secondary())
	}
	if len(s.defaultRoutePools()) != 2 {
		t.Errorf("eth0 takes default routes through %v, want both pools", s.defaultRoutePools())
	}
	if len(s.pools) != 2 || s.pools[0].family != "IPv4" || s.pools[1].family != "IPv6" {
		t.Fatalf("pools %v: want IPv4 then IPv6", s.pools)
	}
	if got := s.pools[0].gatewayPrefix().String(); got != "10.88.0.1/16" {
		t.Errorf("IPv4 default gateway %s, want 10.88.0.1/16", got)
	}
	if got := s.pools[1].gatewayPrefix().String(); got != "fd00:88::1/64" {
		t.Errorf("IPv6 default gateway %s, want fd00:88::1/64", got)
	}

	s = mustValidate(t, `{bridge: br-pods, mtu: 9000, stateDir: /tmp/x, ipv4: {subnet: 192.168.7.0/24, gateway: 192.168.7.254}}`)
	if s.bridge != "br-pods" || s.mtu != 9000 || s.stateDir != "/tmp/x" || len(s.pools) != 1 {
		t.Fatalf("explicit settings not taken: %+v", s)
	}
	if s.pools[0].gateway != netip.MustParseAddr("192.168.7.254") {
		t.Errorf("gateway %s, want 192.168.7.254", s.pools[0].gateway)
	}

	s = mustValidate(t, `{interface: net1, ipv4: {subnet: 192.168.7.0/24}}`)
	if s.podInterface != "net1" || !s.secondary() || s.defaultRoutePools() != nil {
		t.Errorf("interface net1: got %q, secondary %v, default routes through %v; want a secondary interface without default routes",
			s.podInterface, s.secondary(), s.defaultRoutePools())
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
		cfg, err := resolveConfig([]byte(tc.doc), &configFlags{})
		if err == nil {
			_, err = cfg.validate()
		}
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("config %s: got error %v, want one containing %q", tc.doc, err, tc.want)
		}
	}
}

func TestConfigMTUFloorDependsOnFamilies(t *testing.T) {
	if s := mustValidate(t, `{mtu: 1000, ipv4: {subnet: 10.88.0.0/24}}`); s.mtu != 1000 {
		t.Errorf("IPv4-only MTU 1000: got %d", s.mtu)
	}
}

func TestConfigFlagsOverrideYAML(t *testing.T) {
	flags := &configFlags{}
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	flags.register(fs)
	err := fs.Parse([]string{"-config", "/etc/x.yaml", "-ipv4-subnet", "10.99.0.0/24", "-mtu", "1400",
		"-ipv6-subnet", "fd00:99::/64", "-ipv6-gateway", "fd00:99::fe", "-bridge", "br9", "-state-dir", "/run/b", "-interface", "net1"})
	if err != nil {
		t.Fatal(err)
	}
	if flags.file != "/etc/x.yaml" {
		t.Errorf("config file %q", flags.file)
	}
	cfg, err := resolveConfig([]byte(`{mtu: 9000, bridge: br0, ipv4: {subnet: 10.1.0.0/16}, ipv6: {subnet: "fd00:1::/64", gateway: "fd00:1::1"}}`), flags)
	if err != nil {
		t.Fatal(err)
	}
	s, err := cfg.validate()
	if err != nil {
		t.Fatal(err)
	}
	got := []string{s.bridge, s.stateDir, s.pools[0].String(), s.pools[1].String(), s.podInterface}
	want := []string{"br9", "/run/b", "IPv4 10.99.0.0/24 gateway 10.99.0.1", "IPv6 fd00:99::/64 gateway fd00:99::fe", "net1"}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("got %q, want %q", got[i], want[i])
		}
	}
	if s.mtu != 1400 {
		t.Errorf("mtu %d, want 1400", s.mtu)
	}

	if err := fs.Parse([]string{"-mtu", "big"}); err == nil || !strings.Contains(err.Error(), `not a number: "big"`) {
		t.Errorf("-mtu big: got %v", err)
	}
}

func TestCheckHostOverlap(t *testing.T) {
	s := mustValidate(t, `{bridge: nribr0, ipv4: {subnet: 10.88.0.0/16}, ipv6: {subnet: "fd00:88::/64"}}`)
	route := func(cidr, dev string) hostRoute { return hostRoute{dst: netip.MustParsePrefix(cidr), dev: dev} }

	ok := []hostRoute{
		route("0.0.0.0/0", "eth0"), route("::/0", "eth0"), // default routes overlap everything
		route("10.88.0.0/16", "nribr0"), route("fd00:88::/64", "nribr0"), // our own bridge
		route("10.89.0.0/16", "eth1"), route("192.168.0.0/24", "eth0"), route("fe80::/64", "eth0"),
	}
	if err := s.checkHostOverlap(ok); err != nil {
		t.Errorf("unexpected overlap: %v", err)
	}
	for _, r := range []hostRoute{route("10.0.0.0/8", "tun0"), route("10.88.3.0/24", "eth1"), route("fd00::/16", "wg0")} {
		err := s.checkHostOverlap(append(ok, r))
		if err == nil || !strings.Contains(err.Error(), "overlaps the host route "+r.dst.String()+" dev "+r.dev) {
			t.Errorf("route %s dev %s: got %v", r.dst, r.dev, err)
		}
	}
}

func TestPoolReservedAddresses(t *testing.T) {
	p := mustValidate(t, `ipv4: {subnet: 10.88.0.0/24, gateway: 10.88.0.9}`).pools[0]
	for addr, want := range map[string]bool{"10.88.0.0": true, "10.88.0.9": true, "10.88.0.255": true, "10.88.0.1": false, "10.88.0.254": false} {
		if got := p.reserved(netip.MustParseAddr(addr)); got != want {
			t.Errorf("reserved(%s) = %v, want %v", addr, got, want)
		}
	}
	p6 := mustValidate(t, `ipv6: {subnet: "fd00::/120"}`).pools[0]
	for addr, want := range map[string]bool{"fd00::": true, "fd00::1": true, "fd00::ff": false} {
		if got := p6.reserved(netip.MustParseAddr(addr)); got != want {
			t.Errorf("reserved(%s) = %v, want %v", addr, got, want)
		}
	}
}
