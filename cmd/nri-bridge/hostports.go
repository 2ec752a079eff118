package main

import (
	"fmt"
	"net/netip"
)

// protocol is the transport protocol of a port mapping, named as CRI names it.
type protocol string

const (
	protoTCP  protocol = "TCP"
	protoUDP  protocol = "UDP"
	protoSCTP protocol = "SCTP"
)

// number is the protocol's IP protocol number, 0 for an unknown protocol.
func (p protocol) number() uint8 {
	switch p {
	case protoTCP:
		return 6
	case protoUDP:
		return 17
	case protoSCTP:
		return 132
	}
	return 0
}

// portMapping is one of a pod's port mappings as CRI defines them (PodSandboxConfig's
// port_mappings, which NRI passes on): traffic to HostPort on the node goes to ContainerPort of
// the pod. HostIP "" means every address of the node, of both families; "0.0.0.0" and "::" every
// address of one family; any other address only that address.
type portMapping struct {
	Protocol      protocol `json:"protocol"`
	ContainerPort int32    `json:"containerPort"`
	HostPort      int32    `json:"hostPort"`
	HostIP        string   `json:"hostIP,omitempty"`
}

// hostAddr is the address a published mapping is restricted to; invalid for every address.
func (m portMapping) hostAddr() netip.Addr {
	addr, err := netip.ParseAddr(m.HostIP)
	if err != nil || addr.IsUnspecified() {
		return netip.Addr{}
	}
	return addr
}

// publishesFamily tells whether a published mapping listens on addresses of the family of addr
// (IPv4 or IPv6).
func (m portMapping) publishesFamily(is4 bool) bool {
	if m.HostIP == "" {
		return true
	}
	return netip.MustParseAddr(m.HostIP).Is4() == is4
}

// where describes the host addresses a published mapping listens on.
func (m portMapping) where() string {
	switch {
	case m.HostIP == "":
		return "every address"
	case m.hostAddr().IsValid():
		return m.HostIP
	case m.publishesFamily(true):
		return "every IPv4 address"
	}
	return "every IPv6 address"
}

func (m portMapping) String() string {
	return fmt.Sprintf("hostPort %d/%s on %s (container port %d)", m.HostPort, m.Protocol, m.where(), m.ContainerPort)
}

// overlaps tells whether two published mappings claim a common (protocol, host address, host
// port): then only one pod can have it.
func (m portMapping) overlaps(o portMapping) bool {
	if m.Protocol != o.Protocol || m.HostPort != o.HostPort {
		return false
	}
	if !(m.publishesFamily(true) && o.publishesFamily(true)) && !(m.publishesFamily(false) && o.publishesFamily(false)) {
		return false
	}
	a, b := m.hostAddr(), o.hostAddr()
	return !a.IsValid() || !b.IsValid() || a == b
}

// publishedPorts returns the mappings of a pod that publish a host port, validated and with
// HostIP in canonical form, without duplicates. As in CRI (and containerd's CNI path), a mapping
// with host port 0 publishes nothing: the kubelet lists every container port of the pod.
// has4 and has6 tell which families the pods get addresses of.
func publishedPorts(mappings []portMapping, has4, has6 bool) ([]portMapping, error) {
	var published []portMapping
	for _, m := range mappings {
		if m.HostPort <= 0 {
			continue
		}
		if m.Protocol.number() == 0 {
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
		if !(has4 && m.publishesFamily(true)) && !(has6 && m.publishesFamily(false)) {
			family := "IPv6"
			if m.publishesFamily(true) {
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
			if p.overlaps(m) {
				return nil, fmt.Errorf("the pod lists both %s and %s", p, m)
			}
		}
		if !duplicate {
			published = append(published, m)
		}
	}
	return published, nil
}
