// nri-static-ip is a minimal NRI plugin that is a pod's default network: it gives every pod an
// address from 10.99.0.0/24 and reports it to the runtime in its RunPodSandbox answer, once. With
// -status it also answers PodSandboxStatus, for runtimes that ask. It only does the bookkeeping:
// a real plugin would also configure the pod's network namespace.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"net/netip"
	"sync"

	"github.com/containerd/nri/pkg/api"
	"github.com/containerd/nri/pkg/stub"
)

var subnet = netip.MustParsePrefix("10.99.0.0/24")

type plugin struct {
	status bool // answer PodSandboxStatus too

	mu     sync.Mutex            // PodSandboxStatus runs concurrently with everything else
	synced bool                  // the state is rebuilt (Synchronize ran)
	ips    map[string]netip.Addr // pod sandbox ID -> its address
	next   netip.Addr            // where the search for a free address starts
}

// Implementing these interfaces subscribes the plugin to the corresponding events; Configure
// leaves PodSandboxStatus out without -status.
var (
	_ stub.ConfigureInterface        = (*plugin)(nil)
	_ stub.SynchronizeInterface      = (*plugin)(nil)
	_ stub.RunPodAdjustmentInterface = (*plugin)(nil)
	_ stub.StopPodInterface          = (*plugin)(nil)
	_ stub.RemovePodInterface        = (*plugin)(nil)
	_ stub.PodSandboxStatusInterface = (*plugin)(nil)
)

func newPlugin(status bool) *plugin {
	return &plugin{status: status, ips: map[string]netip.Addr{}, next: subnet.Addr().Next().Next()}
}

func (p *plugin) Configure(context.Context, string, string, string) (api.EventMask, error) {
	events := api.EventMask(0)
	events.Set(api.Event_RUN_POD_SANDBOX, api.Event_STOP_POD_SANDBOX, api.Event_REMOVE_POD_SANDBOX)
	if p.status {
		events.Set(api.Event_POD_SANDBOX_STATUS)
	}
	return events, nil
}

// Synchronize rebuilds the state after a restart of the plugin or of the runtime: the runtime
// lists every pod with its IPs, those this plugin reported included (it keeps them with the pod),
// so the addresses of running pods are never handed out again.
func (p *plugin) Synchronize(_ context.Context, pods []*api.PodSandbox, _ []*api.Container) ([]*api.ContainerUpdate, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.ips = map[string]netip.Addr{}
	for _, pod := range pods {
		for _, value := range pod.GetIps() {
			if ip, err := netip.ParseAddr(value); err == nil && subnet.Contains(ip) {
				p.ips[pod.GetId()] = ip
			}
		}
	}
	p.synced = true
	return nil, nil
}

// RunPodSandbox gives the pod a free address and reports it: the runtime reports it as the
// pod's primary IP for the pod's lifetime.
func (p *plugin) RunPodSandbox(_ context.Context, pod *api.PodSandbox) (*api.PodSandboxAdjustment, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	ip, ok := p.ips[pod.GetId()]
	if !ok {
		var err error
		if ip, err = p.free(); err != nil {
			return nil, fmt.Errorf("pod %s/%s: %w", pod.GetNamespace(), pod.GetName(), err)
		}
		p.ips[pod.GetId()] = ip
	}
	return &api.PodSandboxAdjustment{Network: &api.PodSandboxNetwork{Ips: []string{ip.String()}}}, nil
}

// free finds an address no pod has, round-robin: an address comes back last.
func (p *plugin) free() (netip.Addr, error) {
	taken := map[netip.Addr]bool{}
	for _, ip := range p.ips {
		taken[ip] = true
	}
	for range 1 << (32 - subnet.Bits()) {
		ip := p.next
		if p.next = p.next.Next(); !subnet.Contains(p.next) {
			p.next = subnet.Addr().Next().Next()
		}
		if subnet.Contains(ip) && !taken[ip] && ip != netip.MustParseAddr("10.99.0.255") {
			return ip, nil
		}
	}
	return netip.Addr{}, errors.New("no address left in " + subnet.String())
}

// StopPodSandbox releases the pod's address: its network is gone.
func (p *plugin) StopPodSandbox(_ context.Context, pod *api.PodSandbox) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.ips, pod.GetId())
	return nil
}

func (p *plugin) RemovePodSandbox(ctx context.Context, pod *api.PodSandbox) error {
	return p.StopPodSandbox(ctx, pod)
}

// PodSandboxStatus answers from memory: it is on the path of every CRI PodSandboxStatus call.
// Before its state is rebuilt it cannot tell, and fails: its last known answer stands in. An
// empty answer would tell the runtime that the plugin owns no IP of the pod.
func (p *plugin) PodSandboxStatus(_ context.Context, pod *api.PodSandbox) (*api.PodSandboxStatusResponse, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.synced {
		return nil, errors.New("not synchronized yet")
	}
	ip, ok := p.ips[pod.GetId()]
	if !ok {
		return &api.PodSandboxStatusResponse{}, nil
	}
	return &api.PodSandboxStatusResponse{Ip: ip.String()}, nil
}

func main() {
	socket := flag.String("socket", api.DefaultSocketPath, "NRI socket to connect to")
	status := flag.Bool("status", false, "answer PodSandboxStatus too")
	flag.Parse()

	s, err := stub.New(newPlugin(*status), stub.WithPluginName("static-ip"), stub.WithPluginIdx("50"),
		stub.WithSocketPath(*socket))
	if err != nil {
		log.Fatalf("failed to create the plugin stub: %v", err)
	}
	if err := s.Run(context.Background()); err != nil {
		log.Fatalf("plugin exited: %v", err)
	}
}
