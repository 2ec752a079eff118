package firewall

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"

	nrilog "github.com/containerd/nri/pkg/log"
	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

var log = nrilog.Get()

// NFT applies rulesets to the host's nftables through netlink (no nft or iptables
// binary), and makes the host settings they need.
type NFT struct {
	bridge string
}

// NewNFT returns the packet filter of the nri-bridge instance that owns bridge.
func NewNFT(bridge string) *NFT {
	return &NFT{bridge: bridge}
}

// Apply replaces the content of the table with rs in one transaction (deleting the table when
// rs is empty), and makes the host settings the rules need: forwarding of the families that are
// forwarded (before the rules; never turned off: other users of the host may rely on it), and
// route_localnet on the bridge (turned on after the guard rule exists, off before it goes).
func (f *NFT) Apply(rs *Ruleset) error {
	for _, fwd := range []struct {
		on     bool
		sysctl string
		family string
	}{
		{rs.forward4, "net/ipv4/ip_forward", "IPv4"},
		{rs.forward6, "net/ipv6/conf/all/forwarding", "IPv6"},
	} {
		if !fwd.on {
			continue
		}
		changed, err := ensureSysctl(fwd.sysctl, "1")
		if err != nil {
			return fmt.Errorf("enabling %s forwarding: %w", fwd.family, err)
		}
		if changed {
			log.Infof(context.Background(), "nri-bridge: enabled %s forwarding (%s = 1) for hostPorts/masquerade", fwd.family, sysctlName(fwd.sysctl))
		}
	}
	if !rs.routeLocalnet {
		if err := f.setRouteLocalnet(false); err != nil {
			return err
		}
	}
	if err := replaceTable(rs); err != nil {
		return err
	}
	if rs.routeLocalnet {
		return f.setRouteLocalnet(true)
	}
	return nil
}

// replaceTable deletes the table and creates it again with the content of rs, in one batch
// that the kernel commits atomically: no packet ever sees a partial table.
func replaceTable(rs *Ruleset) error {
	messages := 4 // add, delete, add table; batch end
	for _, c := range rs.chains {
		messages += 1 + len(c.rules)
	}
	messages += 2 * len(rs.sets) // the set, its elements
	conn, err := nftables.New(nftables.WithSockOptions(batchBuffers(messages)))
	if err != nil {
		return fmt.Errorf("nftables: %w", err)
	}
	table := &nftables.Table{Name: rs.table, Family: nftables.TableFamilyINet}
	conn.AddTable(table) // so that the deletion never fails for a missing table
	conn.DelTable(table)
	if len(rs.chains) > 0 {
		conn.AddTable(table)
		setIDs := map[string]uint32{}
		for _, s := range rs.sets {
			set := &nftables.Set{Table: table, Name: s.name, KeyType: nftables.TypeIP6Addr, Interval: true}
			if s.is4 {
				set.KeyType = nftables.TypeIPAddr
			}
			if err := conn.AddSet(set, s.elements()); err != nil {
				return fmt.Errorf("nftables set %s: %w", s.name, err)
			}
			setIDs[s.name] = set.ID
		}
		chains := map[string]*nftables.Chain{}
		for _, c := range rs.chains {
			chains[c.name] = conn.AddChain(nftChain(table, c))
		}
		for _, c := range rs.chains {
			for _, r := range c.rules {
				var exprs []expr.Any
				for _, m := range r.matches {
					exprs = append(exprs, m.exprs()...)
				}
				exprs = append(exprs, r.verdict.exprs()...)
				for _, e := range exprs {
					if lookup, ok := e.(*expr.Lookup); ok { // a set of this batch: by its ID
						lookup.SetID = setIDs[lookup.SetName]
					}
				}
				rule := &nftables.Rule{Table: table, Chain: chains[c.name], Exprs: exprs}
				if r.comment != "" {
					rule.UserData = userdata.AppendString(nil, userdata.TypeComment, r.comment)
				}
				conn.AddRule(rule)
			}
		}
	}
	if err := conn.Flush(); err != nil {
		return fmt.Errorf("nftables table inet %s: %w", rs.table, err)
	}
	return nil
}

// batchBuffers sizes the netlink socket's buffers for a batch of that many messages. The kernel
// takes a batch from a single sendmsg, which the send buffer bounds, and acks every message into
// the receive buffer: Linux's default buffers (about 208 KiB) hold a few hundred rules, that is a
// hundred or so pods with hostPorts. Root may exceed net.core.wmem_max and rmem_max.
func batchBuffers(messages int) nftables.SockOption {
	size := 1<<20 + messages*4096
	return func(conn *netlink.Conn) error {
		raw, err := conn.SyscallConn()
		if err != nil {
			return err
		}
		var sockErr error
		err = raw.Control(func(fd uintptr) {
			for _, option := range []int{unix.SO_SNDBUFFORCE, unix.SO_RCVBUFFORCE} {
				if sockErr == nil {
					sockErr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, option, size)
				}
			}
		})
		if err == nil {
			err = sockErr
		}
		if err != nil {
			return fmt.Errorf("sizing the netlink buffers for %d messages: %w", messages, err)
		}
		return nil
	}
}

// DeleteTable removes the table of bridge, if any.
func DeleteTable(bridge string) error {
	return replaceTable(&Ruleset{table: TableName(bridge)})
}

// TableExists tells whether bridge has a table.
func TableExists(bridge string) (bool, error) {
	conn, err := nftables.New()
	if err != nil {
		return false, fmt.Errorf("nftables: %w", err)
	}
	tables, err := conn.ListTablesOfFamily(nftables.TableFamilyINet)
	if err != nil {
		return false, fmt.Errorf("nftables: listing tables: %w", err)
	}
	for _, t := range tables {
		if t.Name == TableName(bridge) {
			return true, nil
		}
	}
	return false, nil
}

func nftChain(table *nftables.Table, c *chain) *nftables.Chain {
	nc := &nftables.Chain{Name: c.name, Table: table}
	if c.hook == nil {
		return nc
	}
	nc.Type = nftables.ChainType(c.hook.kind)
	nc.Priority = new(nftables.ChainPriority(c.hook.priority))
	switch c.hook.hook {
	case "prerouting":
		nc.Hooknum = nftables.ChainHookPrerouting
	case "output":
		nc.Hooknum = nftables.ChainHookOutput
	case "postrouting":
		nc.Hooknum = nftables.ChainHookPostrouting
	default:
		panic("nri-bridge: unknown hook " + c.hook.hook)
	}
	return nc
}

// Every expression loads into and compares register 1; DNAT also uses register 2.
const (
	reg1 = 1
	reg2 = 2
)

func cmpEq(data []byte) *expr.Cmp { return &expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: data} }

func (m nfproto) exprs() []expr.Any {
	family := byte(unix.NFPROTO_IPV6)
	if m.is4 {
		family = unix.NFPROTO_IPV4
	}
	return []expr.Any{&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: reg1}, cmpEq([]byte{family})}
}

// loadAddr loads the packet's source or destination address of a family into register 1.
func loadAddr(source, is4 bool) *expr.Payload {
	// Offsets of the source and destination addresses in the IPv4 and IPv6 headers.
	offset, size := uint32(16), uint32(4)
	if source {
		offset = 12
	}
	if !is4 {
		offset, size = 24, 16
		if source {
			offset = 8
		}
	}
	return &expr.Payload{DestRegister: reg1, Base: expr.PayloadBaseNetworkHeader, Offset: offset, Len: size}
}

func (m addrMatch) exprs() []expr.Any {
	load := loadAddr(m.source, m.prefix.Addr().Is4())
	size := load.Len
	exprs := []expr.Any{load}
	if !m.prefix.IsSingleIP() {
		mask := net.CIDRMask(m.prefix.Bits(), m.prefix.Addr().BitLen())
		exprs = append(exprs, &expr.Bitwise{SourceRegister: reg1, DestRegister: reg1, Len: size,
			Mask: mask, Xor: make([]byte, size)})
	}
	op := expr.CmpOpEq
	if m.not {
		op = expr.CmpOpNeq
	}
	return append(exprs, &expr.Cmp{Op: op, Register: reg1, Data: m.prefix.Masked().Addr().AsSlice()})
}

// elements are the set's ranges as an interval set holds them: each range's first address, and
// the address after its last one flagged as the end of the interval (none after the family's
// last address).
func (s *addrSet) elements() []nftables.SetElement {
	var elements []nftables.SetElement
	for _, r := range s.ranges {
		elements = append(elements, nftables.SetElement{Key: r.first.AsSlice()})
		if end := r.last.Next(); end.IsValid() {
			elements = append(elements, nftables.SetElement{Key: end.AsSlice(), IntervalEnd: true})
		}
	}
	return elements
}

func (m inSet) exprs() []expr.Any {
	return []expr.Any{loadAddr(false, m.set.is4), &expr.Lookup{SourceRegister: reg1, SetName: m.set.name, Invert: m.not}}
}

func (m portMatch) exprs() []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: reg1}, cmpEq([]byte{m.proto.Number()}),
		// The destination port is at the same offset in TCP, UDP and SCTP headers.
		&expr.Payload{DestRegister: reg1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		cmpEq(binaryutil.BigEndian.PutUint16(m.port)),
	}
}

func (m ifMatch) exprs() []expr.Any {
	key := expr.MetaKeyIIFNAME
	if m.output {
		key = expr.MetaKeyOIFNAME
	}
	name := make([]byte, unix.IFNAMSIZ)
	copy(name, m.name)
	return []expr.Any{&expr.Meta{Key: key, Register: reg1}, cmpEq(name)}
}

func (localDst) exprs() []expr.Any {
	return []expr.Any{
		&expr.Fib{Register: reg1, FlagDADDR: true, ResultADDRTYPE: true},
		cmpEq(binaryutil.NativeEndian.PutUint32(unix.RTN_LOCAL)),
	}
}

func (ctDNAT) exprs() []expr.Any {
	const ipsDstNAT = 1 << 5 // IPS_DST_NAT of the conntrack status bits
	return []expr.Any{
		&expr.Ct{Key: expr.CtKeySTATUS, Register: reg1},
		&expr.Bitwise{SourceRegister: reg1, DestRegister: reg1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(ipsDstNAT), Xor: make([]byte, 4)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: reg1, Data: make([]byte, 4)},
	}
}

func (v jump) exprs() []expr.Any {
	return []expr.Any{&expr.Verdict{Kind: expr.VerdictJump, Chain: v.chain}}
}

func (v dnat) exprs() []expr.Any {
	family := uint32(unix.NFPROTO_IPV6)
	if v.to.Addr().Is4() {
		family = unix.NFPROTO_IPV4
	}
	return []expr.Any{
		&expr.Immediate{Register: reg1, Data: v.to.Addr().AsSlice()},
		&expr.Immediate{Register: reg2, Data: binaryutil.BigEndian.PutUint16(v.to.Port())},
		&expr.NAT{Type: expr.NATTypeDestNAT, Family: family, RegAddrMin: reg1, RegProtoMin: reg2, Specified: true},
	}
}

func (ret) exprs() []expr.Any { return []expr.Any{&expr.Verdict{Kind: expr.VerdictReturn}} }

func (masquerade) exprs() []expr.Any { return []expr.Any{&expr.Masq{}} }

func (drop) exprs() []expr.Any { return []expr.Any{&expr.Verdict{Kind: expr.VerdictDrop}} }

// setRouteLocalnet lets the bridge route 127.0.0.0/8 (IPv4 localhost DNATed to a pod), or not.
// A missing bridge needs nothing turned off.
func (f *NFT) setRouteLocalnet(on bool) error {
	value := "0"
	if on {
		value = "1"
	}
	name := "net/ipv4/conf/" + f.bridge + "/route_localnet"
	if _, err := ensureSysctl(name, value); err != nil {
		if !on && errors.Is(err, os.ErrNotExist) {
			return nil
		}
		return fmt.Errorf("bridge %s: setting %s = %s: %w", f.bridge, sysctlName(name), value, err)
	}
	return nil
}

// ensureSysctl sets /proc/sys/<name> to value unless it has it already.
func ensureSysctl(name, value string) (changed bool, err error) {
	path := filepath.Join("/proc/sys", name)
	current, err := os.ReadFile(path)
	if err != nil {
		return false, err
	}
	if strings.TrimSpace(string(current)) == value {
		return false, nil
	}
	return true, os.WriteFile(path, []byte(value), 0o644)
}

// sysctlName is the dotted name of a sysctl path, as sysctl(8) shows it.
func sysctlName(path string) string {
	return strings.ReplaceAll(path, "/", ".")
}
