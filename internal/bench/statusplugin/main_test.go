package main

import (
	"context"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/containerd/nri/pkg/api"
	"github.com/containerd/nri/pkg/stub"
)

func newTestPlugin(t *testing.T, primary bool, delay time.Duration) *plugin {
	return &plugin{primary: primary, delay: delay, prefix: netip.MustParseAddr("2001:db8:7::"), readyFile: filepath.Join(t.TempDir(), "ready")}
}

var ownPrefix = netip.MustParsePrefix("2001:db8:7::/64")

func TestAnswersFromMemoryOnceSynchronized(t *testing.T) {
	ctx := context.Background()
	p := newTestPlugin(t, true, 0)
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
	again := newTestPlugin(t, false, 0)
	runErr := again.RunPodSandbox(ctx, pod)
	if resp, _ := again.PodSandboxStatus(ctx, pod); runErr != nil || resp.Ip != "" || len(resp.AdditionalIps) != 1 || resp.AdditionalIps[0] != ip.String() {
		t.Errorf("additional-IP plugin answered %v (RunPodSandbox: %v), want only additional %s", resp, runErr, ip)
	}

	removeErr := p.RemovePodSandbox(ctx, pod)
	if resp, _ := p.PodSandboxStatus(ctx, pod); removeErr != nil || resp.Ip != "" || len(resp.AdditionalIps) != 0 {
		t.Errorf("answer for a removed pod %v (RemovePodSandbox: %v), want empty", resp, removeErr)
	}
}

func TestDelayIsCancellable(t *testing.T) {
	p := newTestPlugin(t, true, time.Hour)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := p.PodSandboxStatus(ctx, &api.PodSandbox{Id: "pod-1"}); err == nil {
		t.Error("answer for a cancelled request, want its error")
	}
}

func TestRunReporterAnswersAtRunPodSandboxOnly(t *testing.T) {
	p := newTestPlugin(t, true, 0)
	var handlers any = runReporter{p}
	if _, ok := handlers.(stub.PodSandboxStatusInterface); ok {
		t.Fatal("the RunPodSandbox reporter implements PodSandboxStatus: the stub would subscribe it to status queries")
	}
	pod := &api.PodSandbox{Id: "pod-1"}
	adjust, err := runReporter{p}.RunPodSandbox(context.Background(), pod)
	if ips := adjust.GetNetwork().GetIps(); err != nil || len(ips) != 1 || !ownPrefix.Contains(netip.MustParseAddr(ips[0])) {
		t.Fatalf("RunPodSandbox answer %v (%v), want one IP in %s", ips, err, ownPrefix)
	}
	ip := adjust.GetNetwork().GetIps()[0]
	if resp, _ := p.PodSandboxStatus(context.Background(), pod); resp.Ip != ip {
		t.Errorf("the reporter's state has %q for the pod, want %q", resp.Ip, ip)
	}
}
