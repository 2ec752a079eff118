package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	bolt "go.etcd.io/bbolt"
	criruntime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/knext-dev/knext/internal/harness"
)

// scaleConfigs are the configurations of the scale measurements: upstream, knext with one status
// plugin (last known answers persisted per pod), knext CNI-less.
var scaleConfigs = []string{cfgUpstream, cfgOnePlugin, cfgCNILess}

// ScaleSample is one restart of a configuration with -scale-pods pods.
type ScaleSample struct {
	Config string `json:"config"`
	Round  int    `json:"round"`
	Pods   int    `json:"pods"`
	// SweepMs is PodSandboxStatus of every pod, one after the other, as a restarted kubelet does,
	// with the daemon and its plugins up: total, and per call.
	SweepMs    float64 `json:"sweepMs"`
	SweepP50Ms float64 `json:"sweepP50Ms"`
	SweepP99Ms float64 `json:"sweepP99Ms"`
	// Restart: from stopping the daemon (SIGTERM) until CRI answers again (ReadySeconds) and until
	// every pod has answered PodSandboxStatus READY with its IPs (AnsweredSeconds).
	ReadySeconds    float64 `json:"readySeconds"`
	AnsweredSeconds float64 `json:"answeredSeconds"`
	StatusCalls     int     `json:"statusCalls"` // queries until every pod had answered
}

// PersistedBytes is what a configuration keeps on disk per pod (medians over its pods).
type PersistedBytes struct {
	Config string `json:"config"`
	Pods   int    `json:"pods"`
	// SandboxRecord is the pod's record in containerd's sandbox store (meta.db
	// v1/k8s.io/sandboxes/<id>: keys and values), ContainerRecord its pause container's.
	SandboxRecord   float64 `json:"sandboxRecord"`
	ContainerRecord float64 `json:"containerRecord"`
	// NRINetwork is the part of the sandbox record knext adds: the last known NRI answers in the
	// sandbox extension "nri-network".
	NRINetwork float64 `json:"nriNetwork"`
	// BridgeRecord is nri-bridge's allocation of the pod (allocations.db: keys and values).
	BridgeRecord float64 `json:"bridgeRecord,omitempty"`
	Error        string  `json:"error,omitempty"`
}

// runScale creates the scale configurations' instances with -scale-pods pods each, primes them
// (every pod queried once with its plugins up, so that knext has persisted their last known
// answers), measures -scale-repeats restarts of each, in a rotating order, and reads what each
// persisted per pod.
func runScale(ctx context.Context, s settings, configs []configuration, report *report) (err error) {
	var instances []*instance
	defer func() {
		for _, in := range instances {
			err = errors.Join(err, in.close())
		}
	}()
	for _, c := range configs {
		if !slices.Contains(scaleConfigs, c.Key) {
			continue
		}
		in, err := newInstance(ctx, s, c, s.ScalePods)
		if in != nil {
			instances = append(instances, in)
		}
		if err != nil {
			return fmt.Errorf("scale: %w", err)
		}
		if err := in.withNetwork(ctx, func(plugins []*runningPlugin) error { return in.waitAnswered(ctx, plugins, nil) }); err != nil {
			return fmt.Errorf("scale: configuration %s: priming: %w", c.Key, err)
		}
	}
	if len(instances) == 0 {
		return nil
	}
	for r := range s.ScaleRepeats {
		for _, in := range rotate(instances, r) {
			sample, err := in.measureScale(ctx, r+1)
			if err != nil {
				return fmt.Errorf("scale: configuration %s, round %d: %w", in.c.Key, r+1, err)
			}
			report.Scale = append(report.Scale, sample)
		}
	}
	for _, in := range instances {
		report.Persisted = append(report.Persisted, in.persistedBytes())
	}
	return nil
}

// withNetwork starts the daemon and what provides the pods' IPs besides CNI (nri-bridge, status
// plugins), runs fn, and stops them.
func (in *instance) withNetwork(ctx context.Context, fn func([]*runningPlugin) error) (err error) {
	if err := in.h.Start(ctx); err != nil {
		return err
	}
	defer func() { err = errors.Join(err, in.h.Stop()) }()
	return in.withNetworkPlugins(ctx, fn)
}

// withNetworkPlugins starts what provides the pods' IPs besides CNI (nri-bridge, status plugins)
// on the running daemon, runs fn, and stops them.
func (in *instance) withNetworkPlugins(ctx context.Context, fn func([]*runningPlugin) error) (err error) {
	stop, plugins, err := in.startNetwork(ctx)
	defer func() { err = errors.Join(err, stop()) }()
	if err != nil {
		return err
	}
	return fn(plugins)
}

// startNetwork starts nri-bridge or the status plugins, and returns their stop function (to be
// called also on error). A CNI-less configuration's network is ready when they return.
func (in *instance) startNetwork(ctx context.Context) (stop func() error, plugins []*runningPlugin, err error) {
	if in.c.bridged() {
		bridge, err := in.startBridge(ctx)
		return func() error {
			if bridge == nil {
				return nil
			}
			return bridge.Stop()
		}, nil, err
	}
	plugins, err = in.startPlugins(ctx)
	stop = func() error {
		var errs []error
		for _, p := range plugins {
			errs = append(errs, p.proc.Stop())
		}
		return errors.Join(errs...)
	}
	if err == nil && in.c.CNILess {
		procs := make([]*harness.Process, len(plugins))
		for i, p := range plugins {
			procs[i] = p.proc
		}
		err = in.h.WaitNetworkReady(ctx, true, harness.NetworkReadyTimeout, procs...)
	}
	return stop, plugins, err
}

// waitAnswered queries the pods, pending ones again and again, until each has answered READY with
// its IPs (an IP of every plugin); it counts the queries in calls (if not nil).
func (in *instance) waitAnswered(ctx context.Context, plugins []*runningPlugin, calls *int) error {
	pending := slices.Clone(in.pods)
	deadline := time.Now().Add(2 * time.Minute)
	for {
		var still []string
		var last error
		for _, id := range pending {
			if calls != nil {
				*calls++
			}
			if err := in.checkPod(ctx, id, false, plugins); err != nil {
				still, last = append(still, id), err
			}
		}
		if pending = still; len(pending) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d of %d pods still without an answer after 2 minutes, last: %w", len(pending), len(in.pods), last)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// measureScale starts the configuration, sweeps every pod's status once, then restarts the
// daemon and measures until every pod answers again.
func (in *instance) measureScale(ctx context.Context, round int) (ScaleSample, error) {
	log.Printf("bench: scale round %d, configuration %s: %d pods", round, in.c.Key, len(in.pods))
	sample := ScaleSample{Config: in.c.Key, Round: round, Pods: len(in.pods)}
	err := in.withNetwork(ctx, func(plugins []*runningPlugin) error {
		if err := in.waitAnswered(ctx, plugins, nil); err != nil {
			return err
		}
		// A restarted kubelet: every pod's status, one after the other.
		latencies := make([]time.Duration, 0, len(in.pods))
		start := time.Now()
		for _, id := range in.pods {
			t := time.Now()
			if _, err := in.h.Runtime.PodSandboxStatus(ctx, &criruntime.PodSandboxStatusRequest{PodSandboxId: id}); err != nil {
				return fmt.Errorf("status of pod %s: %w", id, err)
			}
			latencies = append(latencies, time.Since(t))
		}
		sample.SweepMs = ms(time.Since(start))
		sample.SweepP50Ms, sample.SweepP99Ms = percentileMs(latencies, 0.5), percentileMs(latencies, 0.99)

		// A restarted containerd: its network plugins come back on their own (nri-bridge
		// reconnects; a status plugin is restarted as a service manager would).
		start = time.Now()
		if err := in.h.Stop(); err != nil {
			return err
		}
		if err := in.h.Start(ctx); err != nil {
			return err
		}
		sample.ReadySeconds = time.Since(start).Seconds()
		// The status plugin exited with its connection: it is started again, and the pods are
		// queried at once, without waiting for it.
		restarted, err := in.launchPlugins()
		defer func() {
			for _, p := range restarted {
				p.proc.Stop()
			}
		}()
		if err != nil {
			return err
		}
		if err := in.waitAnswered(ctx, restarted, &sample.StatusCalls); err != nil {
			return err
		}
		sample.AnsweredSeconds = time.Since(start).Seconds()
		for _, p := range restarted { // before it is stopped, untimed
			if err := in.waitSynchronized(ctx, p); err != nil {
				return err
			}
		}
		return nil
	})
	log.Printf("bench:   sweep of %d pods %.1f ms (p50 %.3f ms, p99 %.3f ms); restart: CRI ready after %.2f s, every pod answered after %.2f s",
		len(in.pods), sample.SweepMs, sample.SweepP50Ms, sample.SweepP99Ms, sample.ReadySeconds, sample.AnsweredSeconds)
	return sample, err
}

// persistedBytes reads what the instance's stopped daemon (and nri-bridge) persisted per pod.
func (in *instance) persistedBytes() PersistedBytes {
	p := PersistedBytes{Config: in.c.Key, Pods: len(in.pods)}
	meta := filepath.Join(in.h.Root, "root", "io.containerd.metadata.v1.bolt", "meta.db")
	var sandbox, container, nri []float64
	err := readBolt(meta, func(tx *bolt.Tx) error {
		ns := tx.Bucket([]byte("v1")).Bucket([]byte(harness.Namespace))
		if ns == nil {
			return fmt.Errorf("no namespace %s", harness.Namespace)
		}
		for _, id := range in.pods {
			sb := ns.Bucket([]byte("sandboxes")).Bucket([]byte(id))
			ct := ns.Bucket([]byte("containers")).Bucket([]byte(id))
			if sb == nil || ct == nil {
				return fmt.Errorf("pod %s has no sandbox or container record", id)
			}
			sandbox, container = append(sandbox, float64(bucketBytes(sb))), append(container, float64(bucketBytes(ct)))
			nri = append(nri, float64(nriNetworkBytes(sb)))
		}
		return nil
	})
	if err == nil && in.c.bridged() {
		var bridge []float64
		err = readBolt(filepath.Join(in.h.NRIBridgeStateDir(), "allocations.db"), func(tx *bolt.Tx) error {
			for _, id := range in.pods {
				record := tx.Bucket([]byte("pods")).Get([]byte(id))
				if record == nil {
					return fmt.Errorf("nri-bridge has no allocation of pod %s", id)
				}
				var alloc struct{ Addrs []string }
				if err := json.Unmarshal(record, &alloc); err != nil {
					return err
				}
				n := len(id) + len(record)
				for _, addr := range alloc.Addrs { // addrs bucket: address -> pod ID
					ip, _, _ := strings.Cut(addr, "/")
					n += len(ip) + len(id)
				}
				bridge = append(bridge, float64(n))
			}
			return nil
		})
		p.BridgeRecord = median(bridge)
	}
	if err != nil {
		p.Error = err.Error()
	}
	p.SandboxRecord, p.ContainerRecord, p.NRINetwork = median(sandbox), median(container), median(nri)
	return p
}

func median(values []float64) float64 {
	if s := spread(values); s != nil {
		return s.Median
	}
	return 0
}

func readBolt(path string, fn func(*bolt.Tx) error) error {
	if _, err := os.Stat(path); err != nil {
		return err
	}
	db, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true, Timeout: 5 * time.Second})
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	defer db.Close()
	if err := db.View(fn); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}

// bucketBytes is the size of every key and value under b.
func bucketBytes(b *bolt.Bucket) int {
	n := 0
	b.ForEach(func(k, v []byte) error {
		n += len(k)
		if v == nil {
			n += bucketBytes(b.Bucket(k))
		} else {
			n += len(v)
		}
		return nil
	})
	return n
}

// nriNetworkBytes is the size of the sandbox record's "nri-network" extension (key and value),
// where knext keeps the pod's last known NRI answers: what knext adds to the record (0 without).
func nriNetworkBytes(sandbox *bolt.Bucket) int {
	const key = "nri-network"
	ext := sandbox.Bucket([]byte("extensions"))
	if ext == nil {
		return 0
	}
	raw := ext.Get([]byte(key))
	if raw == nil {
		return 0
	}
	return len(key) + len(raw)
}

// ScaleSummary is one configuration's scale figures over the restarts.
type ScaleSummary struct {
	Config                string  `json:"config"`
	Pods                  int     `json:"pods"`
	SweepMs               *Spread `json:"sweepMs"`
	SweepP50Ms            *Spread `json:"sweepP50Ms"`
	SweepP99Ms            *Spread `json:"sweepP99Ms"`
	ReadySeconds          *Spread `json:"readySeconds"`
	AnsweredSeconds       *Spread `json:"answeredSeconds"`
	SweepRatioToA         *Spread `json:"sweepRatioToA"`
	AnsweredRatioToA      *Spread `json:"answeredRatioToA"`
	StatusCallsUntilFresh *Spread `json:"statusCallsUntilAnswered"`
}

func (r *report) scaleSummaries() []ScaleSummary {
	perRound := func(key string, field func(ScaleSample) float64) map[int]float64 {
		values := map[int]float64{}
		for _, s := range r.Scale {
			if s.Config == key {
				values[s.Round] = field(s)
			}
		}
		return values
	}
	sweep := func(s ScaleSample) float64 { return s.SweepMs }
	answered := func(s ScaleSample) float64 { return s.AnsweredSeconds }
	var out []ScaleSummary
	for _, key := range scaleConfigs {
		if len(perRound(key, sweep)) == 0 {
			continue
		}
		sum := ScaleSummary{Config: key, Pods: r.Settings.ScalePods,
			SweepMs:               spread(roundValues(perRound(key, sweep))),
			SweepP50Ms:            spread(roundValues(perRound(key, func(s ScaleSample) float64 { return s.SweepP50Ms }))),
			SweepP99Ms:            spread(roundValues(perRound(key, func(s ScaleSample) float64 { return s.SweepP99Ms }))),
			ReadySeconds:          spread(roundValues(perRound(key, func(s ScaleSample) float64 { return s.ReadySeconds }))),
			AnsweredSeconds:       spread(roundValues(perRound(key, answered))),
			SweepRatioToA:         spread(pairedRatios(perRound(key, sweep), perRound(cfgUpstream, sweep))),
			AnsweredRatioToA:      spread(pairedRatios(perRound(key, answered), perRound(cfgUpstream, answered))),
			StatusCallsUntilFresh: spread(roundValues(perRound(key, func(s ScaleSample) float64 { return float64(s.StatusCalls) }))),
		}
		out = append(out, sum)
	}
	return out
}

func (r *report) printScale(out io.Writer) {
	if len(r.ScaleSummaries) == 0 {
		return
	}
	fmt.Fprintf(out, "\nScale: %d pods per configuration, %d restarts each, configurations alternating.\n", r.Settings.ScalePods, r.Settings.ScaleRepeats)
	fmt.Fprintln(out, "sweep: PodSandboxStatus of every pod, one after the other (a restarted kubelet), daemon and plugins up;")
	fmt.Fprintln(out, "restart: SIGTERM to the daemon until CRI is ready again, and until every pod has answered READY with its IPs.")
	w := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "cfg	sweep ms	sweep / (upstream)	per call p50 ms	p99 ms	restart: CRI ready s	every pod answered s	/ (upstream)	queries until then	")
	for _, s := range r.ScaleSummaries {
		fmt.Fprintf(w, "%s	%s	%s	%s	%s	%s	%s	%s	%s	\n", s.Config, cell(s.SweepMs, "%.1f"), cell(s.SweepRatioToA, "%.2f"),
			cell(s.SweepP50Ms, "%.3f"), cell(s.SweepP99Ms, "%.3f"), cell(s.ReadySeconds, "%.2f"), cell(s.AnsweredSeconds, "%.2f"),
			cell(s.AnsweredRatioToA, "%.2f"), cell(s.StatusCallsUntilFresh, "%.0f"))
	}
	w.Flush()
	fmt.Fprintln(out, "\nPersisted per pod (median over the pods, bytes of keys and values):")
	w = tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "cfg	sandbox record (meta.db)	of which knext's last known NRI answer	pause container record	nri-bridge allocation	")
	for _, p := range r.Persisted {
		bridge := "-"
		if p.BridgeRecord > 0 {
			bridge = fmt.Sprintf("%.0f", p.BridgeRecord)
		}
		line := fmt.Sprintf("%s\t%.0f\t%.0f\t%.0f\t%s\t", p.Config, p.SandboxRecord, p.NRINetwork, p.ContainerRecord, bridge)
		if p.Error != "" {
			line += " error: " + p.Error
		}
		fmt.Fprintln(w, line)
	}
	w.Flush()
}
