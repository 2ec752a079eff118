// Command statusplugin is the bench's NRI status plugin. It gives every pod it learns about
// (Synchronize, RunPodSandbox) an IP of its own prefix and answers PodSandboxStatus with it from
// memory; it creates -ready-file once synchronized. With -at-run-pod-sandbox it reports the IP in
// its RunPodSandbox answer instead and does not subscribe to PodSandboxStatus, so that the runtime
// never asks it again (docs/design.md S10).
package main

import (
	"context"
	"encoding/binary"
	"flag"
	"fmt"
	"hash/fnv"
	"log"
	"net/netip"
	"os"
	"os/signal"
	"sync"
	"syscall"

	"github.com/containerd/nri/pkg/api"
	"github.com/containerd/nri/pkg/stub"
)

type plugin struct {
	primary   bool       // answer the pod's primary IP, else an additional IP
	atRun     bool       // report the primary IP in the RunPodSandbox answer, not subscribed to status
	prefix    netip.Addr // a pod's IP is the prefix with a hash of the pod's ID as its last 32 bits
	readyFile string
	ips       sync.Map // pod sandbox ID -> its IP, a string
}

// remember gives pod its IP and returns it. The IP depends on the pod only, so that a restarted
// plugin gives the same answer as before and containerd's last known answer stays valid.
func (p *plugin) remember(pod *api.PodSandbox) string {
	hash := fnv.New32a()
	hash.Write([]byte(pod.Id))
	addr := p.prefix.As16()
	binary.BigEndian.PutUint32(addr[12:], hash.Sum32())
	ip := netip.AddrFrom16(addr).String()
	p.ips.Store(pod.Id, ip)
	return ip
}

// Configure subscribes the plugin to every event it handles but PodSandboxStatus with atRun.
func (p *plugin) Configure(context.Context, string, string, string) (api.EventMask, error) {
	events := api.EventMask(0)
	events.Set(api.Event_RUN_POD_SANDBOX, api.Event_REMOVE_POD_SANDBOX)
	if !p.atRun {
		events.Set(api.Event_POD_SANDBOX_STATUS)
	}
	return events, nil
}

func (p *plugin) Synchronize(_ context.Context, pods []*api.PodSandbox, _ []*api.Container) ([]*api.ContainerUpdate, error) {
	for _, pod := range pods {
		p.remember(pod)
	}
	return nil, os.WriteFile(p.readyFile, nil, 0o644)
}

func (p *plugin) RunPodSandbox(_ context.Context, pod *api.PodSandbox) (*api.PodSandboxAdjustment, error) {
	ip := p.remember(pod)
	if !p.atRun {
		return nil, nil
	}
	return &api.PodSandboxAdjustment{Network: &api.PodSandboxNetwork{Ips: []string{ip}}}, nil
}

func (p *plugin) RemovePodSandbox(_ context.Context, pod *api.PodSandbox) error {
	p.ips.Delete(pod.Id)
	return nil
}

func (p *plugin) PodSandboxStatus(_ context.Context, pod *api.PodSandbox) (*api.PodSandboxStatusResponse, error) {
	ip, ok := p.ips.Load(pod.Id)
	switch {
	case !ok:
		return &api.PodSandboxStatusResponse{}, nil // not our pod
	case p.primary:
		return &api.PodSandboxStatusResponse{Ip: ip.(string)}, nil
	default:
		return &api.PodSandboxStatusResponse{AdditionalIps: []string{ip.(string)}}, nil
	}
}

func main() {
	nriSocket := flag.String("nri-socket", "/var/run/nri/nri.sock", "containerd's NRI socket")
	name := flag.String("name", "bench-status", "plugin name")
	index := flag.String("idx", "50", "plugin index (two digits)")
	prefix := flag.String("prefix", "2001:db8:1::", "IPv6 prefix of the IPs this plugin reports")
	p := &plugin{}
	flag.StringVar(&p.readyFile, "ready-file", "", "file to create once synchronized (required)")
	flag.BoolVar(&p.primary, "primary", false, "report the pod's primary IP instead of an additional one")
	flag.BoolVar(&p.atRun, "at-run-pod-sandbox", false, "report the primary IP in the RunPodSandbox answer, not subscribed to PodSandboxStatus")
	flag.Parse()
	log.SetFlags(0)
	log.SetPrefix(fmt.Sprintf("statusplugin %s-%s: ", *index, *name))
	var err error
	if p.prefix, err = netip.ParseAddr(*prefix); err != nil || !p.prefix.Is6() || p.readyFile == "" {
		log.Fatalf("-prefix %q must be an IPv6 address, -ready-file %q set", *prefix, p.readyFile)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	s, err := stub.New(p, stub.WithSocketPath(*nriSocket), stub.WithPluginName(*name), stub.WithPluginIdx(*index))
	if err == nil {
		if err = s.Run(ctx); ctx.Err() != nil {
			err = nil
		}
	}
	if err != nil {
		log.Fatalf("NRI connection on %s: %v", *nriSocket, err)
	}
}
