package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"math"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	criruntime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/knext-dev/knext/contrib/bench/ping"
	"github.com/knext-dev/knext/contrib/bench/pluginstats"
	"github.com/knext-dev/knext/internal/harness"
	"github.com/knext-dev/knext/internal/harness/testimages"
)

// stormWidth is the concurrency of the status storm and of query bursts.
const stormWidth = 16

// warmUp is the untimed status load before a configuration's measurements.
const warmUp = 500 * time.Millisecond

// variants are the PodSandboxStatus measurements of every configuration.
var variants = []variant{{1, false}, {stormWidth, false}, {1, true}, {stormWidth, true}}

type variant struct {
	Concurrency int  `json:"concurrency"`
	Verbose     bool `json:"verbose"`
}

func (v variant) String() string {
	if v.Verbose {
		return fmt.Sprintf("c%d verbose", v.Concurrency)
	}
	return fmt.Sprintf("c%d", v.Concurrency)
}

// instance is a configuration's own harness instance: its daemon runs only while the
// configuration is measured, its pods (and their shims) all the time. Instances are separate so
// that no configuration sees another's state, such as the last known answers knext keeps of
// plugins that are no longer connected (C4).
type instance struct {
	s          settings
	c          configuration
	h          *harness.Harness
	pods       []string // IDs of the long-running pods
	podConfigs []*criruntime.PodSandboxConfig
	// debugSocket serves the daemon's pprof handlers when profiles are wanted (-profile).
	debugSocket string
	// metricsAddress is the daemon's metrics endpoint (host:port), where its NRI plugin and CNI
	// latencies are.
	metricsAddress string
	cni            *cniBinDir // nil for CNI-less configurations
	// quietWaits are the waits for a quiet machine of the current run (settle).
	quietWaits []QuietWait
}

// newInstance starts configuration c's instance on its daemon binary, runs pods pods, and stops
// the daemon. Every instance has the same generated configuration (with the CNI network of
// bridge, host-local, portmap and loopback, a metrics endpoint, NRI enabled), except that a
// CNI-less one has disable_cni and nri-bridge. It returns the instance also on error, for the
// caller to close.
func newInstance(ctx context.Context, s settings, c configuration, pods int) (*instance, error) {
	binary := s.Knext
	if c.Upstream {
		binary = s.Upstream
	}
	in := &instance{s: s, c: c}
	var err error
	if in.metricsAddress, err = freeLoopbackAddress(); err != nil {
		return nil, err
	}
	opts := harness.Options{Containerd: binary, LogLevel: s.LogLevel, NRIRequestTimeout: s.NRITimeout, Logf: log.Printf,
		CNIPortMappings: true, CNIBinDir: s.CNIBinDir,
		ExtraConfig: fmt.Sprintf("[plugins.'io.containerd.server.v1.metrics']\naddress = %q\n", in.metricsAddress)}
	if c.CNILess {
		// The status plugins of a configuration without nri-bridge make the network ready together.
		networkPlugin := ""
		if c.bridged() {
			networkPlugin = harness.NRIBridgePlugin
		}
		opts.ExtraConfig += harness.CNILessConfig(networkPlugin)
		opts.SkipNetworkReadyWait = true
	} else {
		if in.cni, err = newCNIBinDir(s.CNIBinDir, s.CNITrace); err != nil {
			return nil, err
		}
		opts.CNIBinDir = in.cni.dir
	}
	if s.Profile != "" {
		// The debug socket's path goes into the configuration, so the root is chosen here.
		root, err := os.MkdirTemp("", "knx-")
		if err != nil {
			return in, err
		}
		in.debugSocket = filepath.Join(root, "debug.sock")
		opts.Root = root
		opts.ExtraConfig += fmt.Sprintf("[plugins.'io.containerd.server.v1.debug']\naddress = %q\n", in.debugSocket)
	}
	if in.h, err = harness.New(ctx, opts); err != nil {
		if opts.Root != "" {
			os.Remove(opts.Root)
		}
		return in, fmt.Errorf("configuration %s: %w", c.Key, err)
	}
	start := time.Now()
	if c.podsNeedPlugins() { // the pod network, or the plugins reporting at RunPodSandbox
		err = in.withNetworkPlugins(ctx, func([]*runningPlugin) error { return in.createPods(ctx, pods) })
	} else {
		err = in.createPods(ctx, pods)
	}
	if err != nil {
		return in, fmt.Errorf("configuration %s: %w\n%s", c.Key, err, in.h.LogTail(20))
	}
	log.Printf("bench: configuration %s: %d pods running after %s", c.Key, len(in.pods), time.Since(start).Round(time.Millisecond))
	return in, in.h.Stop()
}

// close removes the instance: its harness (pods, daemon, everything else) and its CNI bin dir.
func (in *instance) close() error {
	var errs []error
	if in.h != nil {
		errs = append(errs, in.h.Close())
	}
	if in.cni != nil {
		errs = append(errs, in.cni.remove())
	}
	return errors.Join(errs...)
}

// freeLoopbackAddress returns a loopback address with a port that is free now.
func freeLoopbackAddress() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// createPods starts the long-running pods, four at a time.
func (in *instance) createPods(ctx context.Context, n int) error {
	in.pods = make([]string, n)
	in.podConfigs = make([]*criruntime.PodSandboxConfig, n)
	return forEach(n, 4, func(i int) error {
		config := in.h.PodConfig(fmt.Sprintf("bench-%03d", i))
		resp, err := in.h.Runtime.RunPodSandbox(ctx, &criruntime.RunPodSandboxRequest{Config: config})
		if err != nil {
			return fmt.Errorf("run pod %s: %w", config.Metadata.Name, err)
		}
		in.pods[i], in.podConfigs[i] = resp.PodSandboxId, config
		return nil
	})
}

// forEach calls fn(0..n-1) from width goroutines; a goroutine stops at its first error.
func forEach(n, width int, fn func(i int) error) error {
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make([]error, width)
	for w := range errs {
		wg.Go(func() {
			for i := int(next.Add(1) - 1); i < n && errs[w] == nil; i = int(next.Add(1) - 1) {
				errs[w] = fn(i)
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// run starts the instance's daemon (and nri-bridge or the status plugins), measures what the
// selected benchmarks measure of the configuration, and stops them.
func (in *instance) run(ctx context.Context, round int) (_ *Run, err error) {
	log.Printf("bench: round %d, configuration %s: %s", round, in.c.Key, in.c.Description)
	run := &Run{Config: in.c.Key, Round: round, Load: loadAverage()}
	in.quietWaits = nil
	defer func() { run.QuietWaits = in.quietWaits }()
	start := time.Now()
	if err := in.h.Start(ctx); err != nil {
		return nil, err
	}
	run.StartSeconds = time.Since(start).Seconds()
	defer func() {
		if err != nil {
			err = fmt.Errorf("%w\n%s", err, in.h.LogTail(20))
		}
		err = errors.Join(err, in.h.Stop())
	}()
	if in.s.Selected.Status && in.c.Status {
		if err := in.runStatus(ctx, round, run); err != nil {
			return nil, err
		}
	}
	if in.s.Selected.Lifecycle && in.c.Lifecycle {
		if err := in.withNetworkPlugins(ctx, func([]*runningPlugin) error { return in.runLifecycle(ctx, round, run) }); err != nil {
			return nil, err
		}
	}
	return run, nil
}

// runLifecycle measures pod starts and removals at every concurrency, and the CNI plugins'
// share in a traced pass.
func (in *instance) runLifecycle(ctx context.Context, round int, run *Run) (err error) {
	for _, width := range lifecycleWidths {
		sample, err := in.measureLifecycle(ctx, width, round)
		if err != nil {
			return fmt.Errorf("lifecycle at concurrency %d: %w", width, err)
		}
		run.Lifecycle = append(run.Lifecycle, sample)
	}
	if in.cni != nil && in.s.CNITrace != "" && in.s.CNITracePods > 0 {
		if run.CNI, err = in.measureCNITrace(ctx, round); err != nil {
			return fmt.Errorf("CNI trace: %w", err)
		}
	}
	return nil
}

// runStatus measures PodSandboxStatus with the configuration's status plugins, and the
// raw round trip to the plugin.
func (in *instance) runStatus(ctx context.Context, round int, run *Run) (err error) {
	plugins, err := in.startPlugins(ctx)
	defer func() {
		for _, p := range plugins {
			if stopErr := p.proc.Stop(); stopErr != nil {
				err = errors.Join(err, fmt.Errorf("stop plugin %s-%s: %w", p.spec.Index, p.spec.Name, stopErr))
			}
		}
	}()
	if err != nil {
		return err
	}
	if err := in.checkPods(ctx, plugins); err != nil {
		return err
	}
	if err := in.warmUpStatus(ctx); err != nil {
		return err
	}
	for _, v := range variants {
		sample, err := in.measureStatus(ctx, v, round, plugins)
		if err != nil {
			return err
		}
		run.Status = append(run.Status, sample)
		if in.c.Ping && !v.Verbose {
			// Right after the status measurement at the same concurrency, to the same process:
			// plain (the floor), over NRI's multiplexer (the transport's share) and, at c1, with
			// the plugin left idle before each call about as long as between (knext-1-plugin)'s queries.
			for _, rt := range roundTrips {
				var gap time.Duration
				if rt.idle {
					if gap = idleGap(sample, run.Ping); gap <= 0 {
						continue
					}
				}
				ping, err := in.measurePing(ctx, plugins[0], v.Concurrency, rt, gap)
				if err != nil {
					return err
				}
				run.Ping = append(run.Ping, ping)
			}
		}
	}
	if len(plugins) > 0 {
		if run.Bursts, err = in.measureBursts(ctx, plugins); err != nil {
			return err
		}
		if run.Events, err = in.measureContainerEvents(ctx, plugins, fmt.Sprintf("events-%d", round)); err != nil {
			return err
		}
	}
	if in.c.Storm {
		if run.Storm, err = in.measureStorm(ctx, fmt.Sprintf("storm-%d", round)); err != nil {
			return err
		}
	}
	return nil
}

// idleGap is about how long the plugin idles between the queries of status measurement s at c1:
// s's p50 less the p50 of the plain round trip measured after it (among pings). It is 0 at other
// concurrencies, with verbose on, or before that round trip is measured.
func idleGap(s StatusSample, pings []PingSample) time.Duration {
	if s.Concurrency != 1 || s.Verbose {
		return 0
	}
	for _, p := range pings {
		if p.Concurrency == 1 && p.is(roundTrip{}) && p.Calls > 0 && p.P50Ms < s.P50Ms {
			return time.Duration((s.P50Ms - p.P50Ms) * float64(time.Millisecond))
		}
	}
	return 0
}

// warmUpStatus runs untimed status load: the first calls after a start pay for cold caches and
// connection setup.
func (in *instance) warmUpStatus(ctx context.Context) error {
	if load := in.runStatusLoad(ctx, stormWidth, false, time.Now().Add(warmUp)); load.errors.Load() > 0 {
		return fmt.Errorf("(%s) warm-up: %d PodSandboxStatus errors, first: %s", in.c.Key, load.errors.Load(), load.errorText())
	}
	return nil
}

// measurePing makes no-op ttrpc calls of kind rt to the status plugin p from width workers over
// one connection for the configured duration: the bare round trip to the process that answers
// containerd's status calls. For a round trip after an idle gap each worker busy-waits gap
// (untimed) before each call: the plugin idles, the caller stays running as containerd does.
func (in *instance) measurePing(ctx context.Context, p *runningPlugin, width int, rt roundTrip, gap time.Duration) (PingSample, error) {
	socket := p.ping
	if rt.multiplexed {
		socket = p.multiplexedPing
	}
	client, err := ping.Dial(ctx, socket, rt.multiplexed)
	if err != nil {
		return PingSample{}, err
	}
	defer client.Close()
	for range 100 { // untimed: a new connection, cold paths
		if err := client.Ping(ctx); err != nil {
			return PingSample{}, err
		}
	}
	if err := in.settle(ctx, fmt.Sprintf("%s round trip c%d", rt, width)); err != nil {
		return PingSample{}, err
	}
	pluginPIDs := []int{p.proc.PID()}
	cpuBefore, err := readCPU(0, pluginPIDs)
	if err != nil {
		return PingSample{}, err
	}
	latencies := make([][]time.Duration, width)
	errs := make([]error, width)
	deadline := time.Now().Add(in.s.Duration)
	var wg sync.WaitGroup
	for w := range width {
		wg.Go(func() {
			for errs[w] == nil && time.Now().Before(deadline) {
				for idle := time.Now(); time.Since(idle) < gap; {
				}
				start := time.Now()
				if errs[w] = client.Ping(ctx); errs[w] == nil {
					latencies[w] = append(latencies[w], time.Since(start))
				}
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return PingSample{}, err
	}
	cpuAfter, err := readCPU(0, pluginPIDs)
	if err != nil {
		return PingSample{}, err
	}
	all := slices.Concat(latencies...)
	sample := PingSample{Concurrency: width, Multiplexed: rt.multiplexed, IdleGapMs: float64(gap) / float64(time.Millisecond),
		Calls: len(all), P50Ms: percentileMs(all, 0.5), P99Ms: percentileMs(all, 0.99), CPU: cpuBefore.perCall(cpuAfter, len(all))}
	log.Printf("bench:   %s round trip to plugin %s-%s, c%d (idle gap %.3f ms): %d calls, p50 %.3f ms, p99 %.3f ms, CPU/call µs: plugin %.0f, client %.0f",
		rt, p.spec.Index, p.spec.Name, width, sample.IdleGapMs, sample.Calls, sample.P50Ms, sample.P99Ms, sample.CPU.Plugins, sample.CPU.Client)
	return sample, nil
}

// runningPlugin is a status plugin process of the current configuration.
type runningPlugin struct {
	spec  statusPlugin
	proc  *harness.Process
	stats string // its stats socket
	ping  string // its ping socket
	// multiplexedPing is its ping socket over NRI's multiplexer.
	multiplexedPing string
	prefix          netip.Prefix
}

// startPlugins starts the configuration's status plugins and waits until NRI has synchronized
// each of them with every pod. It returns the plugins it started, also on error.
func (in *instance) startPlugins(ctx context.Context) ([]*runningPlugin, error) {
	plugins, err := in.launchPlugins()
	if err != nil {
		return plugins, err
	}
	for _, p := range plugins {
		if err := in.waitSynchronized(ctx, p); err != nil {
			return plugins, err
		}
	}
	return plugins, nil
}

// launchPlugins starts the configuration's status plugins without waiting for them. It returns
// the plugins it started, also on error.
func (in *instance) launchPlugins() ([]*runningPlugin, error) {
	var plugins []*runningPlugin
	for _, spec := range in.c.Plugins {
		name := spec.Index + "-" + spec.Name
		p := &runningPlugin{spec: spec, stats: filepath.Join(in.h.Root, name+".stats"), ping: filepath.Join(in.h.Root, name+".ping"),
			multiplexedPing: filepath.Join(in.h.Root, name+".mping")}
		addr, err := netip.ParseAddr(spec.Prefix)
		if err != nil {
			return plugins, err
		}
		p.prefix = netip.PrefixFrom(addr, 48)
		args := []string{"-nri-socket", in.h.NRISocket, "-name", spec.Name, "-idx", spec.Index,
			"-stats-socket", p.stats, "-ping-socket", p.ping, "-multiplexed-ping-socket", p.multiplexedPing,
			"-prefix", spec.Prefix, "-delay", spec.Delay.String()}
		if spec.Primary {
			args = append(args, "-primary")
		}
		if spec.AtRunPodSandbox {
			args = append(args, "-at-run-pod-sandbox")
		}
		if p.proc, err = in.h.StartProcess("plugin-"+name, in.s.Plugin, args...); err != nil {
			return plugins, err
		}
		plugins = append(plugins, p)
	}
	return plugins, nil
}

func (in *instance) waitSynchronized(ctx context.Context, p *runningPlugin) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		if exited, err := p.proc.Exited(); exited {
			return fmt.Errorf("plugin %s-%s exited (%v):\n%s", p.spec.Index, p.spec.Name, err, harness.Tail(p.proc.LogPath, 20, nil))
		}
		stats, err := pluginstats.Fetch(ctx, p.stats)
		if err == nil && stats.Synchronized && stats.Pods >= len(in.pods) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("plugin %s-%s not synchronized with %d pods after 30 s (stats %+v, %v):\n%s",
				p.spec.Index, p.spec.Name, len(in.pods), stats, err, harness.Tail(p.proc.LogPath, 20, nil))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// checkPods queries every pod once, verbose and not, stormWidth at a time: each must be READY with
// an IP, and show an IP of each status plugin (so the measurement really goes through the NRI
// path). It also warms the daemon up after its start.
func (in *instance) checkPods(ctx context.Context, plugins []*runningPlugin) error {
	return forEach(2*len(in.pods), stormWidth, func(i int) error {
		return in.checkPod(ctx, in.pods[i/2], i%2 == 1, plugins)
	})
}

func (in *instance) checkPod(ctx context.Context, id string, verbose bool, plugins []*runningPlugin) error {
	resp, err := in.h.Runtime.PodSandboxStatus(ctx, &criruntime.PodSandboxStatusRequest{PodSandboxId: id, Verbose: verbose})
	if err != nil {
		return fmt.Errorf("status of pod %s: %w", id, err)
	}
	status := resp.GetStatus()
	network := status.GetNetwork()
	if status.GetState() != criruntime.PodSandboxState_SANDBOX_READY || network.GetIp() == "" {
		return fmt.Errorf("pod %s is %s with IP %q, want READY with an IP", id, status.GetState(), network.GetIp())
	}
	ips := []string{network.GetIp()}
	for _, additional := range network.GetAdditionalIps() {
		ips = append(ips, additional.GetIp())
	}
	for _, p := range plugins {
		if !slices.ContainsFunc(ips, func(ip string) bool {
			addr, err := netip.ParseAddr(ip)
			return err == nil && p.prefix.Contains(addr)
		}) {
			return fmt.Errorf("pod %s shows IPs %v, none of plugin %s-%s (%s): does this containerd ask NRI in PodSandboxStatus?",
				id, ips, p.spec.Index, p.spec.Name, p.prefix)
		}
	}
	return nil
}

// statusCalls returns the PodSandboxStatus calls the plugins have received so far, in total.
func statusCalls(ctx context.Context, plugins []*runningPlugin) (int64, error) {
	var total int64
	for _, p := range plugins {
		stats, err := pluginstats.Fetch(ctx, p.stats)
		if err != nil {
			return 0, fmt.Errorf("plugin %s-%s: %w", p.spec.Index, p.spec.Name, err)
		}
		total += stats.StatusCalls
	}
	return total, nil
}

// statusLoad is what runStatusLoad measured.
type statusLoad struct {
	latencies  [][]time.Duration // per worker
	errors     atomic.Int64
	firstError atomic.Value // string
}

// runStatusLoad runs PodSandboxStatus on the pods, round robin, from width workers until ctx ends
// or deadline passes (zero: none), recording each call's latency.
func (in *instance) runStatusLoad(ctx context.Context, width int, verbose bool, deadline time.Time) *statusLoad {
	load := &statusLoad{latencies: make([][]time.Duration, width)}
	var next atomic.Uint64
	var wg sync.WaitGroup
	for w := range width {
		wg.Go(func() {
			for ctx.Err() == nil && (deadline.IsZero() || time.Now().Before(deadline)) {
				id := in.pods[(next.Add(1)-1)%uint64(len(in.pods))]
				start := time.Now()
				_, err := in.h.Runtime.PodSandboxStatus(ctx, &criruntime.PodSandboxStatusRequest{PodSandboxId: id, Verbose: verbose})
				if err != nil {
					if ctx.Err() == nil {
						load.errors.Add(1)
						load.firstError.CompareAndSwap(nil, fmt.Sprintf("pod %s: %v", id, err))
					}
					continue
				}
				load.latencies[w] = append(load.latencies[w], time.Since(start))
			}
		})
	}
	wg.Wait()
	return load
}

func (l *statusLoad) all() []time.Duration {
	var all []time.Duration
	for _, worker := range l.latencies {
		all = append(all, worker...)
	}
	return all
}

func (l *statusLoad) errorText() string {
	if s, ok := l.firstError.Load().(string); ok {
		return s
	}
	return ""
}

// measureStatus runs variant v for the configured duration (and captures the daemon's CPU profile
// meanwhile, with -profile).
func (in *instance) measureStatus(ctx context.Context, v variant, round int, plugins []*runningPlugin) (StatusSample, error) {
	if err := in.settle(ctx, "status "+v.String()); err != nil {
		return StatusSample{}, err
	}
	before, err := statusCalls(ctx, plugins)
	if err != nil {
		return StatusSample{}, err
	}
	pluginPIDs := make([]int, len(plugins))
	for i, p := range plugins {
		pluginPIDs[i] = p.proc.PID()
	}
	cpuBefore, err := readCPU(in.h.PID(), pluginPIDs)
	if err != nil {
		return StatusSample{}, err
	}
	var profileDone chan error
	if in.debugSocket != "" {
		profileDone = make(chan error, 1)
		name := fmt.Sprintf("%s-round%d-%s.pprof", in.c.Key, round, strings.ReplaceAll(v.String(), " ", "-"))
		seconds := max(1, int(in.s.Duration.Round(time.Second).Seconds()))
		go func() { profileDone <- in.profile(ctx, filepath.Join(in.s.Profile, name), seconds) }()
	}
	start := time.Now()
	load := in.runStatusLoad(ctx, v.Concurrency, v.Verbose, start.Add(in.s.Duration))
	elapsed := time.Since(start)
	cpuAfter, err := readCPU(in.h.PID(), pluginPIDs)
	if err != nil {
		return StatusSample{}, err
	}
	if profileDone != nil {
		if err := <-profileDone; err != nil {
			return StatusSample{}, err
		}
	}
	if err := ctx.Err(); err != nil {
		return StatusSample{}, err
	}
	after, err := statusCalls(ctx, plugins)
	if err != nil {
		return StatusSample{}, err
	}
	latencies := load.all()
	sample := StatusSample{variant: v, Calls: len(latencies), Errors: int(load.errors.Load()), FirstError: load.errorText(),
		Seconds: elapsed.Seconds(), PerSecond: float64(len(latencies)) / elapsed.Seconds(),
		P50Ms: percentileMs(latencies, 0.50), P99Ms: percentileMs(latencies, 0.99), PluginCalls: after - before,
		CPU: cpuBefore.perCall(cpuAfter, len(latencies))}
	if sample.Calls > 0 {
		sample.PluginCallsPerStatus = float64(sample.PluginCalls) / float64(sample.Calls)
	}
	log.Printf("bench:   %-11s %6d calls %8.0f/s  p50 %7.3f ms  p99 %7.3f ms  plugin calls/status %.2f  errors %d  CPU/call µs: daemon %.0f, plugins %.0f, client %.0f",
		v, sample.Calls, sample.PerSecond, sample.P50Ms, sample.P99Ms, sample.PluginCallsPerStatus, sample.Errors,
		sample.CPU.Daemon, sample.CPU.Plugins, sample.CPU.Client)
	return sample, nil
}

// profile writes the daemon's CPU profile over the next seconds to path.
func (in *instance) profile(ctx context.Context, path string, seconds int) error {
	client := &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", in.debugSocket)
		},
	}}
	defer client.CloseIdleConnections()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("http://containerd/debug/pprof/profile?seconds=%d", seconds), nil)
	if err != nil {
		return err
	}
	resp, err := client.Do(req)
	if err != nil {
		return fmt.Errorf("CPU profile from %s: %w", in.debugSocket, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("CPU profile from %s: %s", in.debugSocket, resp.Status)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	out, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, resp.Body); err != nil {
		out.Close()
		return fmt.Errorf("CPU profile from %s: %w", in.debugSocket, err)
	}
	return out.Close()
}

// measureBursts sends bursts of stormWidth simultaneous queries for one pod and counts the plugin
// calls they cause (C7: concurrent queries for one sandbox share one round trip).
func (in *instance) measureBursts(ctx context.Context, plugins []*runningPlugin) (*BurstSample, error) {
	before, err := statusCalls(ctx, plugins)
	if err != nil {
		return nil, err
	}
	id := in.pods[0]
	var failed atomic.Int64
	for range in.s.Bursts {
		gate := make(chan struct{})
		var wg sync.WaitGroup
		for range stormWidth {
			wg.Go(func() {
				<-gate
				if _, err := in.h.Runtime.PodSandboxStatus(ctx, &criruntime.PodSandboxStatusRequest{PodSandboxId: id}); err != nil {
					failed.Add(1)
				}
			})
		}
		close(gate)
		wg.Wait()
	}
	after, err := statusCalls(ctx, plugins)
	if err != nil {
		return nil, err
	}
	sample := &BurstSample{Bursts: in.s.Bursts, Width: stormWidth, PluginCalls: after - before, Errors: int(failed.Load())}
	sample.PluginCallsPerBurstPerPlugin = float64(sample.PluginCalls) / float64(sample.Bursts*len(plugins))
	log.Printf("bench:   bursts: %d x %d queries for pod %s: %d plugin calls (%.2f per burst and plugin), %d errors",
		sample.Bursts, sample.Width, id, sample.PluginCalls, sample.PluginCallsPerBurstPerPlugin, sample.Errors)
	return sample, nil
}

// measureContainerEvents runs a container through its life in the first pod while listening to
// CRI container events (each of which containerd builds by calling its own PodSandboxStatus), and
// counts the plugin calls that causes (C7: internal callers reuse the last answer).
func (in *instance) measureContainerEvents(ctx context.Context, plugins []*runningPlugin, name string) (*EventsSample, error) {
	eventsCtx, stopEvents := context.WithCancel(ctx)
	defer stopEvents()
	stream, err := in.h.Runtime.GetContainerEvents(eventsCtx, &criruntime.GetEventsRequest{})
	if err != nil {
		return nil, fmt.Errorf("container events: %w", err)
	}
	before, err := statusCalls(ctx, plugins)
	if err != nil {
		return nil, err
	}

	pod := in.pods[0]
	create, err := in.h.Runtime.CreateContainer(ctx, &criruntime.CreateContainerRequest{PodSandboxId: pod,
		Config:        in.h.ContainerConfig(name, testimages.BusyboxImage, "sleep", "3600"),
		SandboxConfig: in.podConfigs[0]})
	if err != nil {
		return nil, fmt.Errorf("create container %s in pod %s: %w", name, pod, err)
	}
	id := create.ContainerId
	deleted := make(chan struct{})
	sample := &EventsSample{}
	go func() {
		defer close(deleted)
		for {
			event, err := stream.Recv()
			if err != nil {
				return
			}
			if event.GetContainerId() != id {
				continue
			}
			sample.Events++
			if event.GetPodSandboxStatus().GetNetwork().GetIp() != "" {
				sample.EventsWithPodIP++
			}
			if event.GetContainerEventType() == criruntime.ContainerEventType_CONTAINER_DELETED_EVENT {
				return
			}
		}
	}()
	steps := []struct {
		what string
		call func() error
	}{
		{"start", func() error {
			_, err := in.h.Runtime.StartContainer(ctx, &criruntime.StartContainerRequest{ContainerId: id})
			return err
		}},
		{"stop", func() error {
			_, err := in.h.Runtime.StopContainer(ctx, &criruntime.StopContainerRequest{ContainerId: id})
			return err
		}},
		{"remove", func() error {
			_, err := in.h.Runtime.RemoveContainer(ctx, &criruntime.RemoveContainerRequest{ContainerId: id})
			return err
		}},
	}
	for _, step := range steps {
		if err := step.call(); err != nil {
			return nil, fmt.Errorf("%s container %s in pod %s: %w", step.what, name, pod, err)
		}
	}
	select {
	case <-deleted:
	case <-time.After(10 * time.Second):
		stopEvents()
		<-deleted
		log.Printf("bench:   no CONTAINER_DELETED event for container %s within 10 s", id)
	}
	after, err := statusCalls(ctx, plugins)
	if err != nil {
		return nil, err
	}
	sample.PluginCalls = after - before
	log.Printf("bench:   container events: %d (%d with the pod IP), %d plugin calls",
		sample.Events, sample.EventsWithPodIP, sample.PluginCalls)
	return sample, nil
}

// measureStorm creates new pods, one at a time, while stormWidth workers query the long-running
// pods' status, and removes them afterwards (S3: no head-of-line blocking).
func (in *instance) measureStorm(ctx context.Context, prefix string) (*StormSample, error) {
	stormCtx, stopStorm := context.WithCancel(ctx)
	loadDone := make(chan *statusLoad)
	stormStart := time.Now()
	go func() { loadDone <- in.runStatusLoad(stormCtx, stormWidth, false, time.Time{}) }()
	time.Sleep(200 * time.Millisecond) // let the storm reach full width

	var created []string
	var runLatencies []time.Duration
	var runErr error
	for i := range in.s.StormPods {
		config := in.h.PodConfig(fmt.Sprintf("%s-%d", prefix, i))
		start := time.Now()
		resp, err := in.h.Runtime.RunPodSandbox(ctx, &criruntime.RunPodSandboxRequest{Config: config})
		if err != nil {
			runErr = fmt.Errorf("run pod %s during the storm: %w", config.Metadata.Name, err)
			break
		}
		runLatencies = append(runLatencies, time.Since(start))
		created = append(created, resp.PodSandboxId)
	}
	stopStorm()
	load := <-loadDone
	elapsed := time.Since(stormStart)

	var errs []error
	for _, id := range created {
		errs = append(errs, in.h.RemovePod(ctx, id))
	}
	if err := errors.Join(append(errs, runErr)...); err != nil {
		return nil, err
	}
	statusLatencies := load.all()
	sample := &StormSample{Pods: len(runLatencies), RunP50Ms: percentileMs(runLatencies, 0.5),
		RunMaxMs: percentileMs(runLatencies, 1), StatusCalls: len(statusLatencies),
		StatusPerSecond: float64(len(statusLatencies)) / elapsed.Seconds(), StatusP50Ms: percentileMs(statusLatencies, 0.5),
		StatusErrors: int(load.errors.Load()), FirstError: load.errorText()}
	log.Printf("bench:   storm: RunPodSandbox p50 %.1f ms max %.1f ms over %d pods; status %.0f/s p50 %.2f ms, %d errors",
		sample.RunP50Ms, sample.RunMaxMs, sample.Pods, sample.StatusPerSecond, sample.StatusP50Ms, sample.StatusErrors)
	return sample, nil
}

// percentileMs returns the nearest-rank p-quantile of samples in milliseconds (0 for none).
func percentileMs(samples []time.Duration, p float64) float64 {
	values := make([]float64, len(samples))
	for i, d := range samples {
		values[i] = ms(d)
	}
	return percentile(values, p)
}

// percentile returns the nearest-rank p-quantile of values (0 for none).
func percentile(values []float64, p float64) float64 {
	if len(values) == 0 {
		return 0
	}
	sorted := slices.Clone(values)
	slices.Sort(sorted)
	rank := max(0, min(int(math.Ceil(p*float64(len(sorted))))-1, len(sorted)-1))
	return sorted[rank]
}

// loadAverage returns the 1, 5 and 15-minute load averages ("" when unknown): other work on the
// machine shows there.
func loadAverage() string {
	data, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	return strings.Join(strings.Fields(string(data))[:3], " ")
}
