package bench

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/prometheus/procfs"
	criruntime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/knext-dev/knext/internal/bench/ping"
	"github.com/knext-dev/knext/internal/ociimage"
)

// A pair is upstream's instance (side 0) and a configuration's (side 1), both daemons running.
// PodSandboxStatus runs on one side then the other in slices of pairSlice, pods start and go in
// batches of the concurrency, in the order sideOf gives: both sides see the same machine. Work
// one side leaves behind (a shim exiting, a network namespace's cleanup) lands on whichever runs
// next, which shrinks a real difference towards 1 rather than favouring a side.
const (
	pairSlice  = 200 * time.Millisecond
	stormWidth = 16 // the c16 variants, the status storm, the bursts
	stormPods  = 10 // started during each storm
	bursts     = 20
)

// sideOf returns the side of the k-th slice or batch of a round: 0110 0110... in odd rounds,
// 1001 1001... in even ones, so that neither side is always first after the wait for quiet.
func sideOf(k, round int) int { return ((k+1)/2 + round + 1) % 2 }

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

var (
	variants        = []variant{{1, false}, {stormWidth, false}, {1, true}, {stormWidth, true}}
	lifecycleWidths = []int{1, 8}
)

// Load is one side's figures of a timed load of calls.
type Load struct {
	Calls     int     `json:"calls"`
	PerSecond float64 `json:"perSecond"`
	P50Ms     float64 `json:"p50Ms"`
	P99Ms     float64 `json:"p99Ms"`
	// PluginCalls is the status plugins' PodSandboxStatus calls per call (NRI's metrics, S8).
	PluginCalls float64 `json:"pluginCallsPerCall"`
}

type StatusSample struct {
	Variant variant `json:"variant"`
	Sides   [2]Load `json:"sides"`
}

// LifecycleSample is one side's pod starts and removals at one concurrency.
type LifecycleSample struct {
	Concurrency  int       `json:"concurrency"`
	RunMs        []float64 `json:"runMs"`        // RunPodSandbox of each pod
	StopRemoveMs []float64 `json:"stopRemoveMs"` // StopPodSandbox + RemovePodSandbox of each pod
	// Timers are containerd's NRI plugin and CNI latencies of the starts, then of the removals.
	Timers []Timer `json:"timers"`
}

// QuietWait is the wait for a quiet machine before a timed phase.
type QuietWait struct {
	Phase   string  `json:"phase"`
	Seconds float64 `json:"seconds"`
	Quiet   bool    `json:"quiet"` // false: still busy after quietLimit, measured anyway
}

// PairRun is one round of a configuration against upstream.
type PairRun struct {
	Config string         `json:"config"`
	Round  int            `json:"round"`
	Status []StatusSample `json:"status,omitempty"`
	// Ping is the raw ttrpc round trip to knext-1-plugin's plugin process, by concurrency, right
	// after its status queries at that concurrency.
	Ping map[int]Load `json:"ping,omitempty"`
	// Storm is each side's RunPodSandbox times of stormPods new pods started one at a time while
	// stormWidth workers query the other pods' status.
	Storm     [2][]float64         `json:"stormRunMs"`
	Lifecycle [2][]LifecycleSample `json:"lifecycle"`
	// BurstCalls is the plugin calls per burst of stormWidth simultaneous queries for one pod,
	// per plugin (C7: they share one round trip).
	BurstCalls *float64 `json:"burstPluginCalls,omitempty"`
	// EventCalls is the plugin calls caused by a container's create, start, stop and remove, of
	// Events CRI container events, EventsWithIP of which carried the pod's IP (C7).
	EventCalls   *float64     `json:"eventPluginCalls,omitempty"`
	Events       int          `json:"events,omitempty"`
	EventsWithIP int          `json:"eventsWithIP,omitempty"`
	QuietWaits   []QuietWait  `json:"quietWaits"`
	sides        [2]*instance // not reported
}

// runPair measures configuration other against upstream's instance up in round.
func runPair(ctx context.Context, up, other *instance, round int) (_ *PairRun, err error) {
	log.Printf("bench: round %d: (%s) against (upstream)", round, other.c.Key)
	p := &PairRun{Config: other.c.Key, Round: round, Ping: map[int]Load{}, sides: [2]*instance{up, other}}
	for _, in := range p.sides {
		if err := in.h.Start(ctx); err != nil {
			return nil, err
		}
		defer func() {
			if err != nil {
				err = fmt.Errorf("%w\n%s", err, in.h.LogTail(20))
			}
			err = errors.Join(err, in.stop())
		}()
		if err := in.startNetwork(ctx); err != nil {
			return nil, err
		}
	}
	if other.s.selected("status") && other.c.Status {
		if err := p.measureStatus(ctx); err != nil {
			return nil, err
		}
	}
	if other.s.selected("lifecycle") && other.c.Lifecycle {
		for _, width := range lifecycleWidths {
			if err := p.measureLifecycle(ctx, width); err != nil {
				return nil, fmt.Errorf("lifecycle c%d: %w", width, err)
			}
		}
	}
	return p, nil
}

// settle waits until less than quietBusy of the CPUs were busy in two quietWindows in a row, at
// most quietLimit: what the previous phase left running is not billed to the next one.
func (p *PairRun) settle(ctx context.Context, phase string) error {
	const quietBusy, quietWindow, quietLimit = 0.10, 250 * time.Millisecond, 15 * time.Second
	fs, err := procfs.NewDefaultFS()
	if err != nil {
		return err
	}
	start, quiet := time.Now(), 0
	for before, err := fs.Stat(); quiet < 2 && time.Since(start) < quietLimit; {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(quietWindow):
		}
		after, statErr := fs.Stat()
		if err = errors.Join(err, statErr); err != nil {
			return err
		}
		if quiet++; busyShare(before.CPUTotal, after.CPUTotal) >= quietBusy {
			quiet = 0
		}
		before = after
	}
	p.QuietWaits = append(p.QuietWaits, QuietWait{Phase: phase, Seconds: time.Since(start).Seconds(), Quiet: quiet == 2})
	return nil
}

func (p *PairRun) measureStatus(ctx context.Context) error {
	for k := range 2 { // untimed: cold caches and connections after the start
		in := p.sides[sideOf(k, p.Round)]
		if err := in.checkPods(ctx, in.pods); err != nil {
			return err
		}
		if _, _, err := load(ctx, stormWidth, 500*time.Millisecond, in.statusCall(false)); err != nil {
			return fmt.Errorf("(%s) warm-up: %w", in.c.Key, err)
		}
	}
	other := p.sides[1]
	for _, v := range variants {
		sample, err := p.statusVariant(ctx, v)
		if err != nil {
			return err
		}
		p.Status = append(p.Status, sample)
		if other.c.Ping && !v.Verbose {
			if err := p.measurePing(ctx, v.Concurrency); err != nil {
				return err
			}
		}
	}
	if len(other.plugins) > 0 && !other.plugins[0].spec.AtRunPodSandbox {
		if err := p.measureBursts(ctx); err != nil {
			return err
		}
		if err := p.measureEvents(ctx); err != nil {
			return err
		}
	}
	if other.c.Storm {
		for k := range 2 {
			if err := p.storm(ctx, sideOf(k, p.Round)); err != nil {
				return err
			}
		}
	}
	return nil
}

// statusVariant measures variant v on both sides, -duration each, pairSlice at a time.
func (p *PairRun) statusVariant(ctx context.Context, v variant) (StatusSample, error) {
	sample := StatusSample{Variant: v}
	if err := p.settle(ctx, "status "+v.String()); err != nil {
		return sample, err
	}
	var ms [2][]float64
	var seconds [2]float64
	calls, err := p.sides[1].pluginCallsDuring(ctx, func() error {
		for k := range 2 * max(1, int(p.sides[0].s.Duration/pairSlice)) {
			side := sideOf(k, p.Round)
			r, s, err := load(ctx, v.Concurrency, pairSlice, p.sides[side].statusCall(v.Verbose))
			if err != nil {
				return fmt.Errorf("(%s) %s: %w", p.sides[side].c.Key, v, err)
			}
			ms[side], seconds[side] = append(ms[side], r...), seconds[side]+s
		}
		return nil
	})
	if err != nil {
		return sample, err
	}
	for side := range 2 {
		sample.Sides[side] = summarize(ms[side], seconds[side])
	}
	sample.Sides[1].PluginCalls, _ = ratio(*calls, float64(len(ms[1])))
	log.Printf("bench:   status %-11s (upstream) p50 %.3f ms, (%s) p50 %.3f ms, plugin calls per query %.2f", v,
		sample.Sides[0].P50Ms, p.Config, sample.Sides[1].P50Ms, sample.Sides[1].PluginCalls)
	return sample, nil
}

func summarize(ms []float64, seconds float64) Load {
	l := Load{Calls: len(ms), P50Ms: percentile(ms, 0.5), P99Ms: percentile(ms, 0.99)}
	l.PerSecond, _ = ratio(float64(len(ms)), seconds)
	return l
}

// measurePing makes no-op ttrpc calls to the first plugin's process over one connection, width at
// a time, for -duration: the floor a status query through NRI cannot go below.
func (p *PairRun) measurePing(ctx context.Context, width int) error {
	client, err := ping.Dial(ctx, p.sides[1].plugins[0].ping)
	if err != nil {
		return err
	}
	defer client.Close()
	if err := p.settle(ctx, fmt.Sprintf("round trip c%d", width)); err != nil {
		return err
	}
	ms, seconds, err := load(ctx, width, p.sides[1].s.Duration, func(ctx context.Context, _ int) error { return ping.Ping(ctx, client) })
	if err != nil {
		return fmt.Errorf("round trip c%d: %w", width, err)
	}
	p.Ping[width] = summarize(ms, seconds)
	return nil
}

// pluginCallsDuring counts the status plugins' PodSandboxStatus calls while fn runs (S8).
func (in *instance) pluginCallsDuring(ctx context.Context, fn func() error) (*float64, error) {
	before, err := fetchTimers(ctx, in.metrics)
	if err == nil {
		err = fn()
	}
	if err != nil {
		return nil, err
	}
	after, err := fetchTimers(ctx, in.metrics)
	return new(float64(pluginCalls(after.since(before), "PodSandboxStatus"))), err
}

// measureBursts sends bursts of stormWidth simultaneous queries for one pod, the first.
func (p *PairRun) measureBursts(ctx context.Context) error {
	in := p.sides[1]
	calls, err := in.pluginCallsDuring(ctx, func() error {
		for range bursts {
			if err := forEach(stormWidth, stormWidth, func(int) error { return in.statusCall(false)(ctx, 0) }); err != nil {
				return fmt.Errorf("burst: %w", err)
			}
		}
		return nil
	})
	if err == nil {
		p.BurstCalls = new(*calls / float64(bursts*len(in.plugins)))
	}
	return err
}

// measureEvents runs a container through its life in the first pod while listening to CRI
// container events, each of which containerd builds with its own pod status query.
func (p *PairRun) measureEvents(ctx context.Context) (err error) {
	in := p.sides[1]
	eventsCtx, stopEvents := context.WithTimeout(ctx, time.Minute)
	defer stopEvents()
	stream, err := in.h.Runtime.GetContainerEvents(eventsCtx, &criruntime.GetEventsRequest{})
	if err != nil {
		return err
	}
	p.EventCalls, err = in.pluginCallsDuring(ctx, func() error {
		created, err := in.h.Runtime.CreateContainer(ctx, &criruntime.CreateContainerRequest{PodSandboxId: in.pods[0],
			Config:        in.h.ContainerConfig(fmt.Sprintf("events-%d", p.Round), ociimage.BusyboxImage, "sleep", "3600"),
			SandboxConfig: in.h.PodConfig("bench-000")})
		if err != nil {
			return err
		}
		id := created.ContainerId
		if _, err = in.h.Runtime.StartContainer(ctx, &criruntime.StartContainerRequest{ContainerId: id}); err == nil {
			_, err = in.h.Runtime.StopContainer(ctx, &criruntime.StopContainerRequest{ContainerId: id})
		}
		_, removeErr := in.h.Runtime.RemoveContainer(ctx, &criruntime.RemoveContainerRequest{ContainerId: id})
		for err == nil && removeErr == nil { // the stream holds the events: until the deletion's, or a minute
			event, recvErr := stream.Recv()
			if recvErr != nil {
				break
			}
			if event.GetContainerId() != id {
				continue
			}
			if p.Events++; event.GetPodSandboxStatus().GetNetwork().GetIp() != "" {
				p.EventsWithIP++
			}
			if event.GetContainerEventType() == criruntime.ContainerEventType_CONTAINER_DELETED_EVENT {
				break
			}
		}
		return errors.Join(err, removeErr)
	})
	return err
}

// storm starts stormPods new pods on a side, one at a time, while stormWidth workers query the
// long-running pods' status (S3: no head-of-line blocking), and removes them.
func (p *PairRun) storm(ctx context.Context, side int) error {
	in := p.sides[side]
	if err := p.settle(ctx, "storm "+in.c.Key); err != nil {
		return err
	}
	stormCtx, stopStorm := context.WithCancel(ctx)
	stormErr := make(chan error)
	go func() {
		_, _, err := load(stormCtx, stormWidth, time.Hour, in.statusCall(false))
		stormErr <- err
	}()
	time.Sleep(200 * time.Millisecond) // the storm at full width
	ids, runMs, err := in.startPods(ctx, stormPods, 1, func(i int) string { return fmt.Sprintf("storm-%d-%d", p.Round, i) })
	stopStorm()
	if statusErr := <-stormErr; statusErr != nil && !errors.Is(statusErr, context.Canceled) {
		err = errors.Join(err, fmt.Errorf("(%s) storm: %w", in.c.Key, statusErr))
	}
	if err == nil { // else the instance's Close removes them
		_, err = in.removePods(ctx, ids, 1)
	}
	p.Storm[side] = runMs
	return err
}

// measureLifecycle starts -lifecycle-pods pods on each side in batches of width alternating
// between the sides, checks them (untimed), and removes them the same way.
func (p *PairRun) measureLifecycle(ctx context.Context, width int) error {
	n := p.sides[0].s.LifecyclePods
	var ids [2][]string
	samples := [2]LifecycleSample{{Concurrency: width}, {Concurrency: width}}
	// phase runs batches of width pods, alternating between the sides, between readings of the timers.
	phase := func(name string, batch func(side, from, to int) error) error {
		if err := p.settle(ctx, fmt.Sprintf("lifecycle c%d %s", width, name)); err != nil {
			return err
		}
		var before [2]timers
		for side, in := range p.sides {
			var err error
			if before[side], err = fetchTimers(ctx, in.metrics); err != nil {
				return err
			}
		}
		for k := range 2 * ((n + width - 1) / width) {
			if err := batch(sideOf(k, p.Round), k/2*width, min(n, (k/2+1)*width)); err != nil {
				return err // the instance's Close removes what is left
			}
		}
		for side, in := range p.sides {
			after, err := fetchTimers(ctx, in.metrics)
			if err != nil {
				return err
			}
			samples[side].Timers = append(samples[side].Timers, after.since(before[side])...)
		}
		return nil
	}
	err := phase("start", func(side, from, to int) error {
		batchIDs, ms, err := p.sides[side].startPods(ctx, to-from, width, func(i int) string { return fmt.Sprintf("life-r%d-c%d-%03d", p.Round, width, from+i) })
		ids[side], samples[side].RunMs = append(ids[side], batchIDs...), append(samples[side].RunMs, ms...)
		return err
	})
	for side, in := range p.sides { // untimed, between the phases: every pod works
		err = errors.Join(err, in.checkPods(ctx, ids[side]))
	}
	if err == nil {
		err = phase("stop+remove", func(side, from, to int) error {
			ms, err := p.sides[side].removePods(ctx, ids[side][from:to], width)
			samples[side].StopRemoveMs = append(samples[side].StopRemoveMs, ms...)
			return err
		})
	}
	if err != nil {
		return err
	}
	for side := range 2 {
		p.Lifecycle[side] = append(p.Lifecycle[side], samples[side])
	}
	log.Printf("bench:   lifecycle c%d: RunPodSandbox p50 (upstream) %.1f ms, (%s) %.1f ms; Stop+Remove p50 %.1f ms, %.1f ms", width,
		percentile(samples[0].RunMs, 0.5), p.Config, percentile(samples[1].RunMs, 0.5),
		percentile(samples[0].StopRemoveMs, 0.5), percentile(samples[1].StopRemoveMs, 0.5))
	return nil
}
