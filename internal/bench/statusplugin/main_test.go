package main

import (
	"context"
	"net/netip"
	"os"
	"path/filepath"
	"testing"

	"github.com/containerd/nri/pkg/api"
)

func newTestPlugin(t *testing.T, primary bool) *plugin {
	return &plugin{primary: primary, prefix: netip.MustParseAddr("2001:db8:7::"), readyFile: filepath.Join(t.TempDir(), "ready")}
}

var ownPrefix = netip.MustParsePrefix("2001:db8:7::/64")

func TestAnswersFromMemoryOnceSynchronized(t *testing.T) {
	ctx := context.Background()
	p := newTestPlugin(t, true)
	pod := &api.PodSandbox{Id: "pod-1"}
	_, syncErr := p.Synchronize(ctx, []*api.PodSandbox{pod}, nil)
	if _, err := os.Stat(p.readyFile); syncErr != nil || err != nil {
		t.Fatalf("Synchronize: %v, and its ready file: %v", syncErr, err)
	}
	resp, err := p.PodSandboxStatus(ctx, pod)
	ip, parseErr := netip.ParseAddr(resp.GetIp())
	if err != nil || parseErr != nil || !ownPrefix.Contains(ip) || len(resp.AdditionalIps) != 0 {
		t.Errorf("answer %v (%v), want a primary IP in %s and nothing else", resp, err, ownPrefix)
	}

	// The IP depends on the pod only: a restarted plugin answers the same.
	again := newTestPlugin(t, false)
	_, runErr := again.RunPodSandbox(ctx, pod)
	if resp, _ := again.PodSandboxStatus(ctx, pod); runErr != nil || resp.Ip != "" || len(resp.AdditionalIps) != 1 || resp.AdditionalIps[0] != ip.String() {
		t.Errorf("additional-IP plugin answered %v (RunPodSandbox: %v), want only additional %s", resp, runErr, ip)
	}

	removeErr := p.RemovePodSandbox(ctx, pod)
	if resp, _ := p.PodSandboxStatus(ctx, pod); removeErr != nil || resp.Ip != "" || len(resp.AdditionalIps) != 0 {
		t.Errorf("answer for a removed pod %v (RemovePodSandbox: %v), want empty", resp, removeErr)
	}
}

func TestAtRunPodSandboxAnswersThereAndIsNeverAskedForStatus(t *testing.T) {
	ctx := context.Background()
	statusEvents, err := newTestPlugin(t, true).Configure(ctx, "", "", "")
	if err != nil || !statusEvents.IsSet(api.Event_POD_SANDBOX_STATUS) {
		t.Errorf("a status plugin subscribes to %s (%v), want PodSandboxStatus among them", statusEvents.PrettyString(), err)
	}
	p := newTestPlugin(t, true)
	p.atRun = true
	events, err := p.Configure(ctx, "", "", "")
	if err != nil || events.IsSet(api.Event_POD_SANDBOX_STATUS) || !events.IsSet(api.Event_RUN_POD_SANDBOX) {
		t.Errorf("it subscribes to %s (%v), want RunPodSandbox and not PodSandboxStatus", events.PrettyString(), err)
	}
	pod := &api.PodSandbox{Id: "pod-1"}
	adjust, err := p.RunPodSandbox(ctx, pod)
	if ips := adjust.GetNetwork().GetIps(); err != nil || len(ips) != 1 || !ownPrefix.Contains(netip.MustParseAddr(ips[0])) {
		t.Fatalf("RunPodSandbox answer %v (%v), want one IP in %s", ips, err, ownPrefix)
	}
	if adjust, err := newTestPlugin(t, true).RunPodSandbox(ctx, pod); adjust != nil || err != nil {
		t.Errorf("a status plugin answered RunPodSandbox with %v (%v), want nothing", adjust, err)
	}
}
