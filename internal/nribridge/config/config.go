// Package config is nri-bridge's configuration: the YAML document and flags an operator writes,
// and the validated settings the other packages work from.
package config

import (
	"errors"
	"flag"
	"fmt"
	"net/netip"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"sigs.k8s.io/yaml"
)

// Config is the plugin configuration as an operator writes it: the YAML that NRI passes to
// Configure (plugin_config_path/<idx>-<name>.conf), the -config file, or flags.
type Config struct {
	// Bridge is the host bridge the pods' veths are attached to; created if missing.
	Bridge string `json:"bridge,omitempty"`
	// MTU of the bridge and of both ends of every veth.
	MTU int `json:"mtu,omitempty"`
	// StateDir holds the allocation database.
	StateDir string `json:"stateDir,omitempty"`
	// IPv4 and IPv6 are the pod subnets; at least one is required.
	IPv4 *SubnetConfig `json:"ipv4,omitempty"`
	IPv6 *SubnetConfig `json:"ipv6,omitempty"`
	// Masquerade translates the source of pod traffic leaving the pod subnets to the node's
	// address, so that pods reach networks that have no route back to them.
	Masquerade bool `json:"masquerade,omitempty"`
	// Interface is the pod's interface. With eth0, the name containerd gives CNI's interface,
	// nri-bridge is the pod network. Any other name makes it a secondary network next to the
	// pod network (CNI's eth0): see Settings.Secondary.
	Interface string `json:"interface,omitempty"`
	// ClusterCIDRs are the pod subnets of the whole cluster: pod traffic to them is never
	// masqueraded. Without it, that is every node's spec.podCIDRs in cluster mode and the
	// node's own pod subnets otherwise; the node's own pod subnets are always part of it.
	ClusterCIDRs []string `json:"clusterCIDRs,omitempty"`
}

// SubnetConfig is one family's pod subnet.
type SubnetConfig struct {
	Subnet string `json:"subnet"`
	// Gateway is the bridge's address and the pods' default gateway; defaults to the first
	// address of Subnet.
	Gateway string `json:"gateway,omitempty"`
}

const (
	DefaultBridge   = "nribr0"
	DefaultMTU      = 1500
	DefaultStateDir = "/var/lib/nri-bridge"
	// DefaultInterface is the pod's interface as containerd names CNI's: the pod network's.
	DefaultInterface = "eth0"
	MaxIfNameLen     = 15 // IFNAMSIZ - 1
)

// Default is the configuration before the YAML document and the flags.
func Default() Config {
	return Config{Bridge: DefaultBridge, MTU: DefaultMTU, StateDir: DefaultStateDir, Interface: DefaultInterface}
}

// Settings is a validated Config. The fields are read-only for its users.
type Settings struct {
	Bridge   string
	MTU      int
	StateDir string
	Pools    []Pool // IPv4 first when both are configured: the first pool gives the primary IP
	// Masquerade: see Config.Masquerade.
	Masquerade bool
	// PodInterface: see Config.Interface.
	PodInterface string
	// ClusterCIDRs: see Config.ClusterCIDRs (without the node's own pod subnets).
	ClusterCIDRs []netip.Prefix
	// Cluster tells that the node is part of a cluster whose nodes route each other's pod
	// subnets (cluster mode): the pools are the node's spec.podCIDRs and pod traffic is
	// forwarded to the other nodes.
	Cluster bool
}

// Equal tells whether two settings are the same configuration.
func (s *Settings) Equal(o *Settings) bool {
	return s.Bridge == o.Bridge && s.MTU == o.MTU && s.StateDir == o.StateDir && slices.Equal(s.Pools, o.Pools) &&
		s.Masquerade == o.Masquerade && s.PodInterface == o.PodInterface &&
		slices.Equal(s.ClusterCIDRs, o.ClusterCIDRs) && s.Cluster == o.Cluster
}

// Secondary tells whether the pods' interface is a secondary network next to the pod network
// (CNI's eth0), which owns the pod's default routes, IPs and hostPorts: nri-bridge then sets no
// default route, reports no pod IP and publishes no hostPort.
func (s *Settings) Secondary() bool {
	return s.PodInterface != DefaultInterface
}

// DefaultRoutePools are the pools whose gateways are the pods' default routes: none on a
// secondary interface.
func (s *Settings) DefaultRoutePools() []Pool {
	if s.Secondary() {
		return nil
	}
	return s.Pools
}

// HasFamily tells whether pods get an address of the family (IPv4 or IPv6).
func (s *Settings) HasFamily(is4 bool) bool {
	for _, p := range s.Pools {
		if p.Subnet.Addr().Is4() == is4 {
			return true
		}
	}
	return false
}

// Pool is one family's subnet with the addresses that pods never get.
type Pool struct {
	Family  string // "IPv4" or "IPv6", as errors name it
	Subnet  netip.Prefix
	Gateway netip.Addr
}

func (p Pool) String() string {
	return fmt.Sprintf("%s %s gateway %s", p.Family, p.Subnet, p.Gateway)
}

// GatewayPrefix is the gateway address with the subnet's length, as set on the bridge.
func (p Pool) GatewayPrefix() netip.Prefix {
	return netip.PrefixFrom(p.Gateway, p.Subnet.Bits())
}

// Reserved tells whether addr is never handed to a pod: the network address (IPv6: the
// subnet-router anycast address), the gateway and, for IPv4, the broadcast address.
func (p Pool) Reserved(addr netip.Addr) bool {
	return addr == p.Subnet.Addr() || addr == p.Gateway || (addr.Is4() && addr == LastAddr(p.Subnet))
}

// LastAddr is the highest address of prefix.
func LastAddr(prefix netip.Prefix) netip.Addr {
	raw := prefix.Addr().AsSlice()
	for bit := prefix.Bits(); bit < len(raw)*8; bit++ {
		raw[bit/8] |= 0x80 >> (bit % 8)
	}
	addr, _ := netip.AddrFromSlice(raw)
	return addr
}

// Validate checks everything that can be checked without looking at the host, for a node whose
// pod subnets are the configuration's own (ipv4.subnet, ipv6.subnet).
func (c Config) Validate() (*Settings, error) {
	s, err := c.validateNode()
	if err != nil {
		return nil, err
	}
	if c.IPv4 == nil && c.IPv6 == nil {
		return nil, errors.New("no pod subnet configured: set ipv4.subnet and/or ipv6.subnet " +
			"(or run nri-bridge in cluster mode, where they are the Node's spec.podCIDRs: docs/cni-less.md)")
	}
	for _, fc := range []struct {
		family string
		cfg    *SubnetConfig
	}{{"IPv4", c.IPv4}, {"IPv6", c.IPv6}} {
		if fc.cfg == nil {
			continue
		}
		p, err := parsePool(fc.family, strings.ToLower(fc.family)+".subnet", fc.cfg)
		if err != nil {
			return nil, err
		}
		s.Pools = append(s.Pools, p)
	}
	return s, s.checkMTU()
}

// CheckCluster checks a configuration for cluster mode before the node's pod subnets are known:
// they are the Node's, so the configuration names none, and nri-bridge is the pod network.
func (c Config) CheckCluster() error {
	_, err := c.validateCluster()
	return err
}

func (c Config) validateCluster() (*Settings, error) {
	if c.IPv4 != nil || c.IPv6 != nil {
		return nil, errors.New("ipv4/ipv6 subnets configured in cluster mode: the pod subnets are the Node's spec.podCIDRs; " +
			"remove ipv4 and ipv6 from the configuration (or run without a kubeconfig or service account token, with the configuration's subnets)")
	}
	s, err := c.validateNode()
	if err != nil {
		return nil, err
	}
	if s.Secondary() {
		return nil, fmt.Errorf("interface %s in cluster mode: the Node's pod CIDRs belong to the pod network, %s", c.Interface, DefaultInterface)
	}
	s.Cluster = true
	return s, nil
}

// ValidateCluster checks a configuration for cluster mode with the node's pod subnets, the
// spec.podCIDRs (at most one per family) of the Node called node.
func (c Config) ValidateCluster(node string, podCIDRs []netip.Prefix) (*Settings, error) {
	s, err := c.validateCluster()
	if err != nil {
		return nil, err
	}
	if len(podCIDRs) == 0 {
		return nil, fmt.Errorf("Node %s has no spec.podCIDRs", node)
	}
	for _, cidr := range podCIDRs {
		family := "IPv6"
		if cidr.Addr().Is4() {
			family = "IPv4"
		}
		if s.HasFamily(family == "IPv4") {
			return nil, fmt.Errorf("Node %s has two %s pod CIDRs %v: nri-bridge takes one per family", node, family, podCIDRs)
		}
		p, err := parsePool(family, fmt.Sprintf("Node %s's pod CIDR", node), &SubnetConfig{Subnet: cidr.String()})
		if err != nil {
			return nil, err
		}
		s.Pools = append(s.Pools, p)
	}
	slices.SortStableFunc(s.Pools, func(a, b Pool) int { // IPv4 first: it gives the primary IP
		return strings.Compare(a.Family, b.Family)
	})
	return s, s.checkMTU()
}

// validateNode checks what does not depend on the pod subnets.
func (c Config) validateNode() (*Settings, error) {
	s := &Settings{Bridge: c.Bridge, MTU: c.MTU, StateDir: c.StateDir, Masquerade: c.Masquerade, PodInterface: c.Interface}
	if err := validIfName(c.Bridge); err != nil {
		return nil, fmt.Errorf("bridge: %w", err)
	}
	if err := validIfName(c.Interface); err != nil {
		return nil, fmt.Errorf("interface: %w", err)
	}
	if c.Interface == "lo" {
		return nil, errors.New(`interface "lo": the pod's loopback interface cannot carry the pod's addresses`)
	}
	if c.Masquerade && s.Secondary() {
		return nil, fmt.Errorf("masquerade with interface %s: the pods' traffic beyond the pod subnets leaves through the pod network's default route, not through %s; remove masquerade",
			c.Interface, c.Interface)
	}
	if c.StateDir == "" || !filepath.IsAbs(c.StateDir) {
		return nil, fmt.Errorf("stateDir %q: must be an absolute path", c.StateDir)
	}
	for _, text := range c.ClusterCIDRs {
		cidr, err := netip.ParsePrefix(text)
		switch {
		case err != nil:
			return nil, fmt.Errorf("clusterCIDRs: %q is not a CIDR subnet: %w", text, err)
		case cidr.Masked() != cidr || cidr.Addr().Is4In6():
			return nil, fmt.Errorf("clusterCIDRs: %s has host bits set (the subnet is %s)", cidr, cidr.Masked())
		case !cidr.Addr().IsGlobalUnicast():
			return nil, fmt.Errorf("clusterCIDRs: %s is not a unicast subnet (loopback, link-local, multicast or unspecified)", cidr)
		}
		s.ClusterCIDRs = append(s.ClusterCIDRs, cidr)
	}
	return s, nil
}

// checkMTU checks the MTU against the families of the pools.
func (s *Settings) checkMTU() error {
	minMTU := 576 // RFC 791: every IPv4 host accepts 576-byte datagrams
	if s.HasFamily(false) {
		minMTU = 1280 // RFC 8200
	}
	if s.MTU < minMTU || s.MTU > 65535 {
		return fmt.Errorf("mtu %d: must be between %d and 65535", s.MTU, minMTU)
	}
	return nil
}

func validIfName(name string) error {
	if name == "" || len(name) > MaxIfNameLen || name == "." || name == ".." ||
		strings.ContainsAny(name, "/: \t\n") {
		return fmt.Errorf("%q is not a valid interface name (1-%d characters, no '/', ':' or spaces)",
			name, MaxIfNameLen)
	}
	return nil
}

// parsePool parses the subnet of one family, which errors call subnetKey ("ipv4.subnet").
func parsePool(family, subnetKey string, c *SubnetConfig) (Pool, error) {
	key := strings.ToLower(family)
	subnet, err := netip.ParsePrefix(c.Subnet)
	if err != nil {
		return Pool{}, fmt.Errorf("%s %q: not a CIDR subnet: %w", subnetKey, c.Subnet, err)
	}
	addr := subnet.Addr()
	if is4 := family == "IPv4"; addr.Is4() != is4 || addr.Is4In6() {
		return Pool{}, fmt.Errorf("%s %s: not an %s subnet", subnetKey, subnet, family)
	}
	if subnet.Masked() != subnet {
		return Pool{}, fmt.Errorf("%s %s: host bits set (the subnet is %s)", subnetKey, subnet, subnet.Masked())
	}
	if !addr.IsGlobalUnicast() {
		return Pool{}, fmt.Errorf("%s %s: not a unicast subnet (loopback, link-local, multicast or unspecified)", subnetKey, subnet)
	}
	// The gateway and at least one pod must fit besides the reserved addresses.
	if subnet.Bits() > maxBits(family) {
		return Pool{}, fmt.Errorf("%s %s: too small, no room for a gateway and a pod (at most /%d)",
			subnetKey, subnet, maxBits(family))
	}
	p := Pool{Family: family, Subnet: subnet}
	if c.Gateway == "" {
		p.Gateway = addr.Next()
		return p, nil
	}
	if p.Gateway, err = netip.ParseAddr(c.Gateway); err != nil {
		return Pool{}, fmt.Errorf("%s.gateway %q: not an IP address: %w", key, c.Gateway, err)
	}
	if !subnet.Contains(p.Gateway) {
		return Pool{}, fmt.Errorf("%s.gateway %s: outside subnet %s", key, p.Gateway, subnet)
	}
	if p.Gateway == addr || (p.Gateway.Is4() && p.Gateway == LastAddr(subnet)) {
		return Pool{}, fmt.Errorf("%s.gateway %s: the network or broadcast address of %s", key, p.Gateway, subnet)
	}
	return p, nil
}

// maxBits is the longest prefix with room for the reserved addresses, the gateway and a pod.
func maxBits(family string) int {
	if family == "IPv4" {
		return 30
	}
	return 126
}

// CheckHostOverlap refuses pools that overlap a route of the host that does not go through
// the plugin's own bridge: pods would shadow (or be shadowed by) an existing network.
func (s *Settings) CheckHostOverlap(routes []HostRoute) error {
	for _, p := range s.Pools {
		for _, r := range routes {
			if r.Dev == s.Bridge || r.Dst.Bits() == 0 || !r.Dst.Overlaps(p.Subnet) {
				continue
			}
			return fmt.Errorf("%s subnet %s overlaps the host route %s dev %s", p.Family, p.Subnet, r.Dst, r.Dev)
		}
	}
	return nil
}

// HostRoute is a destination the host already routes somewhere.
type HostRoute struct {
	Dst netip.Prefix
	Dev string
}

// Flags records the flags given on the command line; they override the YAML config.
type Flags struct {
	File      string
	overrides []func(*Config)
}

func (f *Flags) Register(fs *flag.FlagSet) {
	fs.StringVar(&f.File, "config", "", "YAML configuration `file` (standalone mode; a runtime-supplied configuration replaces it)")
	str := func(name, usage string, set func(*Config, string)) {
		fs.Func(name, usage, func(v string) error {
			f.overrides = append(f.overrides, func(c *Config) { set(c, v) })
			return nil
		})
	}
	subnet := func(c **SubnetConfig) *SubnetConfig {
		if *c == nil {
			*c = &SubnetConfig{}
		}
		return *c
	}
	str("bridge", "bridge `name` (default "+DefaultBridge+")", func(c *Config, v string) { c.Bridge = v })
	str("state-dir", "state `directory` (default "+DefaultStateDir+")", func(c *Config, v string) { c.StateDir = v })
	str("interface", "the pods' interface `name` (default "+DefaultInterface+"); another name makes nri-bridge a secondary network next to CNI's "+DefaultInterface, func(c *Config, v string) { c.Interface = v })
	str("ipv4-subnet", "pod IPv4 `CIDR`", func(c *Config, v string) { subnet(&c.IPv4).Subnet = v })
	str("ipv4-gateway", "IPv4 gateway `address` (default: first address of the subnet)", func(c *Config, v string) { subnet(&c.IPv4).Gateway = v })
	str("ipv6-subnet", "pod IPv6 `CIDR`", func(c *Config, v string) { subnet(&c.IPv6).Subnet = v })
	str("ipv6-gateway", "IPv6 gateway `address` (default: first address of the subnet)", func(c *Config, v string) { subnet(&c.IPv6).Gateway = v })
	fs.Func("cluster-cidrs", "comma-separated pod `CIDRs` of the whole cluster, never masqueraded (default: every node's spec.podCIDRs in cluster mode, the pod subnets otherwise)", func(v string) error {
		cidrs := strings.Split(v, ",")
		f.overrides = append(f.overrides, func(c *Config) { c.ClusterCIDRs = cidrs })
		return nil
	})
	fs.BoolFunc("masquerade", "masquerade pod traffic leaving the pod subnets", func(v string) error {
		on, err := strconv.ParseBool(v)
		if err != nil {
			return fmt.Errorf("not a boolean: %q", v)
		}
		f.overrides = append(f.overrides, func(c *Config) { c.Masquerade = on })
		return nil
	})
	fs.Func("mtu", "`MTU` of the bridge and the veths (default "+strconv.Itoa(DefaultMTU)+")", func(v string) error {
		mtu, err := strconv.Atoi(v)
		if err != nil {
			return fmt.Errorf("not a number: %q", v)
		}
		f.overrides = append(f.overrides, func(c *Config) { c.MTU = mtu })
		return nil
	})
}

// Resolve builds the configuration: defaults, then the YAML document (unknown keys are
// an error), then the command line flags.
func Resolve(yamlDoc []byte, flags *Flags) (Config, error) {
	cfg := Default()
	if err := yaml.UnmarshalStrict(yamlDoc, &cfg); err != nil {
		return Config{}, fmt.Errorf("invalid YAML configuration: %w", err)
	}
	for _, override := range flags.overrides {
		override(&cfg)
	}
	return cfg, nil
}

// Load resolves a configuration document with the flags and validates it.
func Load(yamlDoc []byte, flags *Flags) (*Settings, error) {
	cfg, err := Resolve(yamlDoc, flags)
	if err != nil {
		return nil, err
	}
	s, err := cfg.Validate()
	if err != nil {
		return nil, fmt.Errorf("invalid configuration: %w", err)
	}
	return s, nil
}

// LoadCluster resolves a configuration document with the flags and validates it for cluster mode,
// with the spec.podCIDRs of the Node called node.
func LoadCluster(yamlDoc []byte, flags *Flags, node string, podCIDRs []netip.Prefix) (*Settings, error) {
	cfg, err := Resolve(yamlDoc, flags)
	if err != nil {
		return nil, err
	}
	s, err := cfg.ValidateCluster(node, podCIDRs)
	if err != nil {
		return nil, fmt.Errorf("invalid configuration: %w", err)
	}
	return s, nil
}
