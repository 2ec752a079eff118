package firewall

import (
	"fmt"
	"net/netip"
	"os"
	"strconv"
	"testing"

	"github.com/knext-dev/knext/internal/nribridge/config"
	"github.com/knext-dev/knext/internal/nribridge/hostport"
	"github.com/knext-dev/knext/internal/nribridge/store"
)

// These tests program the host's nftables: tables with names of their own, removed again.

// manyPods returns settings and n dual-stack pods with two hostPorts each.
func manyPods(n int) (*config.Settings, []PublishedPod) {
	s := &config.Settings{Bridge: "nbb" + strconv.Itoa(os.Getpid()), Pools: []config.Pool{
		{Family: "IPv4", Subnet: netip.MustParsePrefix("10.99.0.0/16")},
		{Family: "IPv6", Subnet: netip.MustParsePrefix("fd00:99::/64")}}}
	var pods []PublishedPod
	for i := range n {
		pods = append(pods, PublishedPod{Pod: store.PodRef{ID: fmt.Sprint("pod-", i)},
			Addrs: []netip.Prefix{netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 99, byte(i >> 8), byte(i)}), 16),
				netip.PrefixFrom(netip.AddrFrom16([16]byte{0xfd, 0, 0, 0x99, 14: byte(i >> 8), 15: byte(i)}), 64)},
			Ports: []hostport.Mapping{{Protocol: hostport.TCP, HostPort: int32(30000 + i), ContainerPort: 80},
				{Protocol: hostport.UDP, HostPort: int32(30000 + i), ContainerPort: 53}}})
	}
	return s, pods
}

// The kernel takes a table from one netlink message: a large one must fit the socket buffers.
func TestNetnsLargeTable(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (programs nftables)")
	}
	s, pods := manyPods(500)
	t.Cleanup(func() { DeleteTable(s.Bridge) })
	rs := Build(s, pods, nil)
	if err := replaceTable(rs); err != nil {
		t.Fatalf("a table for %d pods with hostPorts: %v", len(pods), err)
	}
	if err := replaceTable(Build(s, nil, nil)); err != nil {
		t.Fatal(err)
	}
	if exists, err := TableExists(s.Bridge); err != nil || exists {
		t.Errorf("nftables table inet %s exists after an empty ruleset: %v (%v)", TableName(s.Bridge), exists, err)
	}
}

// BenchmarkReplaceTable measures what a pod start or stop with hostPorts costs in nftables: the
// whole table rebuilt in one transaction, for dual-stack pods with two hostPorts each.
func BenchmarkReplaceTable(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("needs root (programs nftables)")
	}
	for _, n := range []int{1, 10, 100} {
		b.Run(fmt.Sprintf("pods=%d", n), func(b *testing.B) {
			s, pods := manyPods(n)
			b.Cleanup(func() { DeleteTable(s.Bridge) })
			rs := Build(s, pods, nil)
			rules := 0
			for _, c := range rs.chains {
				rules += len(c.rules)
			}
			for b.Loop() {
				if err := replaceTable(rs); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(rules), "rules")
		})
	}
}
