package main

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/containerd/nri/pkg/api"
	"github.com/containerd/nri/pkg/stub"
)

func newTestPlugin(primary bool, delay time.Duration) *plugin {
	return &plugin{primary: primary, delay: delay, prefix: netip.MustParseAddr("2001:db8:7::"), ips: map[string]string{}}
}

func TestAnswersFromMemoryAndCounts(t *testing.T) {
	ctx := context.Background()
	p := newTestPlugin(true, 0)
	pod := &api.PodSandbox{Id: "pod-1"}
	if _, err := p.Synchronize(ctx, []*api.PodSandbox{pod}, nil); err != nil {
		t.Fatal(err)
	}
	resp, err := p.PodSandboxStatus(ctx, pod)
	if err != nil {
		t.Fatal(err)
	}
	ip, err := netip.ParseAddr(resp.Ip)
	if err != nil || !netip.MustParsePrefix("2001:db8:7::/64").Contains(ip) || len(resp.AdditionalIps) != 0 {
		t.Errorf("answer %v, want a primary IP in 2001:db8:7::/64 and nothing else", resp)
	}

	// The IP depends on the pod only: a restarted plugin answers the same.
	again := newTestPlugin(false, 0)
	if err := again.RunPodSandbox(ctx, pod); err != nil {
		t.Fatal(err)
	}
	if resp, _ := again.PodSandboxStatus(ctx, pod); resp.Ip != "" || len(resp.AdditionalIps) != 1 || resp.AdditionalIps[0] != ip.String() {
		t.Errorf("additional-IP plugin answered %v, want only additional %s", resp, ip)
	}

	if err := p.RemovePodSandbox(ctx, pod); err != nil {
		t.Fatal(err)
	}
	if resp, _ := p.PodSandboxStatus(ctx, pod); resp.Ip != "" || len(resp.AdditionalIps) != 0 {
		t.Errorf("answer for a removed pod %v, want empty", resp)
	}
	if stats := p.stats("70-test"); stats.StatusCalls != 2 || stats.Pods != 0 || !stats.Synchronized {
		t.Errorf("stats %+v, want 2 calls, no pod, synchronized", stats)
	}
}

func TestDelayIsSpentAndCancellable(t *testing.T) {
	p := newTestPlugin(true, 30*time.Millisecond)
	pod := &api.PodSandbox{Id: "pod-1"}
	start := time.Now()
	if _, err := p.PodSandboxStatus(context.Background(), pod); err != nil || time.Since(start) < 30*time.Millisecond {
		t.Errorf("answer after %s (%v), want at least 30ms", time.Since(start), err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := p.PodSandboxStatus(ctx, pod); err == nil {
		t.Error("answer for a cancelled request, want its error")
	}
}

func TestRunReporterAnswersAtRunPodSandboxOnly(t *testing.T) {
	p := newTestPlugin(true, 0)
	var handlers any = runReporter{p}
	if _, ok := handlers.(stub.PodSandboxStatusInterface); ok {
		t.Fatal("the RunPodSandbox reporter implements PodSandboxStatus: the stub would subscribe it to status queries")
	}
	pod := &api.PodSandbox{Id: "pod-1"}
	adjust, err := runReporter{p}.RunPodSandbox(context.Background(), pod)
	if err != nil {
		t.Fatal(err)
	}
	ips := adjust.GetNetwork().GetIps()
	if len(ips) != 1 || !netip.MustParsePrefix("2001:db8:7::/64").Contains(netip.MustParseAddr(ips[0])) {
		t.Errorf("RunPodSandbox answer %v, want one IP in 2001:db8:7::/64", ips)
	}
	if resp, _ := p.PodSandboxStatus(context.Background(), pod); resp.Ip != ips[0] {
		t.Errorf("the reporter's state has %q for the pod, want %q", resp.Ip, ips[0])
	}
}
