package bench

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

	"github.com/knext-dev/knext/internal/stack"
)

// scaleConfigs are the configurations of the scale part: upstream, knext with a status plugin
// (its last known answers persisted per pod, C4), knext CNI-less.
var scaleConfigs = []string{cfgUpstream, cfgOnePlugin, cfgCNILess}

// ScaleSample is one restart of a configuration with -scale-pods pods.
type ScaleSample struct {
	Config string `json:"config"`
	Round  int    `json:"round"`
	// SweepMs is PodSandboxStatus of every pod one after the other, as a restarted kubelet asks.
	SweepMs    float64 `json:"sweepMs"`
	SweepP50Ms float64 `json:"sweepP50Ms"`
	// From SIGTERM to the daemon until CRI answers again, and until every pod has answered READY
	// with its IPs.
	ReadySeconds    float64 `json:"readySeconds"`
	AnsweredSeconds float64 `json:"answeredSeconds"`
}

// PersistedBytes is what a configuration stores per pod (median over the pods): its sandbox
// record in containerd's meta.db, of which knext's last known NRI answers (the extension
// nri-network), and nri-bridge's whole store divided by the pods.
type PersistedBytes struct {
	Config        string  `json:"config"`
	SandboxRecord float64 `json:"sandboxRecord"`
	NRINetwork    float64 `json:"nriNetwork"`
	Bridge        float64 `json:"nriBridge,omitempty"`
}

func runScale(ctx context.Context, s settings, configs []configuration, r *report) error {
	configs = slices.DeleteFunc(slices.Clone(configs), func(c configuration) bool { return !slices.Contains(scaleConfigs, c.Key) })
	return withInstances(ctx, s, configs, s.ScalePods, func(instances []*instance) error {
		for round := 1; round <= s.ScaleRepeats; round++ {
			for _, in := range rotated(instances, round) {
				sample, err := in.measureScale(ctx, round)
				if err != nil {
					return fmt.Errorf("scale: configuration %s, round %d: %w\n%s", in.c.Key, round, err, in.h.LogTail(20))
				}
				r.Scale = append(r.Scale, sample)
			}
		}
		for _, in := range instances {
			p, err := in.persistedBytes()
			if err != nil {
				return fmt.Errorf("scale: configuration %s: %w", in.c.Key, err)
			}
			r.Persisted = append(r.Persisted, p)
		}
		return nil
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

// measureScale sweeps every pod's status once, then restarts the daemon and waits until every pod
// answers again.
func (in *instance) measureScale(ctx context.Context, round int) (_ ScaleSample, err error) {
	sample := ScaleSample{Config: in.c.Key, Round: round}
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
		latencies = append(latencies, msSince(t))
	}
	sample.SweepMs, sample.SweepP50Ms = msSince(start), percentile(latencies, 0.5)

	// nri-bridge reconnects by itself; a status plugin exits with its connection and is started
	// again, as a service manager would, and the pods are queried at once, without waiting for it.
	start = time.Now()
	if err := errors.Join(in.h.Stop(), in.h.Start(ctx)); err != nil {
		return sample, err
	}
	sample.ReadySeconds = time.Since(start).Seconds()
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
	sample.AnsweredSeconds = time.Since(start).Seconds()
	if err := in.waitSynchronized(ctx); err != nil { // untimed, before they are stopped
		return sample, err
	}
	log.Printf("bench: scale %s round %d: sweep %.1f ms; restart: CRI after %.2f s, every pod answered after %.2f s",
		in.c.Key, round, sample.SweepMs, sample.ReadySeconds, sample.AnsweredSeconds)
	return sample, nil
}

// persistedBytes reads what the stopped daemon and nri-bridge stored per pod.
func (in *instance) persistedBytes() (PersistedBytes, error) {
	p := PersistedBytes{Config: in.c.Key}
	var sandbox, nri []float64
	err := readBolt(filepath.Join(in.h.Root, "root", "io.containerd.metadata.v1.bolt", "meta.db"), func(tx *bolt.Tx) error {
		sandboxes := tx.Bucket([]byte("v1")).Bucket([]byte(stack.Namespace)).Bucket([]byte("sandboxes"))
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
	p.SandboxRecord, p.NRINetwork = percentile(sandbox, 0.5), percentile(nri, 0.5)
	if err == nil && in.c.bridged() {
		err = readBolt(filepath.Join(in.h.NRIBridgeStateDir(), "allocations.db"), func(tx *bolt.Tx) error {
			return tx.ForEach(func(_ []byte, b *bolt.Bucket) error {
				p.Bridge += float64(bucketBytes(b)) / float64(len(in.pods))
				return nil
			})
		})
	}
	return p, err
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
