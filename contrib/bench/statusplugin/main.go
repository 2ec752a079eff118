// Command statusplugin is the benchmark's NRI status plugin. It gives every pod it learns about
// (Synchronize, RunPodSandbox) an IP of its own prefix, answers PodSandboxStatus with it from
// memory, optionally after a fixed delay, and serves its call count (package pluginstats) and,
// with -ping-socket, a no-op ttrpc service (package ping): the bare round trip to this process.
// With -at-run-pod-sandbox it reports the IP in its RunPodSandbox answer instead and is not
// subscribed to PodSandboxStatus at all, so that the runtime never asks it again.
package main

import (
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"hash/fnv"
	"net"
	"net/netip"
	"os"
	"os/signal"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/containerd/nri/pkg/api"
	"github.com/containerd/nri/pkg/stub"

	"github.com/knext-dev/knext/contrib/bench/ping"
	"github.com/knext-dev/knext/contrib/bench/pluginstats"
)

type plugin struct {
	primary bool          // answer the pod's primary IP, else an additional IP
	delay   time.Duration // spent before each answer
	prefix  netip.Addr    // a pod's IP is the prefix with a hash of the pod's ID as its last 32 bits

	mu           sync.Mutex
	ips          map[string]string // pod sandbox ID -> its IP
	synchronized bool

	statusCalls atomic.Int64
}

// remember gives pods their IPs. An IP depends on the pod only, so that a restarted plugin gives
// the same answer as before and containerd's last known answer stays valid.
func (p *plugin) remember(pods ...*api.PodSandbox) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, pod := range pods {
		hash := fnv.New32a()
		hash.Write([]byte(pod.Id))
		addr := p.prefix.As16()
		binary.BigEndian.PutUint32(addr[12:], hash.Sum32())
		p.ips[pod.Id] = netip.AddrFrom16(addr).String()
	}
}

func (p *plugin) Synchronize(_ context.Context, pods []*api.PodSandbox, _ []*api.Container) ([]*api.ContainerUpdate, error) {
	p.remember(pods...)
	p.mu.Lock()
	p.synchronized = true
	p.mu.Unlock()
	return nil, nil
}

func (p *plugin) RunPodSandbox(_ context.Context, pod *api.PodSandbox) error {
	p.remember(pod)
	return nil
}

func (p *plugin) RemovePodSandbox(_ context.Context, pod *api.PodSandbox) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.ips, pod.Id)
	return nil
}

func (p *plugin) PodSandboxStatus(ctx context.Context, pod *api.PodSandbox) (*api.PodSandboxStatusResponse, error) {
	p.statusCalls.Add(1)
	if p.delay > 0 {
		select {
		case <-time.After(p.delay):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	p.mu.Lock()
	ip, ok := p.ips[pod.Id]
	p.mu.Unlock()
	switch {
	case !ok:
		return &api.PodSandboxStatusResponse{}, nil // not our pod
	case p.primary:
		return &api.PodSandboxStatusResponse{Ip: ip}, nil
	default:
		return &api.PodSandboxStatusResponse{AdditionalIps: []string{ip}}, nil
	}
}

// runReporter reports a pod's IP, as its primary IP, in its RunPodSandbox answer. It has no
// PodSandboxStatus method (the plugin is a field, not embedded), so the stub does not subscribe it
// to status queries.
type runReporter struct{ p *plugin }

func (r runReporter) Synchronize(ctx context.Context, pods []*api.PodSandbox, containers []*api.Container) ([]*api.ContainerUpdate, error) {
	return r.p.Synchronize(ctx, pods, containers)
}

func (r runReporter) RunPodSandbox(_ context.Context, pod *api.PodSandbox) (*api.PodSandboxAdjustment, error) {
	r.p.remember(pod)
	r.p.mu.Lock()
	ip := r.p.ips[pod.Id]
	r.p.mu.Unlock()
	return &api.PodSandboxAdjustment{Network: &api.PodSandboxNetwork{Ips: []string{ip}}}, nil
}

func (r runReporter) RemovePodSandbox(ctx context.Context, pod *api.PodSandbox) error {
	return r.p.RemovePodSandbox(ctx, pod)
}

func (p *plugin) stats(name string) pluginstats.Stats {
	p.mu.Lock()
	defer p.mu.Unlock()
	return pluginstats.Stats{Plugin: name, Synchronized: p.synchronized, Pods: len(p.ips), StatusCalls: p.statusCalls.Load()}
}

func main() {
	var (
		nriSocket   = flag.String("nri-socket", "/var/run/nri/nri.sock", "containerd's NRI socket")
		name        = flag.String("name", "bench-status", "plugin name")
		index       = flag.String("idx", "50", "plugin index (two digits)")
		statsSocket = flag.String("stats-socket", "", "unix socket to serve the call count on (required)")
		prefix      = flag.String("prefix", "2001:db8:1::", "IPv6 prefix of the IPs this plugin reports")
		primary     = flag.Bool("primary", false, "report the pod's primary IP instead of an additional one")
		delay       = flag.Duration("delay", 0, "time spent on each PodSandboxStatus answer")
		pingSocket  = flag.String("ping-socket", "", "unix socket to serve the no-op ttrpc ping service on (optional)")
		muxSocket   = flag.String("multiplexed-ping-socket", "", "unix socket to serve the ping service on over NRI's multiplexer (optional)")
		atRun       = flag.Bool("at-run-pod-sandbox", false, "report the pod's primary IP in the RunPodSandbox answer, not subscribed to PodSandboxStatus")
	)
	flag.Parse()
	if err := run(*nriSocket, *name, *index, *statsSocket, *pingSocket, *muxSocket, *prefix, *primary, *atRun, *delay); err != nil {
		fmt.Fprintf(os.Stderr, "statusplugin %s-%s: %v\n", *index, *name, err)
		os.Exit(1)
	}
}

func run(nriSocket, name, index, statsSocket, pingSocket, muxSocket, prefix string, primary, atRun bool, delay time.Duration) error {
	base, err := netip.ParseAddr(prefix)
	if err != nil || !base.Is6() {
		return fmt.Errorf("-prefix %q: want an IPv6 address", prefix)
	}
	if statsSocket == "" {
		return errors.New("-stats-socket is required")
	}
	p := &plugin{primary: primary, delay: delay, prefix: base, ips: map[string]string{}}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	os.Remove(statsSocket)
	l, err := net.Listen("unix", statsSocket)
	if err != nil {
		return err
	}
	defer l.Close()
	fullName := index + "-" + name
	go func() {
		if err := pluginstats.Serve(l, func() pluginstats.Stats { return p.stats(fullName) }); err != nil {
			fmt.Fprintf(os.Stderr, "statusplugin %s: stats socket %s: %v\n", fullName, statsSocket, err)
		}
	}()

	for _, service := range []struct {
		socket string
		serve  func(context.Context, net.Listener) error
	}{{pingSocket, ping.Serve}, {muxSocket, ping.ServeMultiplexed}} {
		if service.socket == "" {
			continue
		}
		os.Remove(service.socket)
		pl, err := net.Listen("unix", service.socket)
		if err != nil {
			return err
		}
		go func() {
			if err := service.serve(ctx, pl); err != nil {
				fmt.Fprintf(os.Stderr, "statusplugin %s: ping socket %s: %v\n", fullName, service.socket, err)
			}
		}()
	}

	var handlers any = p
	if atRun {
		handlers = runReporter{p}
	}
	s, err := stub.New(handlers, stub.WithSocketPath(nriSocket), stub.WithPluginName(name), stub.WithPluginIdx(index))
	if err != nil {
		return err
	}
	if err := s.Run(ctx); err != nil && ctx.Err() == nil {
		return fmt.Errorf("NRI connection on %s: %w", nriSocket, err)
	}
	return nil
}
