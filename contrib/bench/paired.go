package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"slices"
	"text/tabwriter"
	"time"
)

// The paired part compares a configuration (knext, cniless, upstream-again) with upstream on a
// machine whose speed drifts by tens of percent from one minute to the next (see the A/A
// configuration upstream-again): both daemons run at
// once and the measurement alternates between them, in slices of pairedSlice for
// PodSandboxStatus and in batches of the concurrency for pod starts and removals (sideOf), so
// that both sides see the same machine. What it cannot pair is the instance itself (root,
// bridge, subnet): the A/A pair (upstream-again, upstream) shows that part.

// pairedSlice is how long PodSandboxStatus runs on one side before switching to the other.
const pairedSlice = 200 * time.Millisecond

// sideOf returns the side (0: upstream U, 1: the other O) of the k-th slice or batch of a round:
// UOOUUOOU... in odd rounds, OUUOOUUO... in even ones, so that neither side is always the
// first after the wait for a quiet machine.
func sideOf(k, round int) int { return ((k+1)/2 + round + 1) % 2 }

// PairedRun is one round of the paired part: configuration Config against (upstream).
type PairedRun struct {
	Config    string            `json:"config"`
	Round     int               `json:"round"`
	Status    []PairedStatus    `json:"status"`
	Lifecycle []PairedLifecycle `json:"lifecycle"`
	// QuietWaits are the waits for a quiet machine before each timed phase.
	QuietWaits []QuietWait `json:"quietWaits"`
}

// PairedStatus is one PodSandboxStatus variant measured on both sides, pairedSlice at a time.
type PairedStatus struct {
	variant
	Calls [2]int     `json:"calls"` // [a, other]
	P50Ms [2]float64 `json:"p50Ms"`
	Ratio float64    `json:"ratio"` // other p50 / a p50
}

// PairedLifecycle is a lifecycle pass at one concurrency, batches alternating between the sides.
type PairedLifecycle struct {
	Concurrency     int        `json:"concurrency"`
	Pods            int        `json:"pods"` // per side
	RunP50Ms        [2]float64 `json:"runP50Ms"`
	StopRemoveP50Ms [2]float64 `json:"stopRemoveP50Ms"`
	RunRatio        float64    `json:"runRatio"`
	StopRemoveRatio float64    `json:"stopRemoveRatio"`
}

// runPaired measures configuration other against base (upstream) with both daemons running.
func runPaired(ctx context.Context, base, other *instance, round int) (_ *PairedRun, err error) {
	log.Printf("bench: round %d, paired: (%s) and (upstream) at once, alternating", round, other.c.Key)
	sides := [2]*instance{base, other}
	for _, in := range sides {
		in.quietWaits = nil
		if err := in.h.Start(ctx); err != nil {
			return nil, err
		}
		defer func() {
			if err != nil {
				err = fmt.Errorf("%w\n%s", err, in.h.LogTail(20))
			}
			err = errors.Join(err, in.h.Stop())
		}()
		stopNetwork, _, startErr := in.startNetwork(ctx)
		defer func() { err = errors.Join(err, stopNetwork()) }()
		if startErr != nil {
			return nil, startErr
		}
	}
	run := &PairedRun{Config: other.c.Key, Round: round}
	defer func() { run.QuietWaits = base.quietWaits }()
	if other.c.Status {
		for i := range sides { // the round's first side first
			if err := sides[sideOf(i, round)].warmUpStatus(ctx); err != nil {
				return nil, err
			}
		}
		for _, v := range variants {
			sample, err := pairedStatus(ctx, sides, v, round)
			if err != nil {
				return nil, err
			}
			run.Status = append(run.Status, sample)
		}
	}
	for _, width := range lifecycleWidths {
		sample, err := pairedLifecycle(ctx, sides, width, round)
		if err != nil {
			return nil, fmt.Errorf("paired lifecycle at concurrency %d: %w", width, err)
		}
		run.Lifecycle = append(run.Lifecycle, sample)
	}
	return run, nil
}

// pairedStatus runs variant v on each side for the configured duration in all, pairedSlice at a
// time, alternating.
func pairedStatus(ctx context.Context, sides [2]*instance, v variant, round int) (PairedStatus, error) {
	sample := PairedStatus{variant: v}
	if err := sides[0].settle(ctx, "paired status "+v.String()); err != nil {
		return sample, err
	}
	var latencies [2][]time.Duration
	slicesPerSide := max(1, int(sides[0].s.Duration/pairedSlice))
	for k := range 2 * slicesPerSide {
		side := sideOf(k, round)
		load := sides[side].runStatusLoad(ctx, v.Concurrency, v.Verbose, time.Now().Add(pairedSlice))
		if err := ctx.Err(); err != nil { // the load stops counting errors once ctx ends
			return sample, err
		}
		if n := load.errors.Load(); n > 0 {
			return sample, fmt.Errorf("(%s) %s: %d PodSandboxStatus errors, first: %s", sides[side].c.Key, v, n, load.errorText())
		}
		latencies[side] = append(latencies[side], load.all()...)
	}
	for side := range sides {
		sample.Calls[side], sample.P50Ms[side] = len(latencies[side]), percentileMs(latencies[side], 0.5)
	}
	sample.Ratio = ratioOf(sample.P50Ms)
	log.Printf("bench:   paired %-11s (upstream) p50 %7.3f ms, (%s) p50 %7.3f ms: %.3f", v, sample.P50Ms[0], sides[1].c.Key, sample.P50Ms[1], sample.Ratio)
	return sample, nil
}

// pairedLifecycle starts -lifecycle-pods pods on each side, in batches of width pods alternating
// between the sides, checks them, and removes them in the same way.
func pairedLifecycle(ctx context.Context, sides [2]*instance, width, round int) (PairedLifecycle, error) {
	n := sides[0].s.LifecyclePods
	sample := PairedLifecycle{Concurrency: width, Pods: n}
	var ids [2][]string
	var runMs, removeMs [2][]float64
	batches := (n + width - 1) / width
	batch := func(k int) (side, from, to int) {
		return sideOf(k, round), k / 2 * width, min(n, (k/2+1)*width)
	}
	removeAll := func() error {
		var errs []error
		for k := range 2 * batches {
			side, from, to := batch(k)
			started := len(ids[side]) // fewer than n after a failed start
			ms, err := sides[side].removePods(ctx, ids[side][min(from, started):min(to, started)], width)
			removeMs[side] = append(removeMs[side], ms...)
			errs = append(errs, err)
		}
		return errors.Join(errs...)
	}

	if err := sides[0].settle(ctx, fmt.Sprintf("paired lifecycle c%d run", width)); err != nil {
		return sample, err
	}
	for k := range 2 * batches {
		side, from, to := batch(k)
		var names []string
		for i := from; i < to; i++ {
			names = append(names, fmt.Sprintf("pair-r%d-c%d-%03d", round, width, i))
		}
		batchIDs, ms, err := sides[side].startPods(ctx, names, width)
		ids[side], runMs[side] = append(ids[side], batchIDs...), append(runMs[side], ms...)
		if err != nil {
			return sample, errors.Join(err, removeAll())
		}
	}
	for side, in := range sides { // untimed: every pod is a working pod of its side's network
		if err := forEach(n, stormWidth, func(i int) error { return in.checkPod(ctx, ids[side][i], false, nil) }); err != nil {
			return sample, errors.Join(err, removeAll())
		}
	}
	if err := sides[0].settle(ctx, fmt.Sprintf("paired lifecycle c%d stop+remove", width)); err != nil {
		return sample, errors.Join(err, removeAll())
	}
	if err := removeAll(); err != nil {
		return sample, err
	}
	for side := range sides {
		sample.RunP50Ms[side], sample.StopRemoveP50Ms[side] = percentile(runMs[side], 0.5), percentile(removeMs[side], 0.5)
	}
	sample.RunRatio, sample.StopRemoveRatio = ratioOf(sample.RunP50Ms), ratioOf(sample.StopRemoveP50Ms)
	log.Printf("bench:   paired lifecycle c%d: RunPodSandbox p50 (upstream) %.1f ms, (%s) %.1f ms: %.3f; Stop+Remove p50 (upstream) %.1f ms, (%s) %.1f ms: %.3f",
		width, sample.RunP50Ms[0], sides[1].c.Key, sample.RunP50Ms[1], sample.RunRatio,
		sample.StopRemoveP50Ms[0], sides[1].c.Key, sample.StopRemoveP50Ms[1], sample.StopRemoveRatio)
	return sample, nil
}

// ratioOf returns the other side's figure over upstream's, 0 without a figure of upstream.
func ratioOf(p50 [2]float64) float64 {
	if p50[0] <= 0 {
		return 0
	}
	return p50[1] / p50[0]
}

// PairedSummary is one paired figure of a configuration over the rounds: its ratio to (upstream).
type PairedSummary struct {
	Config string  `json:"config"`
	Figure string  `json:"figure"`
	Ratio  *Spread `json:"ratio"`
}

// pairedFigure names a paired ratio and reads it from a paired round.
type pairedFigure struct {
	name      string
	lifecycle bool // a pod lifecycle figure, else a PodSandboxStatus one
	ratio     func(*PairedRun) (float64, bool)
}

// pairedFigures are the figures of the paired part, in report order.
func pairedFigures() []pairedFigure {
	var figures []pairedFigure
	for _, v := range variants {
		figures = append(figures, pairedFigure{"PodSandboxStatus p50, " + v.String(), false, func(run *PairedRun) (float64, bool) {
			i := slices.IndexFunc(run.Status, func(s PairedStatus) bool { return s.variant == v })
			return pairedRatio(run.Status, i, func(s PairedStatus) float64 { return s.Ratio })
		}})
	}
	for _, phase := range []struct {
		name  string
		ratio func(PairedLifecycle) float64
	}{{"RunPodSandbox", func(s PairedLifecycle) float64 { return s.RunRatio }},
		{"StopPodSandbox + RemovePodSandbox", func(s PairedLifecycle) float64 { return s.StopRemoveRatio }}} {
		for _, width := range lifecycleWidths {
			figures = append(figures, pairedFigure{fmt.Sprintf("%s p50, c%d", phase.name, width), true, func(run *PairedRun) (float64, bool) {
				i := slices.IndexFunc(run.Lifecycle, func(s PairedLifecycle) bool { return s.Concurrency == width })
				return pairedRatio(run.Lifecycle, i, phase.ratio)
			}})
		}
	}
	return figures
}

func pairedRatio[S any](samples []S, i int, ratio func(S) float64) (float64, bool) {
	if i < 0 || ratio(samples[i]) <= 0 {
		return 0, false
	}
	return ratio(samples[i]), true
}

// pairedFigureRatios returns figure's ratio of configuration key in every paired round that has it.
func (r *report) pairedFigureRatios(key string, figure pairedFigure) []float64 {
	var ratios []float64
	for _, run := range r.Paired {
		if run.Config != key {
			continue
		}
		if ratio, ok := figure.ratio(run); ok {
			ratios = append(ratios, ratio)
		}
	}
	return ratios
}

func (r *report) pairedSummaries() []PairedSummary {
	var out []PairedSummary
	for _, figure := range pairedFigures() {
		for _, c := range r.Configurations {
			if ratios := r.pairedFigureRatios(c.Key, figure); len(ratios) > 0 {
				out = append(out, PairedSummary{Config: c.Key, Figure: figure.name, Ratio: spread(ratios)})
			}
		}
	}
	return out
}

// pairedTargets are the (knext) and (cniless) targets judged on the paired part, with the A/A
// pair's figure beside them.
func (r *report) pairedTargets() []Target {
	var targets []Target
	for _, pair := range []struct {
		key           string
		limit         float64
		lifecycleOnly bool
	}{{cfgKnext, 1.02, false}, {cfgCNILess, 0.8, true}} {
		for _, figure := range pairedFigures() {
			if pair.lifecycleOnly && !figure.lifecycle {
				continue
			}
			t := Target{Name: fmt.Sprintf("(%s) %s <= %.2f x (upstream), paired", pair.key, figure.name, pair.limit),
				Limit: pair.limit, Judged: "median"}
			if aa := spread(r.pairedFigureRatios(cfgUpstreamAgain, figure)); aa != nil {
				t.Note = fmt.Sprintf("A/A, (upstream-again) / (upstream) paired: median %.3g [%.3g..%.3g]", aa.Median, aa.Min, aa.Max)
			}
			targets = append(targets, judge(t, r.pairedFigureRatios(pair.key, figure), r.absent(pair.key)...))
		}
	}
	return targets
}

func (r *report) printPaired(out io.Writer) {
	if len(r.PairedSummaries) == 0 {
		return
	}
	fmt.Fprintf(out, "\nPaired: (knext), (cniless) and (upstream-again), each running at the same time as (upstream), the measurement alternating between the two "+
		"(UOOUUOOU... in odd rounds, OUUOOUUO... in even ones, U upstream, O the other): PodSandboxStatus ((knext) and (upstream-again)) in slices of %s, %s per side; "+
		"pod lifecycle in batches of the concurrency, each batch after the previous one, %d pods per side.\n",
		pairedSlice, r.Settings.Duration, r.Settings.LifecyclePods)
	fmt.Fprintln(out, "Cells: the per-round ratio of p50s to (upstream)'s, median [min..max] over the rounds.")
	w := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "figure\tcfg\tp50 / (upstream)\t")
	for _, s := range r.PairedSummaries {
		fmt.Fprintf(w, "%s\t%s\t%s\t\n", s.Figure, s.Config, cell(s.Ratio, "%.3f"))
	}
	w.Flush()
}
