package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log"
	"path/filepath"
	"slices"
	"time"

	bolt "go.etcd.io/bbolt"
	criruntime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/knext-dev/knext/internal/harness"
)

// scaleConfigs are the configurations of the scale part: upstream, knext with a status plugin
// (its last known answers persisted per pod, C4), knext CNI-less, and the A/A pair.
var (
	scaleConfigs = []string{cfgUpstream, cfgOnePlugin, cfgCNILess, cfgUpstreamAgain}
	scalePairs   = []pairing{{cfgUpstream, cfgOnePlugin}, {cfgUpstream, cfgCNILess}, aaPair}
)

func runScale(ctx context.Context, s settings, configs []configuration, rep *report) error {
	configs = slices.DeleteFunc(slices.Clone(configs), func(c configuration) bool { return !slices.Contains(scaleConfigs, c.Key) })
	return withInstances(ctx, s, configs, s.ScalePods, func(instances map[string]*instance) error {
		for n := 1; n <= s.Repeats; n++ {
			err := rep.measureRound(ctx, "scale", n, func(r *round) error {
				samples := map[string]scaleSample{}
				for _, c := range rotated(configs, n) {
					in := instances[c.Key]
					if err := r.phase(ctx, "scale "+c.Key, func() (err error) { samples[c.Key], err = in.measureScale(ctx); return err }); err != nil {
						return fmt.Errorf("configuration %s: %w\n%s", c.Key, err, in.h.LogTail(20))
					}
				}
				for _, p := range scalePairs {
					if sample, ok := samples[p.config]; ok {
						up := samples[p.base]
						r.pair("ScaleSweep", p, s.ScalePods, sample.sweep, up.sweep, secPerOp)
						r.pair("ScaleSweepP50", p, s.ScalePods, sample.sweepP50, up.sweepP50, secPerOp)
						r.pair("RestartReady", p, s.ScalePods, sample.ready, up.ready, secPerOp)
						r.pair("RestartAnswered", p, s.ScalePods, sample.answered, up.answered, secPerOp)
					}
				}
				return nil
			})
			if err != nil {
				return err
			}
		}
		for _, c := range configs {
			p, err := instances[c.Key].persistedBytes()
			if err != nil {
				return fmt.Errorf("scale: configuration %s: %w", c.Key, err)
			}
			rep.Results = append(rep.Results, p)
		}
		return nil
	})
}

// scaleSample is one restart of a configuration with -scale-pods pods, in seconds: the sweep
// (PodSandboxStatus of every pod one after the other, as a restarted kubelet asks) and its
// median query, and from SIGTERM to the daemon until CRI answers again and until every pod has
// answered READY with its IPs.
type scaleSample struct{ sweep, sweepP50, ready, answered float64 }

// waitAnswered queries the pods, pending ones again and again, until each has answered READY with
// its IPs (an IP of every status plugin).
func (in *instance) waitAnswered(ctx context.Context) error {
	pending := slices.Clone(in.pods)
	return harness.Poll(ctx, 2*time.Minute, 10*time.Millisecond, func() error {
		var last error
		pending = slices.DeleteFunc(pending, func(id string) bool {
			err := in.checkPod(ctx, id)
			last = cmp.Or(err, last)
			return err == nil
		})
		return last
	})
}

// measureScale sweeps every pod's status once, then restarts the daemon and waits until every pod
// answers again.
func (in *instance) measureScale(ctx context.Context) (_ scaleSample, err error) {
	var sample scaleSample
	if err := in.h.Start(ctx); err != nil {
		return sample, err
	}
	defer func() { err = errors.Join(err, in.stop()) }()
	if err := in.startNetwork(ctx); err != nil {
		return sample, err
	}
	if err := in.waitAnswered(ctx); err != nil { // C4: every answer persisted before the restart
		return sample, err
	}
	var latencies []float64
	start := time.Now()
	for _, id := range in.pods {
		t := time.Now()
		if _, err := in.h.Runtime.PodSandboxStatus(ctx, &criruntime.PodSandboxStatusRequest{PodSandboxId: id}); err != nil {
			return sample, err
		}
		latencies = append(latencies, time.Since(t).Seconds())
	}
	sample.sweep, sample.sweepP50 = time.Since(start).Seconds(), quantile(latencies, 0.5)

	// nri-bridge reconnects by itself; a status plugin exits with its connection and is started
	// again, as a service manager would, and the pods are queried at once, without waiting for it.
	start = time.Now()
	if err := errors.Join(in.h.Stop(), in.h.Start(ctx)); err != nil {
		return sample, err
	}
	sample.ready = time.Since(start).Seconds()
	for _, p := range in.plugins { // exited: reaped, to be started again
		if err := p.proc.Stop(); err != nil {
			return sample, err
		}
	}
	in.plugins = nil
	if err := in.launchPlugins(); err != nil {
		return sample, err
	}
	if err := in.waitAnswered(ctx); err != nil {
		return sample, err
	}
	sample.answered = time.Since(start).Seconds()
	log.Printf("bench: scale %s: sweep %.1f ms; restart: CRI after %.2f s, every pod answered after %.2f s",
		in.c.Key, 1e3*sample.sweep, sample.ready, sample.answered)
	return sample, in.waitSynchronized(ctx) // untimed, before they are stopped
}

// persistedBytes reads what the stopped daemon and nri-bridge stored per pod (median over the
// pods), as a benchmark line: its sandbox record in containerd's meta.db, of which knext's last
// known NRI answers (the extension nri-network), and nri-bridge's whole store divided by the pods.
func (in *instance) persistedBytes() (string, error) {
	var sandbox, nri []float64
	err := readBolt(filepath.Join(in.h.Root, "root", "io.containerd.metadata.v1.bolt", "meta.db"), func(tx *bolt.Tx) error {
		sandboxes := tx.Bucket([]byte("v1")).Bucket([]byte(harness.Namespace)).Bucket([]byte("sandboxes"))
		for _, id := range in.pods {
			sb := sandboxes.Bucket([]byte(id))
			if sb == nil {
				return fmt.Errorf("pod %s has no sandbox record", id)
			}
			extension := 0
			if ext := sb.Bucket([]byte("extensions")); ext != nil && ext.Get([]byte("nri-network")) != nil {
				extension = len("nri-network") + len(ext.Get([]byte("nri-network")))
			}
			sandbox, nri = append(sandbox, float64(bucketBytes(sb))), append(nri, float64(extension))
		}
		return nil
	})
	bridge := 0.0
	if err == nil && in.c.bridged() {
		err = readBolt(filepath.Join(in.h.NRIBridgeStateDir(), "allocations.db"), func(tx *bolt.Tx) error {
			return tx.ForEach(func(_ []byte, b *bolt.Bucket) error {
				bridge += float64(bucketBytes(b)) / float64(len(in.pods))
				return nil
			})
		})
	}
	return benchLine("StoredBytes/config="+in.c.Key, len(in.pods), value(quantile(sandbox, 0.5), "B/pod"),
		value(quantile(nri, 0.5), "nri-network-B/pod"), value(bridge, "nri-bridge-B/pod")), err
}

func readBolt(path string, fn func(*bolt.Tx) error) error {
	db, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true, Timeout: 5 * time.Second})
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	defer db.Close()
	return db.View(fn)
}

// bucketBytes is the size of every key and value under b.
func bucketBytes(b *bolt.Bucket) int {
	n := 0
	_ = b.ForEach(func(k, v []byte) error {
		n += len(k) + len(v)
		if v == nil {
			n += bucketBytes(b.Bucket(k))
		}
		return nil
	})
	return n
}
