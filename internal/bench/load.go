package bench

import (
	"cmp"
	"context"
	"fmt"
	"log"
	"maps"
	"os"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/procfs"
	"golang.org/x/perf/benchfmt"
)

// Phase is one timed phase of a round, with the machine's load during it.
type Phase struct {
	Part    string `json:"part"`
	Round   int    `json:"round"`
	Attempt int    `json:"attempt"` // 0, then 1... for a round measured again
	Name    string `json:"name"`
	// QuietWait is how long the phase waited for a quiet machine: -quiet-wait when it gave up.
	QuietWait float64 `json:"quietWaitSeconds"`
	Seconds   float64 `json:"seconds"`
	// Load is the share of the CPUs that went to other processes during the phase: the machine's
	// busy time less that of the bench's process tree, of the daemons' shims with their pods, and
	// of the kernel's threads and interrupts (which also tear down the pods' network namespaces).
	Load float64 `json:"load"`
	// Own is the share the bench's processes and the kernel's threads used.
	Own       float64 `json:"own"`
	Discarded bool    `json:"discarded,omitempty"` // its round was measured again
}

// loadMeter reads the machine's CPU time and that of the bench's own processes.
type loadMeter struct {
	fs    procfs.FS
	shims map[string]bool // the daemons' shim binaries: their processes and children are the bench's
	// ownIdle is the share of the CPUs the bench's own processes use while nothing is measured:
	// running clusters keep their control planes and kubelets busy.
	ownIdle float64
}

// cpuTimes are the CPU seconds of the machine's processes and those of each process of the
// bench's or the kernel's, at a moment.
type cpuTimes struct {
	at   time.Time
	busy float64
	ours map[int]float64
}

func busySeconds(c procfs.CPUStat) float64 {
	return c.User + c.Nice + c.System + c.IRQ + c.SoftIRQ + c.Steal
}

func (m *loadMeter) read() (cpuTimes, error) {
	stat, err := m.fs.Stat()
	if err != nil {
		return cpuTimes{}, err
	}
	procs, err := m.fs.AllProcs()
	if err != nil {
		return cpuTimes{}, err
	}
	t := cpuTimes{at: time.Now(), busy: busySeconds(stat.CPUTotal), ours: map[int]float64{}}
	children, cpu, roots := map[int][]int{}, map[int]float64{}, []int{os.Getpid(), 2} // 2: kthreadd
	for _, p := range procs {
		st, err := p.Stat()
		if err != nil {
			continue // exited meanwhile
		}
		children[st.PPID] = append(children[st.PPID], p.PID)
		// Children that exited and were reaped count in their parent's (USER_HZ is 100 on Linux).
		cpu[p.PID] = st.CPUTime() + float64(st.CUTime+st.CSTime)/100
		if exe, err := p.Executable(); err == nil && m.shims[exe] {
			roots = append(roots, p.PID)
		}
	}
	// A pod's shim that exits during a phase is an orphan, reaped by PID 1, which then holds its CPU
	// time: PID 1's reaped children count as the bench's (nothing else runs beside the bench).
	if init, err := m.fs.Proc(1); err == nil {
		if st, err := init.Stat(); err == nil {
			t.ours[1] = float64(st.CUTime+st.CSTime) / 100
		}
	}
	for len(roots) > 0 {
		pid := roots[len(roots)-1]
		roots = roots[:len(roots)-1]
		if _, seen := t.ours[pid]; !seen {
			t.ours[pid] = cpu[pid]
			roots = append(roots, children[pid]...)
		}
	}
	return t, nil
}

// shares are the shares of the CPUs that went to other processes and to the bench's own (with the
// kernel's threads) between from and t. A process of the bench that exited meanwhile counts with
// its whole time in its reaper's: a slight overestimate of the bench's share.
func (t cpuTimes) shares(from cpuTimes) (others, own float64) {
	ours := 0.0
	for pid, seconds := range t.ours {
		ours += seconds - from.ours[pid]
	}
	if cpus := t.at.Sub(from.at).Seconds() * float64(runtime.NumCPU()); cpus > 0 {
		return max(0, (t.busy-from.busy-ours)/cpus), ours / cpus
	}
	return 0, 0
}

// settle waits until the CPUs were busy in two 250 ms windows in a row less than a tenth beyond
// ownIdle, at most -quiet-wait: what the previous phase left running is not billed to the next
// one. It returns how long it waited.
func (m *loadMeter) settle(ctx context.Context, limit time.Duration) (time.Duration, error) {
	start, quiet := time.Now(), 0
	before, err := m.fs.Stat()
	for ; err == nil && quiet < 2 && time.Since(start) < limit; quiet++ {
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
		var after procfs.Stat
		if after, err = m.fs.Stat(); err != nil {
			break
		}
		busy := busySeconds(after.CPUTotal) - busySeconds(before.CPUTotal)
		idle := after.CPUTotal.Idle + after.CPUTotal.Iowait - before.CPUTotal.Idle - before.CPUTotal.Iowait
		if busy >= (0.1+m.ownIdle)*(busy+idle) { // interrupts left out of both
			quiet = -1
		}
		before = after
	}
	return time.Since(start), err
}

// measureOwnIdle measures ownIdle over 10 s, once the bench's long-running processes are up.
func (m *loadMeter) measureOwnIdle(ctx context.Context) error {
	from, err := m.read()
	if err != nil {
		return err
	}
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(10 * time.Second):
	}
	to, err := m.read()
	_, m.ownIdle = to.shares(from)
	return err
}

// round is one attempt at a round of a part: its phases and its measurements, kept or discarded
// together.
type round struct {
	s       settings
	meter   *loadMeter
	part    string
	n       int // 1...
	attempt int
	phases  []Phase
	results []string
}

// phase runs fn as a timed phase of the round, after a wait for a quiet machine, recording the
// load during it.
func (r *round) phase(ctx context.Context, name string, fn func() error) error {
	waited, err := r.meter.settle(ctx, r.s.QuietWait)
	if err != nil {
		return err
	}
	from, err := r.meter.read()
	if err != nil {
		return err
	}
	if err := fn(); err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	to, err := r.meter.read()
	others, own := to.shares(from)
	r.phases = append(r.phases, Phase{Part: r.part, Round: r.n, Attempt: r.attempt, Name: name, QuietWait: waited.Seconds(),
		Seconds: to.at.Sub(from.at).Seconds(), Load: others, Own: own})
	return err
}

// pair records a paired measurement of metric: config's value and base's, measured next to each
// other, and their ratio.
func (r *round) pair(metric string, p pairing, n int, v, base float64, unit string) {
	values := []benchfmt.Value{value(v, unit), value(base, "base-"+unit)}
	if base > 0 {
		values = append(values, value(v/base, ratioUnit))
	}
	r.add(pairName(metric, p), n, values...)
}

// measureTurns measures -repeats rounds of part: in each, every configuration of keys in turn, in
// a rotating order, and each pairing's figures (by metric) against its base's, of iterations
// each; metrics whose name ends in "share" are shares, the others seconds.
func (r *report) measureTurns(part string, keys []string, pairs []pairing, iterations int,
	measure func(rd *round, key string) (map[string]float64, error)) error {
	for n := 1; n <= r.Settings.Repeats; n++ {
		err := r.measureRound(part, n, func(rd *round) error {
			figures := map[string]map[string]float64{}
			for _, key := range rotated(keys, n) {
				f, err := measure(rd, key)
				if err != nil {
					return fmt.Errorf("%s: %w", key, err)
				}
				figures[key] = f
			}
			for _, p := range pairs {
				for _, metric := range slices.Sorted(maps.Keys(figures[p.config])) {
					unit := secPerOp
					if strings.HasSuffix(metric, "share") {
						unit = "share"
					}
					rd.pair(metric, p, iterations, figures[p.config][metric], figures[p.base][metric], unit)
				}
			}
			return nil
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// measureRound measures round n of part. A round whose phases saw other processes use more than
// -max-load of the CPUs is discarded and measured again, at most -max-redos times; then it is
// kept and counted as loaded.
func (r *report) measureRound(part string, n int, measure func(*round) error) error {
	for attempt := 0; ; attempt++ {
		rd := &round{s: r.Settings, meter: r.meter, part: part, n: n, attempt: attempt}
		if err := measure(rd); err != nil {
			return fmt.Errorf("%s, round %d: %w", part, n, err)
		}
		worst := slices.MaxFunc(append(rd.phases, Phase{}), func(a, b Phase) int { return cmp.Compare(a.Load, b.Load) }) // Phase{}: none
		loaded := worst.Load > r.Settings.MaxLoad
		if loaded && attempt < r.Settings.MaxRedos {
			log.Printf("bench: %s, round %d: other processes used %.0f%% of the CPUs during %s: measuring the round again",
				part, n, 100*worst.Load, worst.Name)
			for i := range rd.phases {
				rd.phases[i].Discarded = true
			}
			r.Phases, r.Redone = append(r.Phases, rd.phases...), r.Redone+1
			continue
		}
		if loaded {
			r.KeptLoaded++
		}
		r.Phases = append(r.Phases, rd.phases...)
		r.Results = append(r.Results, rd.results...)
		return nil
	}
}
