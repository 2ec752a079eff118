package bench

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"
	criruntime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/knext-dev/knext/internal/stack"
)

// instance is a configuration's own harness instance: its pods (and their shims) live all the
// time, its daemon and network plugins run only while it is measured. Instances are separate so
// that none sees another's state, such as knext's last known answers of its plugins (C4).
type instance struct {
	s       settings
	c       configuration
	h       *stack.Stack
	pods    []string // bench-000, bench-001...
	metrics string   // the daemon's metrics URL

	// While running: nri-bridge, or the status plugins.
	bridge  *stack.Process
	plugins []*runningPlugin
}

type runningPlugin struct {
	spec  statusPlugin
	proc  *stack.Process
	ready string // the file it creates once synchronized
}

// withInstances creates an instance of each configuration with pods running pods, its daemon
// stopped, runs fn on them (by configuration), and removes them, also after an error. Every
// instance has the same generated configuration (a CNI network of bridge, host-local, portmap and
// loopback, NRI, a metrics endpoint) but for disable_cni.
func withInstances(ctx context.Context, s settings, configs []configuration, pods int, fn func(map[string]*instance) error) (err error) {
	instances := map[string]*instance{}
	defer func() {
		for _, in := range instances {
			err = errors.Join(err, in.h.Close())
		}
	}()
	for _, c := range configs {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return err
		}
		address := l.Addr().String()
		l.Close()
		opts := stack.Options{Containerd: s.Knext, Logf: log.Printf, CNIPortMappings: true,
			ExtraConfig: fmt.Sprintf("[plugins.'io.containerd.server.v1.metrics']\naddress = %q\n", address)}
		if c.Upstream {
			opts.Containerd = s.Upstream
		}
		if c.CNILess {
			network := "" // the status plugin makes the network ready
			if c.bridged() {
				network = stack.NRIBridgePlugin
			}
			opts.ExtraConfig += stack.CNILessConfig(network)
			opts.SkipNetworkReadyWait = true
		}
		in := &instance{s: s, c: c, metrics: "http://" + address + "/v1/metrics"}
		if in.h, err = stack.New(ctx, opts); err != nil {
			return fmt.Errorf("configuration %s: %w", c.Key, err)
		}
		instances[c.Key] = in
		start := time.Now()
		if err = in.startNetwork(ctx); err == nil { // the long-running pods, four at a time
			in.pods, _, err = in.startPods(ctx, pods, 4, func(i int) string { return fmt.Sprintf("bench-%03d", i) })
		}
		if err = errors.Join(err, in.stop()); err != nil {
			return fmt.Errorf("configuration %s: %w\n%s", c.Key, err, in.h.LogTail(20))
		}
		log.Printf("bench: configuration %s: %d pods after %s", c.Key, pods, time.Since(start).Round(time.Millisecond))
	}
	return fn(instances)
}

// rotated is list rotated left by round: no configuration always follows the same one.
func rotated[T any](list []T, round int) []T {
	k := round % len(list)
	return slices.Concat(list[k:], list[:k])
}

// startNetwork starts nri-bridge or the status plugins on the running daemon and waits until
// they are synchronized (and, CNI-less, the network is ready).
func (in *instance) startNetwork(ctx context.Context) (err error) {
	if in.c.bridged() {
		in.bridge, err = in.h.StartNRIBridge(ctx, in.s.Bridge, in.h.NRIBridgeArgs("-ipv4-subnet", in.h.Subnet.String())...)
		return err
	}
	if err := in.launchPlugins(); err != nil {
		return err
	}
	if err := in.waitSynchronized(ctx); err != nil || !in.c.CNILess {
		return err
	}
	var procs []*stack.Process
	for _, p := range in.plugins {
		procs = append(procs, p.proc)
	}
	return in.h.WaitNetworkReady(ctx, true, stack.NetworkReadyTimeout, procs...)
}

// stop stops the network plugins and the daemon.
func (in *instance) stop() error {
	var errs []error
	if in.bridge != nil {
		errs = append(errs, in.bridge.Stop())
	}
	for _, p := range in.plugins {
		errs = append(errs, p.proc.Stop())
	}
	in.bridge, in.plugins = nil, nil
	return errors.Join(append(errs, in.h.Stop())...)
}

// launchPlugins starts the status plugins without waiting for them.
func (in *instance) launchPlugins() error {
	for _, spec := range in.c.Plugins {
		name := spec.Index + "-" + spec.Name
		p := &runningPlugin{spec: spec, ready: filepath.Join(in.h.Root, name+".ready")}
		if err := os.Remove(p.ready); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
		args := []string{"-nri-socket", in.h.NRISocket, "-name", spec.Name, "-idx", spec.Index, "-prefix", spec.Prefix,
			"-ready-file", p.ready, fmt.Sprintf("-primary=%t", spec.Primary), fmt.Sprintf("-at-run-pod-sandbox=%t", spec.AtRunPodSandbox)}
		var err error
		if p.proc, err = in.h.StartProcess("plugin-"+name, in.s.Plugin, args...); err != nil {
			return err
		}
		in.plugins = append(in.plugins, p)
	}
	return nil
}

// waitSynchronized waits until NRI has synchronized every status plugin with the pods.
func (in *instance) waitSynchronized(ctx context.Context) error {
	for _, p := range in.plugins {
		err := stack.Poll(ctx, 30*time.Second, 20*time.Millisecond, func() error {
			if exited, err := p.proc.Exited(); exited {
				return stack.Permanent(fmt.Errorf("exited (%v)", err))
			}
			_, err := os.Stat(p.ready)
			return err
		})
		if err != nil {
			return fmt.Errorf("plugin %s-%s: %w\n%s", p.spec.Index, p.spec.Name, err, stack.Tail(p.proc.LogPath, 20, nil))
		}
	}
	return nil
}

// timeEach calls fn(0..n-1), width at a time: the seconds of each call, and the first error.
func timeEach(n, width int, fn func(i int) error) ([]float64, error) {
	var g errgroup.Group
	g.SetLimit(width)
	seconds := make([]float64, n)
	for i := range n {
		g.Go(func() error {
			start := time.Now()
			err := fn(i)
			seconds[i] = time.Since(start).Seconds()
			return err
		})
	}
	return seconds, g.Wait()
}

// checkPod checks that pod id is READY with an IP, and with an IP of each running status plugin:
// the measurement really goes through the NRI path.
func (in *instance) checkPod(ctx context.Context, id string) error {
	resp, err := in.h.Runtime.PodSandboxStatus(ctx, &criruntime.PodSandboxStatusRequest{PodSandboxId: id})
	if err != nil {
		return fmt.Errorf("status of pod %s: %w", id, err)
	}
	network := resp.GetStatus().GetNetwork()
	if resp.GetStatus().GetState() != criruntime.PodSandboxState_SANDBOX_READY || network.GetIp() == "" {
		return fmt.Errorf("pod %s is %s with IP %q, want READY with an IP", id, resp.GetStatus().GetState(), network.GetIp())
	}
	ips := []string{network.GetIp()}
	for _, ip := range network.GetAdditionalIps() {
		ips = append(ips, ip.GetIp())
	}
	for _, p := range in.plugins { // its prefix is a /48: "2001:db8:1::" and "2001:db8:1::1:2" share "2001:db8:1:"
		if !slices.ContainsFunc(ips, func(ip string) bool { return strings.HasPrefix(ip, strings.TrimSuffix(p.spec.Prefix, ":")) }) {
			return fmt.Errorf("pod %s shows IPs %v, none of plugin %s-%s", id, ips, p.spec.Index, p.spec.Name)
		}
	}
	return nil
}

func (in *instance) checkPods(ctx context.Context, ids []string) error {
	_, err := timeEach(len(ids), stormWidth, func(i int) error { return in.checkPod(ctx, ids[i]) })
	return err
}

// startPods starts n pods, named by name, width at a time; it returns their IDs and the seconds
// of each RunPodSandbox.
func (in *instance) startPods(ctx context.Context, n, width int, name func(i int) string) ([]string, []float64, error) {
	ids := make([]string, n)
	seconds, err := timeEach(n, width, func(i int) error {
		resp, err := in.h.Runtime.RunPodSandbox(ctx, &criruntime.RunPodSandboxRequest{Config: in.h.PodConfig(name(i))})
		if err != nil {
			return fmt.Errorf("run pod %s: %w", name(i), err)
		}
		ids[i] = resp.PodSandboxId
		return nil
	})
	return ids, seconds, err
}

// load calls call from width workers, each with its own sequence number, for d or until ctx ends:
// the seconds of every successful call; a failed call fails it.
func load(ctx context.Context, width int, d time.Duration, call func(ctx context.Context, i int) error) ([]float64, error) {
	latencies, failures := make([][]float64, width), make([][]error, width)
	var next atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for w := range width {
		wg.Go(func() {
			for ctx.Err() == nil && time.Since(start) < d {
				t := time.Now()
				if err := call(ctx, int(next.Add(1)-1)); err == nil {
					latencies[w] = append(latencies[w], time.Since(t).Seconds())
				} else if ctx.Err() == nil {
					failures[w] = append(failures[w], err)
				}
			}
		})
	}
	wg.Wait()
	seconds, errs, err := slices.Concat(latencies...), slices.Concat(failures...), ctx.Err()
	if len(errs) > 0 {
		err = fmt.Errorf("%d of %d calls failed, first: %w", len(errs), len(errs)+len(seconds), errs[0])
	}
	return seconds, err
}

// statusCall queries the long-running pods' status round robin.
func (in *instance) statusCall(verbose bool) func(context.Context, int) error {
	return func(ctx context.Context, i int) error {
		_, err := in.h.Runtime.PodSandboxStatus(ctx, &criruntime.PodSandboxStatusRequest{PodSandboxId: in.pods[i%len(in.pods)], Verbose: verbose})
		return err
	}
}
