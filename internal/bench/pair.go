package bench

import (
	"context"
	"errors"
	"fmt"
	"log"
	"slices"
	"time"

	"github.com/aclements/go-moremath/stats"
)

// A pair is a base's instance (side 0) and a configuration's (side 1), both daemons running.
// PodSandboxStatus runs on one side then the other in slices of pairSlice, pods start and go in
// batches of the concurrency, in the order sideOf gives: both sides see the same machine. Each
// slice or batch of one side and the next of the other make one paired measurement. Work one
// side leaves behind (a shim exiting, a network namespace's cleanup) lands on whichever runs
// next, which shrinks a real difference towards 1 rather than favouring a side.
const (
	pairSlice  = 200 * time.Millisecond
	stormWidth = 16 // the c16 variants
)

// sideOf returns the side of the k-th slice or batch of a round: 0110 0110... in odd rounds,
// 1001 1001... in even ones, so that neither side is always first after the wait for quiet.
func sideOf(k, round int) int { return ((k+1)/2 + round + 1) % 2 }

// variants are the PodSandboxStatus variants: in flight at once, and verbose (crictl inspectp).
var (
	variants = []struct {
		name        string
		concurrency int
		verbose     bool
	}{{"c1", 1, false}, {"c16", stormWidth, false}, {"c1-verbose", 1, true}, {"c16-verbose", stormWidth, true}}
	lifecycleWidths = []int{1, 8}
)

// quantile is the q-quantile of values (NaN for none).
func quantile(values []float64, q float64) float64 { return stats.Sample{Xs: values}.Quantile(q) }

// runPairs measures every pairing of the selected parts, status and lifecycle, round after round,
// the pairings in a rotating order.
func runPairs(ctx context.Context, s settings, rep *report) error {
	status := func(p pairing) bool { return slices.Contains(statusPairs, p) && s.selected("status") }
	lifecycle := func(p pairing) bool { return slices.Contains(lifecyclePairs, p) && s.selected("lifecycle") }
	var pairs []pairing
	for _, p := range slices.Concat(statusPairs, lifecyclePairs) {
		if (status(p) || lifecycle(p)) && !slices.Contains(pairs, p) {
			pairs = append(pairs, p)
		}
	}
	used := slices.DeleteFunc(configurations(), func(c configuration) bool {
		return !slices.ContainsFunc(pairs, func(p pairing) bool { return p.base == c.Key || p.config == c.Key })
	})
	if len(pairs) == 0 {
		return nil
	}
	return withInstances(ctx, s, used, s.Pods, func(instances map[string]*instance) error {
		for n := 1; n <= s.Repeats; n++ {
			for _, p := range rotated(pairs, n) {
				err := rep.measureRound(fmt.Sprintf("(%s) against (%s)", p.config, p.base), n, func(r *round) error {
					pr := &pairRun{round: r, pairing: p, sides: [2]*instance{instances[p.base], instances[p.config]}}
					return pr.run(ctx, status(p), lifecycle(p))
				})
				if err != nil {
					return err
				}
			}
		}
		return nil
	})
}

// pairRun is one round of a pairing.
type pairRun struct {
	*round
	pairing
	sides [2]*instance
}

func (pr *pairRun) run(ctx context.Context, status, lifecycle bool) (err error) {
	log.Printf("bench: round %d: (%s) against (%s)", pr.n, pr.config, pr.base)
	for _, in := range pr.sides {
		if err := in.h.Start(ctx); err != nil {
			return err
		}
		defer func() {
			if err != nil {
				err = fmt.Errorf("%w\n%s", err, in.h.LogTail(20))
			}
			err = errors.Join(err, in.stop())
		}()
		if err := in.startNetwork(ctx); err != nil {
			return err
		}
	}
	if status {
		err = pr.measureStatus(ctx)
	}
	for _, width := range lifecycleWidths {
		if lifecycle && err == nil {
			err = pr.measureLifecycle(ctx, width)
		}
	}
	return err
}

// measureStatus measures every variant on both sides, -duration each, pairSlice at a time.
func (pr *pairRun) measureStatus(ctx context.Context) error {
	for k := range 2 { // untimed: cold caches and connections after the start
		in := pr.sides[sideOf(k, pr.n)]
		if err := in.checkPods(ctx, in.pods); err != nil {
			return err
		}
		if _, err := load(ctx, stormWidth, 500*time.Millisecond, in.statusCall(false)); err != nil {
			return fmt.Errorf("(%s) warm-up: %w", in.c.Key, err)
		}
	}
	return pr.phase(ctx, "status", func() error {
		for _, v := range variants {
			var p50 [2][]float64
			calls := 0
			before, err := fetchHistograms(ctx, pr.sides[1].metrics)
			for k := range 2 * max(1, int(pr.s.Duration/pairSlice)) {
				if err != nil {
					break
				}
				side := sideOf(k, pr.n)
				var seconds []float64
				seconds, err = load(ctx, v.concurrency, pairSlice, pr.sides[side].statusCall(v.verbose))
				p50[side] = append(p50[side], quantile(seconds, 0.5))
				calls += len(seconds) * side
			}
			after, fetchErr := fetchHistograms(ctx, pr.sides[1].metrics)
			if err = errors.Join(err, fetchErr); err != nil {
				return fmt.Errorf("(%s) against (%s) %s: %w", pr.config, pr.base, v.name, err)
			}
			for j := range p50[0] {
				pr.pair("Status/"+v.name, pr.pairing, calls/len(p50[1]), p50[1][j], p50[0][j], secPerOp)
			}
			// The status plugins' calls per query (NRI's metrics, S8): the queries go through NRI.
			pr.add(fmt.Sprintf("PluginCalls/%s/config=%s", v.name, pr.config), calls,
				value(float64(after.since(before).pluginCalls("PodSandboxStatus"))/float64(calls), "calls/op"))
		}
		return nil
	})
}

// measureLifecycle starts -lifecycle-pods pods on each side in batches of width alternating
// between the sides, checks them, and removes them the same way.
func (pr *pairRun) measureLifecycle(ctx context.Context, width int) error {
	batches := (pr.s.LifecyclePods + width - 1) / width
	var ids [2][]string
	var run, remove [2][]float64 // each batch's median
	return pr.phase(ctx, fmt.Sprintf("lifecycle c%d", width), func() error {
		for k := range 2 * batches {
			side, from := sideOf(k, pr.n), k/2*width
			batch, seconds, err := pr.sides[side].startPods(ctx, min(width, pr.s.LifecyclePods-from), width,
				func(i int) string { return fmt.Sprintf("life-r%d-a%d-c%d-%03d", pr.n, pr.attempt, width, from+i) })
			ids[side], run[side] = append(ids[side], batch...), append(run[side], quantile(seconds, 0.5))
			if err != nil {
				return err // the instance's Close removes what is left
			}
		}
		for side, in := range pr.sides { // every pod works
			if err := in.checkPods(ctx, ids[side]); err != nil {
				return err
			}
		}
		for k := range 2 * batches {
			side, from := sideOf(k, pr.n), k/2*width
			batch := ids[side][from:min(from+width, len(ids[side]))] // each StopPodSandbox + RemovePodSandbox timed
			seconds, err := timeEach(len(batch), width, func(i int) error { return pr.sides[side].h.RemovePod(ctx, batch[i]) })
			if err != nil {
				return err
			}
			remove[side] = append(remove[side], quantile(seconds, 0.5))
		}
		for j := range batches {
			pr.pair(fmt.Sprintf("RunPodSandbox/c%d", width), pr.pairing, width, run[1][j], run[0][j], secPerOp)
			pr.pair(fmt.Sprintf("StopRemove/c%d", width), pr.pairing, width, remove[1][j], remove[0][j], secPerOp)
		}
		return nil
	})
}
