package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	criruntime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/knext-dev/knext/internal/harness"
)

// lifecycleWidths are the concurrencies of the pod lifecycle measurement.
var lifecycleWidths = []int{1, 8}

// measureLifecycle starts -lifecycle-pods new pods, width at a time, timing each RunPodSandbox,
// checks that each is READY with an IP, then stops and removes them, width at a time, timing each
// StopPodSandbox + RemovePodSandbox. Around the two phases it reads what the configuration
// exposes about where the time goes: containerd's NRI plugin and CNI latencies, nri-bridge's own
// timings.
func (in *instance) measureLifecycle(ctx context.Context, width, round int) (LifecycleSample, error) {
	n := in.s.LifecyclePods
	sample := LifecycleSample{Concurrency: width, Pods: n}
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("life-r%d-c%d-%03d", round, width, i)
	}
	before, err := in.lifecycleProbes(ctx)
	if err != nil {
		return sample, err
	}

	if err := in.settle(ctx, fmt.Sprintf("lifecycle c%d run", width)); err != nil {
		return sample, err
	}
	profiled := in.profilePhase(ctx, round, width, "run")
	start := time.Now()
	ids, runMs, runErr := in.startPods(ctx, names, width)
	sample.RunMs = runMs
	sample.RunSeconds = time.Since(start).Seconds()
	runErr = errors.Join(runErr, profiled())
	afterRun, err := in.lifecycleProbes(ctx)
	runErr = errors.Join(runErr, err)
	if runErr == nil {
		// Untimed, and between the probes (its status queries are neither phase's): every
		// measured pod is a working pod of this configuration's network.
		runErr = forEach(n, stormWidth, func(i int) error { return in.checkPod(ctx, ids[i], false, nil) })
	}
	runErr = errors.Join(runErr, in.settle(ctx, fmt.Sprintf("lifecycle c%d stop+remove", width)))
	beforeRemove, err := in.lifecycleProbes(ctx)
	runErr = errors.Join(runErr, err)

	profiled = in.profilePhase(ctx, round, width, "stop-remove")
	start = time.Now()
	stopRemoveMs, removeErr := in.removePods(ctx, ids, width)
	sample.StopRemoveMs = stopRemoveMs
	sample.StopRemoveSeconds = time.Since(start).Seconds()
	if err := errors.Join(runErr, removeErr, profiled()); err != nil {
		return sample, err
	}
	after, err := in.lifecycleProbes(ctx)
	if err != nil {
		return sample, err
	}
	sample.summarize()
	sample.Hooks = hookLatencies(before.hooks, afterRun.hooks, beforeRemove.hooks, after.hooks)
	sample.Bridge = bridgeTimingsSince(in.bridgeLog(), before.bridgeLogSize, n)
	log.Printf("bench:   lifecycle c%d: RunPodSandbox p50 %.1f ms p99 %.1f ms; Stop+Remove p50 %.1f ms p99 %.1f ms (%d pods)",
		width, sample.RunP50Ms, sample.RunP99Ms, sample.StopRemoveP50Ms, sample.StopRemoveP99Ms, n)
	return sample, nil
}

// startPods starts a pod of each name, width at a time, and returns their IDs ("" for a pod that
// did not start) and the time of each RunPodSandbox in ms.
func (in *instance) startPods(ctx context.Context, names []string, width int) (ids []string, runMs []float64, err error) {
	ids, runMs = make([]string, len(names)), make([]float64, len(names))
	err = forEach(len(names), width, func(i int) error {
		config := in.h.PodConfig(names[i])
		t := time.Now()
		resp, err := in.h.Runtime.RunPodSandbox(ctx, &criruntime.RunPodSandboxRequest{Config: config})
		if err != nil {
			return fmt.Errorf("run pod %s: %w", names[i], err)
		}
		runMs[i] = ms(time.Since(t))
		ids[i] = resp.PodSandboxId
		return nil
	})
	return ids, runMs, err
}

// removePods stops and removes the pods ("" IDs are skipped), width at a time, and returns the
// time of each StopPodSandbox + RemovePodSandbox in ms.
func (in *instance) removePods(ctx context.Context, ids []string, width int) ([]float64, error) {
	stopRemoveMs := make([]float64, len(ids))
	err := forEach(len(ids), width, func(i int) error {
		if ids[i] == "" {
			return nil
		}
		t := time.Now()
		if err := in.h.RemovePod(ctx, ids[i]); err != nil {
			return err
		}
		stopRemoveMs[i] = ms(time.Since(t))
		return nil
	})
	return stopRemoveMs, err
}

// lifecyclePhaseProfile is how long the daemon's CPU profile of a lifecycle phase runs (-profile),
// from the phase's start: a phase's length is not known in advance.
const lifecyclePhaseProfile = 5

// profilePhase starts the daemon's CPU profile of a lifecycle phase when profiles are wanted,
// written to <config>-round<n>-lifecycle-c<width>-<phase>.pprof, and returns the function that
// waits for it.
func (in *instance) profilePhase(ctx context.Context, round, width int, phase string) func() error {
	if in.debugSocket == "" {
		return func() error { return nil }
	}
	done := make(chan error, 1)
	name := fmt.Sprintf("%s-round%d-lifecycle-c%d-%s.pprof", in.c.Key, round, width, phase)
	go func() { done <- in.profile(ctx, filepath.Join(in.s.Profile, name), lifecyclePhaseProfile) }()
	return func() error { return <-done }
}

// probes are the counters read around a lifecycle phase.
type probes struct {
	hooks         latencies // nil without a metrics endpoint
	bridgeLogSize int64
}

func (in *instance) lifecycleProbes(ctx context.Context) (probes, error) {
	var p probes
	if in.metricsAddress != "" {
		var err error
		if p.hooks, err = fetchLatencies(ctx, in.metricsAddress); err != nil {
			return p, err
		}
	}
	if info, err := os.Stat(in.bridgeLog()); err == nil {
		p.bridgeLogSize = info.Size()
	}
	return p, nil
}

// bridgeLog is nri-bridge's log file ("" without nri-bridge).
func (in *instance) bridgeLog() string {
	if !in.c.bridged() {
		return ""
	}
	return filepath.Join(in.h.Root, harness.NRIBridgeProcess+".log")
}

func ms(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e6 }

func (s *LifecycleSample) summarize() {
	s.RunP50Ms, s.RunP99Ms = percentile(s.RunMs, 0.5), percentile(s.RunMs, 0.99)
	s.StopRemoveP50Ms, s.StopRemoveP99Ms = percentile(s.StopRemoveMs, 0.5), percentile(s.StopRemoveMs, 0.99)
}

// hookLatencies returns the NRI plugin calls and CNI operations of the start phase
// (before..afterRun) and of the removal phase (beforeRemove..after), per plugin and operation.
func hookLatencies(before, afterRun, beforeRemove, after latencies) []HookLatency {
	if before == nil {
		return nil
	}
	var hooks []HookLatency
	for _, phase := range []struct {
		name          string
		from, through latencies
	}{{"run", before, afterRun}, {"stop+remove", beforeRemove, after}} {
		for _, d := range phase.through.since(phase.from) {
			d.Phase = phase.name
			hooks = append(hooks, d)
		}
	}
	return hooks
}

// bridgeStep matches a step's duration in nri-bridge's log lines ("stored 4.1ms, wired 2.3ms").
var bridgeStep = regexp.MustCompile(`\b(stored|wired|detached|unwired|released) ([0-9.]+(?:ns|µs|us|ms|s))\b`)

// bridgeTimingsSince returns the mean duration of each step nri-bridge logged after offset of its
// log (nil without a log). nri-bridge deletes a stopped pod's veth and releases its addresses
// after the hook: it waits up to 5 s for every release to be logged.
func bridgeTimingsSince(path string, offset int64, pods int) *BridgeTimings {
	if path == "" {
		return nil
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		t := readBridgeTimings(path, offset, pods)
		if t.Releases >= pods || time.Now().After(deadline) {
			return t
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func readBridgeTimings(path string, offset int64, pods int) *BridgeTimings {
	f, err := os.Open(path)
	if err != nil {
		return &BridgeTimings{Error: err.Error()}
	}
	defer f.Close()
	if _, err := f.Seek(offset, 0); err != nil {
		return &BridgeTimings{Error: err.Error()}
	}
	return parseBridgeTimings(bufio.NewScanner(f), pods)
}

func parseBridgeTimings(lines *bufio.Scanner, pods int) *BridgeTimings {
	sums, counts := map[string]time.Duration{}, map[string]int{}
	for lines.Scan() {
		for _, m := range bridgeStep.FindAllStringSubmatch(lines.Text(), -1) {
			d, err := time.ParseDuration(strings.Replace(m[2], "us", "µs", 1))
			if err != nil {
				continue
			}
			sums[m[1]] += d
			counts[m[1]]++
		}
	}
	mean := func(step string) float64 {
		if counts[step] == 0 {
			return 0
		}
		return ms(sums[step] / time.Duration(counts[step]))
	}
	t := &BridgeTimings{Setups: counts["wired"], Releases: counts["released"],
		StoredMs: mean("stored"), WiredMs: mean("wired"), DetachedMs: mean("detached"), UnwiredMs: mean("unwired"),
		ReleasedMs: mean("released")}
	if t.Setups != pods || t.Releases != pods {
		t.Error = fmt.Sprintf("nri-bridge logged %d setups and %d releases for %d pods", t.Setups, t.Releases, pods)
	}
	return t
}

// cniPlugins are the CNI plugins of the lifecycle configurations' network: containerd runs
// loopback and the conflist (bridge, which runs host-local, then portmap) for every pod.
var cniPlugins = []string{"bridge", "host-local", "loopback", "portmap"}

// cniBinDir is a configuration's CNI bin dir: each plugin is a symlink to the real one, or to
// cnitrace while a traced pass runs, so that untraced passes pay nothing for the tracing.
type cniBinDir struct {
	dir     string
	realDir string // where the real plugins are (/usr/lib/cni)
}

func newCNIBinDir(realDir, tracer string) (*cniBinDir, error) {
	dir, err := os.MkdirTemp("", "knext-bench-cni-")
	if err != nil {
		return nil, err
	}
	d := &cniBinDir{dir: dir, realDir: realDir}
	err = os.MkdirAll(filepath.Join(dir, "real"), 0o755)
	for _, name := range cniPlugins {
		err = errors.Join(err, os.Symlink(filepath.Join(realDir, name), filepath.Join(dir, "real", name)))
	}
	if tracer != "" {
		// The link is resolved from the bin dir: it must not be relative to ours.
		abs, absErr := filepath.Abs(tracer)
		err = errors.Join(err, absErr, os.Symlink(abs, filepath.Join(dir, "cnitrace")))
	}
	if err == nil {
		err = d.trace(false)
	}
	if err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("CNI bin dir %s: %w", dir, err)
	}
	return d, nil
}

// trace points every plugin at cnitrace (on) or at the real plugin (off); each switch is one
// atomic rename, so a concurrent plugin execution finds one or the other.
func (d *cniBinDir) trace(on bool) error {
	for _, name := range cniPlugins {
		target := filepath.Join(d.realDir, name)
		if on {
			target = filepath.Join(d.dir, "cnitrace")
		}
		tmp := filepath.Join(d.dir, "."+name)
		os.Remove(tmp)
		if err := os.Symlink(target, tmp); err != nil {
			return err
		}
		if err := os.Rename(tmp, filepath.Join(d.dir, name)); err != nil {
			return err
		}
	}
	return nil
}

func (d *cniBinDir) traceLog() string { return filepath.Join(d.dir, "trace.log") }

func (d *cniBinDir) remove() error { return os.RemoveAll(d.dir) }

// measureCNITrace runs -cni-trace-pods pods one at a time (start all, then stop and remove all)
// with every CNI plugin execution timed by cnitrace. The pass is separate from the measured ones:
// the wrapper costs a process start per execution.
func (in *instance) measureCNITrace(ctx context.Context, round int) (_ *CNITrace, err error) {
	if err := os.Remove(in.cni.traceLog()); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	if err := in.cni.trace(true); err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, in.cni.trace(false)) }()
	if err := in.settle(ctx, "CNI trace"); err != nil {
		return nil, err
	}
	n := in.s.CNITracePods
	var runMs, removeMs []float64
	for i := range n {
		config := in.h.PodConfig(fmt.Sprintf("cnitrace-r%d-%03d", round, i))
		t := time.Now()
		resp, err := in.h.Runtime.RunPodSandbox(ctx, &criruntime.RunPodSandboxRequest{Config: config})
		if err != nil {
			return nil, fmt.Errorf("run pod %s: %w", config.Metadata.Name, err)
		}
		runMs = append(runMs, ms(time.Since(t)))
		t = time.Now()
		if err := in.h.RemovePod(ctx, resp.PodSandboxId); err != nil {
			return nil, err
		}
		removeMs = append(removeMs, ms(time.Since(t)))
	}
	f, err := os.Open(in.cni.traceLog())
	if err != nil {
		return nil, fmt.Errorf("no CNI trace (did containerd run the plugins of %s?): %w", in.cni.dir, err)
	}
	defer f.Close()
	trace, err := parseCNITrace(bufio.NewScanner(f), n)
	if err != nil {
		return nil, err
	}
	trace.RunP50Ms, trace.StopRemoveP50Ms = percentile(runMs, 0.5), percentile(removeMs, 0.5)
	log.Printf("bench:   CNI trace: %d pods, CNI per pod: ADD %.1f ms, DEL %.1f ms (traced RunPodSandbox p50 %.1f ms, Stop+Remove %.1f ms)",
		n, trace.AddPerPodMs, trace.DelPerPodMs, trace.RunP50Ms, trace.StopRemoveP50Ms)
	return trace, nil
}

// parseCNITrace sums cnitrace's lines per plugin and command. Per pod, it counts only plugins
// containerd ran itself (not nested): a nested plugin's time is part of its parent's.
func parseCNITrace(lines *bufio.Scanner, pods int) (*CNITrace, error) {
	type key struct {
		plugin, command string
		nested          bool
	}
	sums, counts := map[key]time.Duration{}, map[key]int{}
	var order []key
	var addTotal, delTotal time.Duration
	for lines.Scan() {
		f := strings.Fields(lines.Text())
		if len(f) < 5 {
			return nil, fmt.Errorf("CNI trace line %q: want <plugin> <command> <nested> <ns> <exit> [<container>]", lines.Text())
		}
		nanos, err := strconv.ParseInt(f[3], 10, 64)
		if err != nil {
			return nil, fmt.Errorf("CNI trace line %q: %w", lines.Text(), err)
		}
		if f[4] != "0" {
			return nil, fmt.Errorf("CNI plugin %s %s exited with %s", f[0], f[1], f[4])
		}
		k := key{plugin: f[0], command: f[1], nested: f[2] == "1"}
		if counts[k] == 0 {
			order = append(order, k)
		}
		sums[k] += time.Duration(nanos)
		counts[k]++
		if !k.nested {
			switch k.command {
			case "ADD":
				addTotal += time.Duration(nanos)
			case "DEL":
				delTotal += time.Duration(nanos)
			}
		}
	}
	if err := lines.Err(); err != nil {
		return nil, err
	}
	t := &CNITrace{Pods: pods, AddPerPodMs: ms(addTotal) / float64(pods), DelPerPodMs: ms(delTotal) / float64(pods)}
	for _, k := range order {
		t.Executions = append(t.Executions, CNIExecution{Plugin: k.plugin, Command: k.command, Nested: k.nested,
			Calls: counts[k], MeanMs: ms(sums[k] / time.Duration(counts[k]))})
	}
	return t, nil
}

// startBridge starts nri-bridge as the pod network of a CNI-less instance and waits until
// containerd reports the network ready. It returns the process also on error, for the caller to
// stop.
func (in *instance) startBridge(ctx context.Context) (*harness.Process, error) {
	binary := in.s.Bridge
	if in.c.BaselineBridge {
		binary = in.s.BaseBridge
	}
	return in.h.StartNRIBridge(ctx, binary, in.h.NRIBridgeArgs("-ipv4-subnet", in.h.Subnet.String())...)
}
