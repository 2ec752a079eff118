package main

import (
	"flag"
	"fmt"
	"io"
	"net/netip"
	"strings"
	"sync"
	"testing"
)

// fakeFirewall records what the plugin asks of the host's packet filter.
type fakeFirewall struct {
	mu       sync.Mutex
	applied  *ruleset // the last ruleset applied
	applies  int      // how many rulesets were applied
	applyErr error
	hairpins map[string]bool // host veths in hairpin mode
}

func (f *fakeFirewall) apply(rs *ruleset) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.applyErr != nil {
		return f.applyErr
	}
	f.applied = rs
	f.applies++
	return nil
}

func (f *fakeFirewall) enableHairpin(hostVeth string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.hairpins[hostVeth] = true
	return nil
}

func tcp(hostPort, containerPort int32, hostIP string) portMapping {
	return portMapping{Protocol: protoTCP, HostPort: hostPort, ContainerPort: containerPort, HostIP: hostIP}
}

func TestPublishedPorts(t *testing.T) {
	udp := portMapping{Protocol: protoUDP, HostPort: 53, ContainerPort: 5353}
	for _, tc := range []struct {
		name       string
		in         []portMapping
		has4, has6 bool
		want       string // the published mappings, or the error
	}{
		{"hostPort 0 publishes nothing (CRI)", []portMapping{tcp(0, 80, ""), tcp(-1, 81, "")}, true, true, "[]"},
		{"canonical hostIP", []portMapping{tcp(80, 80, "::FFFF:10.0.0.1"), tcp(81, 80, "FD00::0001")}, true, true,
			"[hostPort 80/TCP on 10.0.0.1 (container port 80) hostPort 81/TCP on fd00::1 (container port 80)]"},
		{"unspecified hostIPs", []portMapping{tcp(80, 80, ""), tcp(81, 80, "0.0.0.0"), tcp(82, 80, "::")}, true, true,
			"[hostPort 80/TCP on every address (container port 80) hostPort 81/TCP on every IPv4 address (container port 80) hostPort 82/TCP on every IPv6 address (container port 80)]"},
		{"duplicates collapse", []portMapping{udp, tcp(53, 53, ""), udp}, true, false,
			"[hostPort 53/UDP on every address (container port 5353) hostPort 53/TCP on every address (container port 53)]"},
		{"same port on two addresses", []portMapping{tcp(80, 80, "10.0.0.1"), tcp(80, 81, "10.0.0.2"), tcp(80, 82, "::")}, true, true,
			"[hostPort 80/TCP on 10.0.0.1 (container port 80) hostPort 80/TCP on 10.0.0.2 (container port 81) hostPort 80/TCP on every IPv6 address (container port 82)]"},
		{"one port twice", []portMapping{tcp(80, 80, "0.0.0.0"), tcp(80, 81, "10.0.0.1")}, true, true,
			"the pod lists both hostPort 80/TCP on every IPv4 address (container port 80) and hostPort 80/TCP on 10.0.0.1 (container port 81)"},
		{"unknown protocol", []portMapping{{Protocol: "7", HostPort: 80, ContainerPort: 80}}, true, true,
			`hostPort 80: protocol "7" is not supported (TCP, UDP or SCTP)`},
		{"host port out of range", []portMapping{tcp(65536, 80, "")}, true, true, "hostPort 65536/TCP: not a port number (1-65535)"},
		{"container port out of range", []portMapping{tcp(80, 0, "")}, true, true, "hostPort 80/TCP: container port 0 is not a port number (1-65535)"},
		{"hostIP not an address", []portMapping{tcp(80, 80, "10.0.0.0/8")}, true, true, `hostPort 80/TCP: hostIP "10.0.0.0/8" is not an IP address`},
		{"hostIP with a zone", []portMapping{tcp(80, 80, "fe80::1%eth0")}, true, true, `hostPort 80/TCP: hostIP "fe80::1%eth0" is not an IP address`},
		{"IPv6 localhost", []portMapping{tcp(80, 80, "::1")}, true, true, "hostPort 80/TCP: hostIP ::1 cannot be forwarded to a pod (IPv6 packets from ::1 never leave the node)"},
		{"family without subnet", []portMapping{tcp(80, 80, "0.0.0.0")}, false, true,
			"hostPort 80/TCP on every IPv4 address (container port 80): pods get no IPv4 address from nri-bridge (no IPv4 subnet configured)"},
		{"any address on one family", []portMapping{tcp(80, 80, "")}, false, true, "[hostPort 80/TCP on every address (container port 80)]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := publishedPorts(tc.in, tc.has4, tc.has6)
			result := fmt.Sprint(got)
			if err != nil {
				result = err.Error()
			}
			if result != tc.want {
				t.Errorf("got  %s\nwant %s", result, tc.want)
			}
		})
	}
}

func TestPortMappingOverlaps(t *testing.T) {
	udp := portMapping{Protocol: protoUDP, HostPort: 80, ContainerPort: 80}
	for _, tc := range []struct {
		a, b portMapping
		want bool
	}{
		{tcp(80, 80, ""), tcp(80, 81, ""), true},
		{tcp(80, 80, ""), tcp(81, 80, ""), false},
		{tcp(80, 80, ""), udp, false},
		{tcp(80, 80, ""), tcp(80, 80, "10.0.0.1"), true},
		{tcp(80, 80, ""), tcp(80, 80, "::"), true},
		{tcp(80, 80, "0.0.0.0"), tcp(80, 80, "::"), false},
		{tcp(80, 80, "0.0.0.0"), tcp(80, 80, "10.0.0.1"), true},
		{tcp(80, 80, "0.0.0.0"), tcp(80, 80, "fd00::1"), false},
		{tcp(80, 80, "::"), tcp(80, 80, "fd00::1"), true},
		{tcp(80, 80, "10.0.0.1"), tcp(80, 80, "10.0.0.1"), true},
		{tcp(80, 80, "10.0.0.1"), tcp(80, 80, "10.0.0.2"), false},
	} {
		if got := tc.a.overlaps(tc.b); got != tc.want {
			t.Errorf("%s overlaps %s: got %v, want %v", tc.a, tc.b, got, tc.want)
		}
		if got := tc.b.overlaps(tc.a); got != tc.want {
			t.Errorf("%s overlaps %s: got %v, want %v", tc.b, tc.a, got, tc.want)
		}
	}
}

func TestBuildRuleset(t *testing.T) {
	s := mustValidate(t, `{bridge: nribr0, ipv4: {subnet: 10.88.0.0/16}, ipv6: {subnet: "fd00:88::/64"}}`)
	dualStack := func(last string) []netip.Prefix {
		return []netip.Prefix{netip.MustParsePrefix("10.88.0." + last + "/16"), netip.MustParsePrefix("fd00:88::" + last + "/64")}
	}
	pods := []publishedPod{ // rules come in pod ID order, whatever the order here
		{pod: podRef{ID: "bbb", Namespace: "ns", Name: "db"}, addrs: dualStack("3"), ports: []portMapping{
			{Protocol: protoSCTP, HostPort: 9000, ContainerPort: 9000, HostIP: "fd00:99::1"}, tcp(8443, 443, "127.0.0.1")}},
		{pod: podRef{ID: "aaa", Namespace: "ns", Name: "web"}, addrs: dualStack("2"), ports: []portMapping{
			tcp(8080, 80, ""), {Protocol: protoUDP, HostPort: 53, ContainerPort: 5353, HostIP: "0.0.0.0"}}},
	}
	rs := buildRuleset(s, pods)
	want := `table inet nri-bridge-nribr0 {
	chain hostports {
		meta nfproto ipv4 tcp dport 8080 dnat ip to 10.88.0.2:80 comment "ns/web aaa"
		meta nfproto ipv6 tcp dport 8080 dnat ip6 to [fd00:88::2]:80 comment "ns/web aaa"
		meta nfproto ipv4 udp dport 53 dnat ip to 10.88.0.2:5353 comment "ns/web aaa"
		meta nfproto ipv6 ip6 daddr fd00:99::1 sctp dport 9000 dnat ip6 to [fd00:88::3]:9000 comment "ns/db bbb"
		meta nfproto ipv4 ip daddr 127.0.0.1 tcp dport 8443 dnat ip to 10.88.0.3:443 comment "ns/db bbb"
	}
	chain prerouting {
		type nat hook prerouting priority -100; policy accept;
		fib daddr type local jump hostports
	}
	chain output {
		type nat hook output priority -100; policy accept;
		meta nfproto ipv6 ip6 daddr ::1 return
		fib daddr type local jump hostports
	}
	chain postrouting {
		type nat hook postrouting priority 100; policy accept;
		meta nfproto ipv4 oifname "nribr0" ip saddr 10.88.0.0/16 ip daddr 10.88.0.2 tcp dport 80 ct status dnat masquerade comment "ns/web aaa"
		meta nfproto ipv6 oifname "nribr0" ip6 saddr fd00:88::/64 ip6 daddr fd00:88::2 tcp dport 80 ct status dnat masquerade comment "ns/web aaa"
		meta nfproto ipv4 oifname "nribr0" ip saddr 10.88.0.0/16 ip daddr 10.88.0.2 udp dport 5353 ct status dnat masquerade comment "ns/web aaa"
		meta nfproto ipv6 oifname "nribr0" ip6 saddr fd00:88::/64 ip6 daddr fd00:88::3 sctp dport 9000 ct status dnat masquerade comment "ns/db bbb"
		meta nfproto ipv4 oifname "nribr0" ip saddr 10.88.0.0/16 ip daddr 10.88.0.3 tcp dport 443 ct status dnat masquerade comment "ns/db bbb"
		meta nfproto ipv4 oifname "nribr0" ip saddr 127.0.0.0/8 masquerade comment "localhost to hostPorts"
	}
	chain localnet-guard {
		type filter hook prerouting priority -300; policy accept;
		meta nfproto ipv4 iifname "nribr0" ip daddr 127.0.0.0/8 drop comment "pods must not reach the node's localhost (route_localnet)"
	}
}
`
	if got := rs.String(); got != want {
		t.Errorf("ruleset:\n%s\nwant:\n%s", got, want)
	}
	if !rs.forward4 || !rs.forward6 || !rs.routeLocalnet {
		t.Errorf("forward4 %v, forward6 %v, routeLocalnet %v: want all", rs.forward4, rs.forward6, rs.routeLocalnet)
	}

	// IPv6 ports only: no IPv4 forwarding, no route_localnet, hence no guard either.
	v6only := []publishedPod{{pod: podRef{ID: "ccc"}, addrs: dualStack("4"), ports: []portMapping{tcp(80, 80, "::")}}}
	rs = buildRuleset(s, v6only)
	if rs.forward4 || !rs.forward6 || rs.routeLocalnet || strings.Contains(rs.String(), "ip daddr 127.0.0.0/8") {
		t.Errorf("IPv6-only hostPort: forward4 %v, forward6 %v, routeLocalnet %v:\n%s", rs.forward4, rs.forward6, rs.routeLocalnet, rs)
	}

	s.masquerade = true
	rs = buildRuleset(s, nil)
	want = `table inet nri-bridge-nribr0 {
	chain postrouting {
		type nat hook postrouting priority 100; policy accept;
		meta nfproto ipv4 ip saddr 10.88.0.0/16 ip daddr != 10.88.0.0/16 masquerade comment "pods to outside the pod subnet"
		meta nfproto ipv6 ip6 saddr fd00:88::/64 ip6 daddr != fd00:88::/64 masquerade comment "pods to outside the pod subnet"
	}
}
`
	if got := rs.String(); got != want || !rs.forward4 || !rs.forward6 || rs.routeLocalnet {
		t.Errorf("masquerade: forward4 %v, forward6 %v, routeLocalnet %v, ruleset:\n%s\nwant:\n%s", rs.forward4, rs.forward6, rs.routeLocalnet, got, want)
	}

	s.masquerade = false
	if rs = buildRuleset(s, nil); len(rs.chains) != 0 || rs.forward4 || rs.forward6 || rs.routeLocalnet {
		t.Errorf("nothing published, no masquerade: want no table, got\n%s", rs)
	}
}

func TestConfigMasquerade(t *testing.T) {
	if s := mustValidate(t, `ipv4: {subnet: 10.1.0.0/24}`); s.masquerade {
		t.Error("masquerade is on by default")
	}
	if s := mustValidate(t, `{masquerade: true, ipv4: {subnet: 10.1.0.0/24}}`); !s.masquerade {
		t.Error("masquerade: true is off")
	}
	flags := &configFlags{}
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	flags.register(fs)
	for _, tc := range []struct {
		args []string
		want bool
	}{{[]string{"-masquerade"}, true}, {[]string{"-masquerade=false"}, false}} {
		flags.overrides = nil
		if err := fs.Parse(tc.args); err != nil {
			t.Fatal(err)
		}
		cfg, err := resolveConfig([]byte(`{masquerade: true, ipv4: {subnet: 10.1.0.0/24}}`), flags)
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
	if a.equal(b) {
		t.Error("settings that differ in masquerade are equal")
	}
}

func TestStoreHostPortClaims(t *testing.T) {
	dir, doc := t.TempDir(), `ipv4: {subnet: 10.1.0.0/24}`
	s := openTestStore(t, dir, doc)
	if held, err := s.hostPortsOf("a"); err != nil || held != nil {
		t.Fatalf("a store without any claim: %v, %v", held, err)
	}
	a := podRef{ID: "a", Namespace: "ns", Name: "web"}
	b := podRef{ID: "b", Namespace: "ns", Name: "other"}
	if created, err := s.claimHostPorts(a, []portMapping{tcp(80, 8080, "")}); err != nil || !created {
		t.Fatalf("first claim: created %v, %v", created, err)
	}
	if created, err := s.claimHostPorts(a, []portMapping{tcp(80, 8080, "")}); err != nil || created {
		t.Fatalf("replayed claim: created %v, %v", created, err)
	}
	_, err := s.claimHostPorts(b, []portMapping{tcp(81, 81, ""), tcp(80, 80, "10.0.0.1")})
	want := "hostPort 80/TCP on 10.0.0.1 (container port 80) is taken: pod ns/web (sandbox a) holds hostPort 80/TCP on every address (container port 8080)"
	if err == nil || err.Error() != want {
		t.Fatalf("conflicting claim: got %v\nwant %s", err, want)
	}
	if held, err := s.hostPortsOf("b"); err != nil || held != nil {
		t.Errorf("the refused claim was recorded: %v, %v", held, err)
	}
	// Other protocols and ports are free.
	if _, err := s.claimHostPorts(b, []portMapping{{Protocol: protoUDP, HostPort: 80, ContainerPort: 80}, tcp(81, 81, "")}); err != nil {
		t.Fatal(err)
	}
	s.close()

	s = openTestStore(t, dir, doc)
	all, err := s.allHostPorts()
	if err != nil || len(all) != 2 || all["a"].Pod != a || fmt.Sprint(all["a"].Ports) != "[hostPort 80/TCP on every address (container port 8080)]" {
		t.Fatalf("after reopening: %v, %v", all, err)
	}
	for range 2 {
		if err := s.releaseHostPorts("a"); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.claimHostPorts(podRef{ID: "c"}, []portMapping{tcp(80, 80, "")}); err != nil {
		t.Errorf("claiming a released port: %v", err)
	}
}
