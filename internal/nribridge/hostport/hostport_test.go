package hostport

import (
	"fmt"
	"testing"
)

func tcp(hostPort, containerPort int32, hostIP string) Mapping {
	return Mapping{Protocol: TCP, HostPort: hostPort, ContainerPort: containerPort, HostIP: hostIP}
}

func TestPublishedPorts(t *testing.T) {
	udp := Mapping{Protocol: UDP, HostPort: 53, ContainerPort: 5353}
	for _, tc := range []struct {
		name       string
		in         []Mapping
		has4, has6 bool
		want       string // the published mappings, or the error
	}{
		{"hostPort 0 publishes nothing (CRI)", []Mapping{tcp(0, 80, ""), tcp(-1, 81, "")}, true, true, "[]"},
		{"canonical hostIP", []Mapping{tcp(80, 80, "::FFFF:10.0.0.1"), tcp(81, 80, "FD00::0001")}, true, true,
			"[hostPort 80/TCP on 10.0.0.1 (container port 80) hostPort 81/TCP on fd00::1 (container port 80)]"},
		{"unspecified hostIPs", []Mapping{tcp(80, 80, ""), tcp(81, 80, "0.0.0.0"), tcp(82, 80, "::")}, true, true,
			"[hostPort 80/TCP on every address (container port 80) hostPort 81/TCP on every IPv4 address (container port 80) hostPort 82/TCP on every IPv6 address (container port 80)]"},
		{"duplicates collapse", []Mapping{udp, tcp(53, 53, ""), udp}, true, false,
			"[hostPort 53/UDP on every address (container port 5353) hostPort 53/TCP on every address (container port 53)]"},
		{"same port on two addresses", []Mapping{tcp(80, 80, "10.0.0.1"), tcp(80, 81, "10.0.0.2"), tcp(80, 82, "::")}, true, true,
			"[hostPort 80/TCP on 10.0.0.1 (container port 80) hostPort 80/TCP on 10.0.0.2 (container port 81) hostPort 80/TCP on every IPv6 address (container port 82)]"},
		{"one port twice", []Mapping{tcp(80, 80, "0.0.0.0"), tcp(80, 81, "10.0.0.1")}, true, true,
			"the pod lists both hostPort 80/TCP on every IPv4 address (container port 80) and hostPort 80/TCP on 10.0.0.1 (container port 81)"},
		{"unknown protocol", []Mapping{{Protocol: "7", HostPort: 80, ContainerPort: 80}}, true, true,
			`hostPort 80: protocol "7" is not supported (TCP, UDP or SCTP)`},
		{"host port out of range", []Mapping{tcp(65536, 80, "")}, true, true, "hostPort 65536/TCP: not a port number (1-65535)"},
		{"container port out of range", []Mapping{tcp(80, 0, "")}, true, true, "hostPort 80/TCP: container port 0 is not a port number (1-65535)"},
		{"hostIP not an address", []Mapping{tcp(80, 80, "10.0.0.0/8")}, true, true, `hostPort 80/TCP: hostIP "10.0.0.0/8" is not an IP address`},
		{"hostIP with a zone", []Mapping{tcp(80, 80, "fe80::1%eth0")}, true, true, `hostPort 80/TCP: hostIP "fe80::1%eth0" is not an IP address`},
		{"IPv6 localhost", []Mapping{tcp(80, 80, "::1")}, true, true, "hostPort 80/TCP: hostIP ::1 cannot be forwarded to a pod (IPv6 packets from ::1 never leave the node)"},
		{"family without subnet", []Mapping{tcp(80, 80, "0.0.0.0")}, false, true,
			"hostPort 80/TCP on every IPv4 address (container port 80): pods get no IPv4 address from nri-bridge (no IPv4 subnet configured)"},
		{"any address on one family", []Mapping{tcp(80, 80, "")}, false, true, "[hostPort 80/TCP on every address (container port 80)]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Published(tc.in, tc.has4, tc.has6)
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
	udp := Mapping{Protocol: UDP, HostPort: 80, ContainerPort: 80}
	for _, tc := range []struct {
		a, b Mapping
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
		if got := tc.a.Overlaps(tc.b); got != tc.want {
			t.Errorf("%s overlaps %s: got %v, want %v", tc.a, tc.b, got, tc.want)
		}
		if got := tc.b.Overlaps(tc.a); got != tc.want {
			t.Errorf("%s overlaps %s: got %v, want %v", tc.b, tc.a, got, tc.want)
		}
	}
}
