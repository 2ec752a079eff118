package plugin

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
)

func TestPodSandboxStatusAnswer(t *testing.T) {
	for _, tc := range []struct{ subnets, ip, additional string }{
		{`ipv6: {subnet: "fd00:5::/64"}, ipv4: {subnet: 10.5.0.0/24}`, "10.5.0.2", "fd00:5::2"},
		{`ipv4: {subnet: 10.5.0.0/24}`, "10.5.0.2", ""},
		{`ipv6: {subnet: "fd00:5::/64"}`, "fd00:5::2", ""},
	} {
		p, _ := newTestPlugin(t, testPodDoc(t, tc.subnets))
		if err := p.RunPodSandbox(ctx, testPod("a")); err != nil {
			t.Fatal(err)
		}
		rpl, err := p.PodSandboxStatus(ctx, testPod("a"))
		if err != nil {
			t.Fatal(err)
		}
		if rpl.GetIp() != tc.ip || strings.Join(rpl.GetAdditionalIps(), ",") != tc.additional {
			t.Errorf("%s: got ip %q additional %v, want %q %q", tc.subnets, rpl.GetIp(), rpl.GetAdditionalIps(), tc.ip, tc.additional)
		}
		// A pod without allocation (host network, another plugin's, unknown) gets an empty answer.
		rpl, err = p.PodSandboxStatus(ctx, hostNetworkPod("h"))
		if err != nil || rpl == nil || rpl.GetIp() != "" || len(rpl.GetAdditionalIps()) != 0 {
			t.Errorf("pod without allocation: %v, %v", rpl, err)
		}
	}
}

// On a secondary interface the pod's IPs are the pod network's: nri-bridge owns none of them.
func TestPodSandboxStatusSecondaryInterfaceOwnsNoIP(t *testing.T) {
	p, _ := newTestPlugin(t, testPodDoc(t, `interface: net1, ipv4: {subnet: 10.5.0.0/24}`))
	if err := p.RunPodSandbox(ctx, testPod("a")); err != nil {
		t.Fatal(err)
	}
	if ips := podIPsOK(t, p, testPod("a")); ips != "10.5.0.2" {
		t.Fatalf("pod a has addresses %q, want 10.5.0.2", ips)
	}
	rpl, err := p.PodSandboxStatus(ctx, testPod("a"))
	if err != nil || rpl == nil || rpl.GetIp() != "" || len(rpl.GetAdditionalIps()) != 0 {
		t.Errorf("pod a on a secondary interface: answer %v, %v; want an empty answer", rpl, err)
	}
}

func TestPodSandboxStatusThroughNRI(t *testing.T) {
	socket := filepath.Join(t.TempDir(), "nri.sock")
	p, _ := newTestPlugin(t, testPodDoc(t, `ipv4: {subnet: 10.5.0.0/24}, ipv6: {subnet: "fd00:5::/64"}`))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go runStandalone(ctx, p, socket, "bridge", "10")

	rt := startFakeRuntime(t, socket, "")
	rt.expect(t, "synced")
	rt.do(t, "run a")
	rt.ask(t, "status a", "ip=10.5.0.2 additional=[fd00:5::2] owners=[10.5.0.2@10-bridge fd00:5::2@10-bridge] noanswer=0")
	rt.ask(t, "status unknown", "ip= additional=[] owners=[] noanswer=0")
	rt.do(t, "stop a")
	p.waitReleases()
	rt.ask(t, "status a", "ip= additional=[] owners=[] noanswer=0")
}
