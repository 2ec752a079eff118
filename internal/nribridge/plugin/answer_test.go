package plugin

import (
	"bytes"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/containerd/nri/pkg/api"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// nri-bridge reports a pod's addresses in its RunPodSandbox answer, IPv4 first when both families
// are configured; a pod it does not network (host network) gets no adjustment.
func TestRunPodSandboxAnswer(t *testing.T) {
	for _, tc := range []struct{ subnets, ips string }{
		{`ipv6: {subnet: "fd00:5::/64"}, ipv4: {subnet: 10.5.0.0/24}`, "10.5.0.2,fd00:5::2"},
		{`ipv4: {subnet: 10.5.0.0/24}`, "10.5.0.2"},
		{`ipv6: {subnet: "fd00:5::/64"}`, "fd00:5::2"},
	} {
		p, _ := newTestPlugin(t, testPodDoc(t, tc.subnets))
		adjust, err := p.RunPodSandbox(ctx, testPod("a"))
		if err != nil {
			t.Fatal(err)
		}
		if got := strings.Join(adjust.GetNetwork().GetIps(), ","); got != tc.ips {
			t.Errorf("%s: RunPodSandbox answers IPs %q, want %q", tc.subnets, got, tc.ips)
		}
		// A replay answers the same addresses.
		if adjust, err = p.RunPodSandbox(ctx, testPod("a")); err != nil || strings.Join(adjust.GetNetwork().GetIps(), ",") != tc.ips {
			t.Errorf("%s: replayed RunPodSandbox answers %v, %v; want %q", tc.subnets, adjust, err, tc.ips)
		}
		if adjust, err := p.RunPodSandbox(ctx, hostNetworkPod("h")); err != nil || adjust != nil {
			t.Errorf("host-network pod: %v, %v; want no adjustment", adjust, err)
		}
	}
}

// On a secondary interface the pod's IPs are the pod network's: nri-bridge reports none of them.
func TestRunPodSandboxSecondaryInterfaceReportsNoIP(t *testing.T) {
	p, _ := newTestPlugin(t, testPodDoc(t, `interface: net1, ipv4: {subnet: 10.5.0.0/24}`))
	adjust, err := p.RunPodSandbox(ctx, testPod("a"))
	if err != nil || adjust != nil {
		t.Errorf("pod a on a secondary interface: %v, %v; want no adjustment", adjust, err)
	}
	if ips := podIPsOK(t, p, testPod("a")); ips != "10.5.0.2" {
		t.Fatalf("pod a has addresses %q, want 10.5.0.2", ips)
	}
}

// Through NRI, the runtime learns the pod's IPs from RunPodSandbox, and nri-bridge is not
// subscribed to status queries: they make no call to it.
func TestRunPodSandboxAnswerThroughNRI(t *testing.T) {
	socket := filepath.Join(t.TempDir(), "nri.sock")
	p, _ := newTestPlugin(t, testPodDoc(t, `ipv4: {subnet: 10.5.0.0/24}, ipv6: {subnet: "fd00:5::/64"}`))
	go runStandalone(t.Context(), p, socket, "bridge", "10")

	rt := startFakeRuntime(t, socket, "")
	rt.expect(t, "synced")
	rt.ask(t, "runips a", "ip=10.5.0.2 additional=[fd00:5::2] owners=[10.5.0.2@10-bridge fd00:5::2@10-bridge]")
	rt.ask(t, "status a", "result []")
	rt.do(t, "stop a")
}

// pr295RunPodSandboxResponse encodes, field by field, a RunPodSandboxResponse as containerd/nri's
// pull request 295 defines it: adjust = 1 (PodSandboxAdjustment), its network = 1
// (PodSandboxNetwork), its ips = 1 (repeated string).
func pr295RunPodSandboxResponse(ips ...string) []byte {
	var network []byte
	for _, ip := range ips {
		network = protowire.AppendTag(network, 1, protowire.BytesType)
		network = protowire.AppendString(network, ip)
	}
	var adjust []byte
	adjust = protowire.AppendTag(adjust, 1, protowire.BytesType)
	adjust = protowire.AppendBytes(adjust, network)
	var response []byte
	response = protowire.AppendTag(response, 1, protowire.BytesType)
	return protowire.AppendBytes(response, adjust)
}

// A plugin built against pull request 295's API and knext's API speak the same bytes: its answer
// decodes with knext's generated code to the same IPs, and nri-bridge's answer encodes to them.
func TestRunPodSandboxResponseWireFormat(t *testing.T) {
	ips := []string{"10.5.0.2", "fd00:5::2"}
	wire := pr295RunPodSandboxResponse(ips...)

	var decoded api.RunPodSandboxResponse
	if err := proto.Unmarshal(wire, &decoded); err != nil {
		t.Fatal(err)
	}
	if got := decoded.GetAdjust().GetNetwork().GetIps(); !slices.Equal(got, ips) {
		t.Errorf("knext decodes pull request 295's RunPodSandboxResponse to IPs %v, want %v", got, ips)
	}
	if unknown := decoded.GetAdjust().GetNetwork().ProtoReflect().GetUnknown(); len(unknown) != 0 {
		t.Errorf("fields knext does not know: %x", unknown)
	}

	p, _ := newTestPlugin(t, testPodDoc(t, `ipv4: {subnet: 10.5.0.0/24}, ipv6: {subnet: "fd00:5::/64"}`))
	adjust, err := p.RunPodSandbox(ctx, testPod("a"))
	if err != nil {
		t.Fatal(err)
	}
	encoded, err := proto.MarshalOptions{Deterministic: true}.Marshal(&api.RunPodSandboxResponse{Adjust: adjust})
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(encoded, wire) {
		t.Errorf("nri-bridge's RunPodSandbox answer encodes to %x, pull request 295's to %x", encoded, wire)
	}
}
