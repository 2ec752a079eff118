// Package hostport is what a hostPort is: a pod's port mapping as CRI defines it, validated, and
// when two mappings claim the same port of the node.
package hostport

import (
	"fmt"
	"net/netip"
)

// Protocol is the transport protocol of a port mapping, named as CRI names it.
type Protocol string

const (
	TCP  Protocol = "TCP"
	UDP  Protocol = "UDP"
	SCTP Protocol = "SCTP"
)

// Number is the protocol's IP protocol number, 0 for an unknown protocol.
func (p Protocol) Number() uint8 {
	switch p {
	case TCP:
		return 6
	case UDP:
		return 17
	case SCTP:
		return 132
	}
	return 0
}

// Mapping is one of a pod's port mappings as CRI defines them (PodSandboxConfig's
// port_mappings, which NRI passes on): traffic to HostPort on the node goes to ContainerPort of
// the pod. HostIP "" means every address of the node, of both families; "0.0.0.0" and "::" every
// address of one family; any other address only that address.
type Mapping struct {
	Protocol      Protocol `json:"protocol"`
	ContainerPort int32    `json:"containerPort"`
	HostPort      int32    `json:"hostPort"`
	HostIP        string   `json:"hostIP,omitempty"`
}

// HostAddr is the address a published mapping is restricted to; invalid for every address.
func (m Mapping) HostAddr() netip.Addr {
	addr, err := netip.ParseAddr(m.HostIP)
	if err != nil || addr.IsUnspecified() {
		return netip.Addr{}
	}
	return addr
}

// PublishesFamily tells whether a published mapping listens on addresses of the family of addr
// (IPv4 or IPv6).
func (m Mapping) PublishesFamily(is4 bool) bool {
	if m.HostIP == "" {
		return true
	}
	return netip.MustParseAddr(m.HostIP).Is4() == is4
}

// where describes the host addresses a published mapping listens on.
func (m Mapping) where() string {
	switch {
	case m.HostIP == "":
		return "every address"
	case m.HostAddr().IsValid():
		return m.HostIP
	case m.PublishesFamily(true):
		return "every IPv4 address"
	}
	return "every IPv6 address"
}

func (m Mapping) String() string {
	return fmt.Sprintf("hostPort %d/%s on %s (container port %d)", m.HostPort, m.Protocol, m.where(), m.ContainerPort)
}

// Overlaps tells whether two published mappings claim a common (protocol, host address, host
// port): then only one pod can have it.
func (m Mapping) Overlaps(o Mapping) bool {
	if m.Protocol != o.Protocol || m.HostPort != o.HostPort {
		return false
	}
	if !(m.PublishesFamily(true) && o.PublishesFamily(true)) && !(m.PublishesFamily(false) && o.PublishesFamily(false)) {
		return false
	}
	a, b := m.HostAddr(), o.HostAddr()
	return !a.IsValid() || !b.IsValid() || a == b
}

// Published returns the mappings of a pod that publish a host port, validated and with
// HostIP in canonical form, without duplicates. As in CRI (and containerd's CNI path), a mapping
// with host port 0 publishes nothing: the kubelet lists every container port of the pod.
// has4 and has6 tell which families the pods get addresses of.
func Published(mappings []Mapping, has4, has6 bool) ([]Mapping, error) {
	var published []Mapping
	for _, m := range mappings {
		if m.HostPort <= 0 {
			continue
		}
		if m.Protocol.Number() == 0 {
			return nil, fmt.Errorf("hostPort %d: protocol %q is not supported (TCP, UDP or SCTP)", m.HostPort, m.Protocol)
		}
		if m.HostPort > 65535 {
			return nil, fmt.Errorf("hostPort %d/%s: not a port number (1-65535)", m.HostPort, m.Protocol)
		}
		if m.ContainerPort < 1 || m.ContainerPort > 65535 {
			return nil, fmt.Errorf("hostPort %d/%s: container port %d is not a port number (1-65535)", m.HostPort, m.Protocol, m.ContainerPort)
		}
		if m.HostIP != "" {
			addr, err := netip.ParseAddr(m.HostIP)
			if err != nil || addr.Zone() != "" {
				return nil, fmt.Errorf("hostPort %d/%s: hostIP %q is not an IP address", m.HostPort, m.Protocol, m.HostIP)
			}
			if addr == netip.IPv6Loopback() {
				return nil, fmt.Errorf("hostPort %d/%s: hostIP ::1 cannot be forwarded to a pod (IPv6 packets from ::1 never leave the node)", m.HostPort, m.Protocol)
			}
			m.HostIP = addr.Unmap().String()
		}
		if !(has4 && m.PublishesFamily(true)) && !(has6 && m.PublishesFamily(false)) {
			family := "IPv6"
			if m.PublishesFamily(true) {
				family = "IPv4"
			}
			return nil, fmt.Errorf("%s: pods get no %s address from nri-bridge (no %s subnet configured)", m, family, family)
		}
		duplicate := false
		for _, p := range published {
			if p == m {
				duplicate = true
				break
			}
			if p.Overlaps(m) {
				return nil, fmt.Errorf("the pod lists both %s and %s", p, m)
			}
		}
		if !duplicate {
			published = append(published, m)
		}
	}
	return published, nil
}
