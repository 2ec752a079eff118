package bench

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log"
	"slices"
	"time"

	criruntime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/knext-dev/knext/internal/stack"
)

// scaleConfigs are the configurations of the scale part: upstream, knext with a status plugin
// (its last known answers persisted per pod, C4), knext CNI-less, and the A/A pair.
var (
	scaleConfigs = []string{cfgUpstream, cfgOnePlugin, cfgCNILess, cfgUpstreamAgain}
	scalePairs   = []pairing{{cfgUpstream, cfgOnePlugin}, {cfgUpstream, cfgCNILess}, aaPair}
)

func runScale(ctx context.Context, s settings, rep *report) error {
	configs := slices.DeleteFunc(configurations(), func(c configuration) bool { return !slices.Contains(scaleConfigs, c.Key) })
	return withInstances(ctx, s, configs, s.ScalePods, func(instances map[string]*instance) error {
		return rep.measureTurns("scale", scaleConfigs, scalePairs, s.ScalePods, func(r *round, key string) (f map[string]float64, err error) {
			in := instances[key]
			if err = r.phase(ctx, "scale "+key, func() (err error) { f, err = in.measureScale(ctx); return err }); err != nil {
				err = fmt.Errorf("%w\n%s", err, in.h.LogTail(20))
			}
			return f, err
		})
	})
}

// waitAnswered queries the pods, pending ones again and again, until each has answered READY with
// its IPs (an IP of every status plugin).
func (in *instance) waitAnswered(ctx context.Context) error {
	pending := slices.Clone(in.pods)
	return stack.Poll(ctx, 2*time.Minute, 10*time.Millisecond, func() error {
		var last error
		pending = slices.DeleteFunc(pending, func(id string) bool {
			err := in.checkPod(ctx, id)
			last = cmp.Or(err, last)
			return err == nil
		})
		return last
	})
}

// measureScale sweeps every pod's status once (ScaleSweep, as a restarted kubelet asks), then restarts the daemon: seconds from SIGTERM until CRI answers again
// (RestartReady) and until every pod has answered READY with its IPs (RestartAnswered).
func (in *instance) measureScale(ctx context.Context) (_ map[string]float64, err error) {
	f := map[string]float64{}
	if err := in.h.Start(ctx); err != nil {
		return f, err
	}
	defer func() { err = errors.Join(err, in.stop()) }()
	if err := in.startNetwork(ctx); err != nil {
		return f, err
	}
	if err := in.waitAnswered(ctx); err != nil { // C4: every answer persisted before the restart
		return f, err
	}
	start := time.Now()
	for _, id := range in.pods {
		if _, err := in.h.Runtime.PodSandboxStatus(ctx, &criruntime.PodSandboxStatusRequest{PodSandboxId: id}); err != nil {
			return f, err
		}
	}
	f["ScaleSweep"] = time.Since(start).Seconds()
	// nri-bridge reconnects by itself; a status plugin exits with its connection and is started
	// again, as a service manager would, and the pods are queried at once, without waiting for it.
	start = time.Now()
	if err := errors.Join(in.h.Stop(), in.h.Start(ctx)); err != nil {
		return f, err
	}
	f["RestartReady"] = time.Since(start).Seconds()
	for _, p := range in.plugins { // exited: reaped, to be started again
		if err := p.proc.Stop(); err != nil {
			return f, err
		}
	}
	in.plugins = nil
	if err := in.launchPlugins(); err != nil {
		return f, err
	}
	if err := in.waitAnswered(ctx); err != nil {
		return f, err
	}
	f["RestartAnswered"] = time.Since(start).Seconds()
	log.Printf("bench: scale %s: %v", in.c.Key, f)
	return f, in.waitSynchronized(ctx) // untimed, before they are stopped
}
