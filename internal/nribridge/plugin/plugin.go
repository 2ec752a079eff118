// Package plugin is nri-bridge's NRI plugin: it answers the runtime's pod events with the store,
// the wiring and the firewall, and runs pre-installed or standalone.
package plugin

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/containerd/nri/pkg/api"
	nrilog "github.com/containerd/nri/pkg/log"

	"github.com/knext-dev/knext/internal/nribridge/config"
	"github.com/knext-dev/knext/internal/nribridge/store"
	"github.com/knext-dev/knext/internal/nribridge/wiring"
)

// podNetwork is what the plugin does to the host and the pods' netns (wiring.Network); a fake
// replaces it in tests that run without root.
type podNetwork interface {
	Setup(*store.Allocation) error
	// SetHairpin puts the bridge port of a pod wired before in hairpin mode, as Setup does.
	SetHairpin(*store.Allocation) error
	// EnsureBridge sets the bridge up, its MAC address pinned, as Setup does for the first pod.
	EnsureBridge() error
	// Detach cuts the pod off the network at once and cheaply; Teardown then removes what
	// Setup created. Both do nothing when that is already gone.
	Detach(*store.Allocation) error
	Teardown(*store.Allocation) error
}

// plugin is the NRI plugin. Lifecycle events (run, stop, remove, synchronize) are serialized
// by lifecycleMu.
type plugin struct {
	flags       *config.Flags
	startupYAML []byte // the -config file, used when the runtime supplies no configuration
	// newNetwork checks the settings against the host and returns the network to use.
	newNetwork func(*config.Settings) (podNetwork, error)
	// newFirewall returns the packet filter for hostPorts and masquerade.
	newFirewall func(*config.Settings) packetFilter
	// cluster is set in cluster mode, before the plugin connects: the pod subnets are the
	// node's pod CIDRs.
	cluster *clusterNode
	// db is the store, opened by the first successful configure or, in cluster mode, before.
	db *store.Store

	active      atomic.Pointer[activeConfig]
	activateMu  sync.Mutex
	lifecycleMu sync.Mutex

	// releases are the stopped pods whose veth is being deleted and whose addresses are then
	// freed in the background, each with a channel closed when that is over.
	releasesMu sync.Mutex
	releases   map[string]chan struct{}
}

// clusterNode is what the plugin knows of its node in cluster mode.
type clusterNode struct {
	name     string
	podCIDRs []netip.Prefix
	// nodesPodCIDRs are the other nodes' pod CIDRs, as last known.
	nodesPodCIDRs func() []netip.Prefix
}

// activeConfig is the configuration in use with the store and network built from it.
type activeConfig struct {
	settings *config.Settings
	store    *store.Store
	net      podNetwork
	firewall packetFilter
	// nodesPodCIDRs are the other nodes' pod CIDRs (cluster mode; nil otherwise).
	nodesPodCIDRs func() []netip.Prefix
	// firewallMu serializes the changes of the hostPorts and of the table built from them.
	firewallMu sync.Mutex
}

var log = nrilog.Get()

// podNetNS is the path of the pod's network namespace, "" for host-network pods (and for pods
// whose netns the runtime already removed).
func podNetNS(pod *api.PodSandbox) string {
	for _, ns := range pod.GetLinux().GetNamespaces() {
		if ns.GetType() == "network" {
			return ns.GetPath()
		}
	}
	return ""
}

func refOf(pod *api.PodSandbox) store.PodRef {
	return store.PodRef{ID: pod.GetId(), Namespace: pod.GetNamespace(), Name: pod.GetName(), UID: pod.GetUid()}
}

// configure resolves, validates and activates a configuration document. The first successful
// call opens the store; later calls (reconnects) must bring the same configuration.
func (p *plugin) configure(yamlDoc []byte) error {
	s, network, err := p.prepare(yamlDoc)
	if err != nil {
		return err
	}

	p.activateMu.Lock()
	defer p.activateMu.Unlock()
	if current := p.active.Load(); current != nil {
		if !current.settings.Equal(s) {
			return errors.New("configuration differs from the one in use; restart nri-bridge to change it")
		}
		return nil
	}
	st, err := p.openStore(s.StateDir)
	if err != nil {
		return err
	}
	a := &activeConfig{settings: s, store: st, net: network, firewall: p.newFirewall(s)}
	mode := "file mode"
	if p.cluster != nil {
		a.nodesPodCIDRs = p.cluster.nodesPodCIDRs
		mode = "cluster mode, Node " + p.cluster.name
	}
	p.active.Store(a)
	log.Infof(context.Background(), "nri-bridge: %s: bridge %s, pools %v, MTU %d, masquerade %v (clusterCIDRs %v), state in %s, pod interface %s (secondary %v)",
		mode, s.Bridge, s.Pools, s.MTU, s.Masquerade, s.ClusterCIDRs, s.StateDir, s.PodInterface, s.Secondary())
	return nil
}

// openStore returns the store in dir, opening it the first time.
func (p *plugin) openStore(dir string) (*store.Store, error) {
	if p.db == nil {
		db, err := store.Open(dir)
		if err != nil {
			return nil, err
		}
		p.db = db
	}
	if p.db.Dir() != dir {
		return nil, fmt.Errorf("stateDir %s differs from the one in use, %s; restart nri-bridge to change it", dir, p.db.Dir())
	}
	return p.db, nil
}

// check validates a configuration document, against the host too, without activating it.
func (p *plugin) check(yamlDoc []byte) error {
	_, _, err := p.prepare(yamlDoc)
	return err
}

// prepare resolves a configuration document with the plugin's flags, validates it and checks
// it against the host.
func (p *plugin) prepare(yamlDoc []byte) (*config.Settings, podNetwork, error) {
	var s *config.Settings
	var err error
	if p.cluster != nil {
		s, err = config.LoadCluster(yamlDoc, p.flags, p.cluster.name, p.cluster.podCIDRs)
	} else {
		s, err = config.Load(yamlDoc, p.flags)
	}
	if err != nil {
		return nil, nil, err
	}
	network, err := p.newNetwork(s)
	if err != nil {
		return nil, nil, fmt.Errorf("invalid configuration: %w", err)
	}
	return s, network, nil
}

// close waits for the releases in flight and closes the store; the plugin is unusable afterwards.
func (p *plugin) close() error {
	p.waitReleases()
	if p.db == nil {
		return nil
	}
	db := p.db
	p.db = nil
	return db.Close()
}

// current returns the active configuration; NRI always configures a plugin before any event.
func (p *plugin) current() (*activeConfig, error) {
	a := p.active.Load()
	if a == nil {
		return nil, errors.New("nri-bridge is not configured yet")
	}
	return a, nil
}

// Configure is NRI's Configure request. runtimeConfig is the plugin's drop-in configuration
// (empty for plugins the runtime did not launch); it replaces the -config file.
func (p *plugin) Configure(ctx context.Context, runtimeConfig, runtime, version string) (api.EventMask, error) {
	doc := p.startupYAML
	if runtimeConfig != "" {
		doc = []byte(runtimeConfig)
	}
	if err := p.configure(doc); err != nil {
		return 0, fmt.Errorf("nri-bridge: %w", err)
	}
	log.Infof(ctx, "nri-bridge: configured by %s %s", runtime, version)
	return 0, nil // subscribe to every event the plugin implements
}

// Synchronize reconciles the store with the pods the runtime has: allocations of pods that are
// gone, and whose network namespace is gone too, are torn down and released; the nftables table
// is rebuilt from what stays; the bridge of the pods that stay is set up at once, so that an
// earlier nri-bridge's bridge gets its MAC address pinned before any of its pods goes.
func (p *plugin) Synchronize(ctx context.Context, pods []*api.PodSandbox, _ []*api.Container) ([]*api.ContainerUpdate, error) {
	a, err := p.current()
	if err != nil {
		return nil, err
	}
	p.lifecycleMu.Lock()
	defer p.lifecycleMu.Unlock()
	p.waitReleases() // reconcile what they leave

	live := map[string]bool{}
	var listed []podWithPorts
	for _, pod := range pods {
		if podNetNS(pod) != "" {
			live[pod.GetId()] = true
			listed = append(listed, podWithPorts{ref: refOf(pod), ports: portMappingsOf(pod)})
		}
	}
	allocs, err := a.store.List()
	if err != nil {
		return nil, fmt.Errorf("nri-bridge: synchronize: %w", err)
	}
	kept := 0
	var gone []*store.Allocation
	for _, alloc := range allocs {
		if live[alloc.Pod.ID] {
			kept++
			delete(live, alloc.Pod.ID)
			if err := a.net.SetHairpin(alloc); err != nil {
				log.Errorf(ctx, "nri-bridge: synchronize: %s: %v", alloc.Pod, err)
			}
			continue
		}
		// containerd leaves sandboxes it could not restore (state unknown) out of the list;
		// while the pod's network namespace exists, its address must not go to another pod.
		if _, err := os.Stat(alloc.NetNS); alloc.NetNS != "" && err == nil {
			log.Warnf(ctx, "nri-bridge: keeping %v of %s: the runtime did not list the pod, but its network namespace %s still exists",
				alloc.Addrs, alloc.Pod, alloc.NetNS)
			kept++
			continue
		}
		gone = append(gone, alloc)
	}
	if kept > 0 {
		if err := a.net.EnsureBridge(); err != nil {
			log.Errorf(ctx, "nri-bridge: synchronize: %v", err)
		}
	}
	// One rebuild of the nftables table for every pod that is gone, not one per pod.
	if err := a.unpublishHostPorts(podIDs(gone)...); err != nil {
		log.Errorf(ctx, "nri-bridge: synchronize: removing the hostPorts of the pods that are gone: %v", err)
	}
	for _, alloc := range gone {
		// A failed release keeps the allocation for the next Synchronize: failing here
		// would disconnect the plugin and leave every pod without status.
		if _, err := release(a, alloc); err != nil {
			log.Errorf(ctx, "nri-bridge: synchronize: %v", err)
			continue
		}
		log.Infof(ctx, "nri-bridge: released %v of %s: the pod is gone", alloc.Addrs, alloc.Pod)
	}
	a.syncHostPorts(ctx, listed)
	for _, pod := range pods {
		if live[pod.GetId()] {
			log.Warnf(ctx, "nri-bridge: %s has a network namespace but no allocation (started while the plugin was not connected?)",
				refOf(pod))
		}
	}
	log.Infof(ctx, "nri-bridge: synchronized: %d pods from the runtime, %d allocations kept", len(pods), kept)
	return nil, nil
}

// RunPodSandbox allocates the pod's addresses, persists them, then wires the pod, and reports
// the addresses (IPv4 first when both families are configured) in its answer: they are the pod's
// IPs for its lifetime, so the runtime never asks for them again (nri-bridge does not answer
// PodSandboxStatus). On a secondary interface it reports none: the pod's IPs are the pod
// network's. On failure everything this call did for the pod is undone, so a failed pod start
// leaks nothing.
func (p *plugin) RunPodSandbox(ctx context.Context, pod *api.PodSandbox) (*api.PodSandboxAdjustment, error) {
	a, err := p.current()
	if err != nil {
		return nil, err
	}
	ref := refOf(pod)
	nsPath := podNetNS(pod)
	if nsPath == "" {
		log.Debugf(ctx, "nri-bridge: %s has no network namespace (host network), nothing to do", ref)
		return nil, nil
	}
	ports, err := publishedPortsOf(a.settings, portMappingsOf(pod))
	if err != nil {
		return nil, fmt.Errorf("nri-bridge: %s: %w", ref, err)
	}
	p.lifecycleMu.Lock()
	defer p.lifecycleMu.Unlock()

	start := time.Now()
	alloc, created, err := a.store.Allocate(a.settings.Pools, ref, nsPath, wiring.HostVethName(ref.ID))
	if errors.As(err, new(*store.PoolExhaustedError)) && p.waitReleases() > 0 {
		// The addresses of stopped pods were on their way back.
		alloc, created, err = a.store.Allocate(a.settings.Pools, ref, nsPath, wiring.HostVethName(ref.ID))
	}
	if err != nil {
		return nil, fmt.Errorf("nri-bridge: %s: %w", ref, err)
	}
	stored := time.Now()
	err = a.net.Setup(alloc)
	if err == nil {
		err = a.publishHostPorts(alloc, ports)
	}
	if err != nil {
		// A failed replay leaves alone what an earlier, successful start set up.
		if created {
			if _, undoErr := release(a, alloc); undoErr != nil {
				log.Errorf(ctx, "nri-bridge: undoing failed setup: %v", undoErr)
			}
		}
		return nil, fmt.Errorf("nri-bridge: %s: %w", ref, err)
	}
	log.Infof(ctx, "nri-bridge: %s: %s %v via %s, hostPorts %v (%s)", ref, a.settings.PodInterface, alloc.Addrs,
		alloc.HostVeth, ports, timings{{"stored", stored.Sub(start)}, {"wired", time.Since(stored)}})
	if a.settings.Secondary() {
		return nil, nil
	}
	return &api.PodSandboxAdjustment{Network: &api.PodSandboxNetwork{Ips: addrsOf(alloc)}}, nil
}

// StopPodSandbox takes the pod off the network and removes its hostPorts, then deletes its veth
// and releases its addresses in the background.
func (p *plugin) StopPodSandbox(ctx context.Context, pod *api.PodSandbox) error {
	return p.removePod(ctx, pod)
}

// RemovePodSandbox does what StopPodSandbox does, for pods whose stop failed or never came.
func (p *plugin) RemovePodSandbox(ctx context.Context, pod *api.PodSandbox) error {
	return p.removePod(ctx, pod)
}

func (p *plugin) removePod(ctx context.Context, pod *api.PodSandbox) error {
	a, err := p.current()
	if err != nil {
		return err
	}
	p.lifecycleMu.Lock()
	defer p.lifecycleMu.Unlock()
	if p.releasing(pod.GetId()) {
		return nil
	}

	alloc, err := a.store.Get(pod.GetId())
	if err != nil {
		return fmt.Errorf("nri-bridge: %s: %w", refOf(pod), err)
	}
	if alloc == nil {
		return nil
	}
	start := time.Now()
	if err := a.net.Detach(alloc); err != nil {
		return fmt.Errorf("nri-bridge: %s: %w", alloc.Pod, err)
	}
	// The pod's hostPorts go now: another pod may claim them as soon as this one is stopped.
	if err := a.unpublishHostPorts(alloc.Pod.ID); err != nil {
		return fmt.Errorf("nri-bridge: %s: removing its hostPorts: %w", alloc.Pod, err)
	}
	p.releaseInBackground(a, alloc, time.Since(start))
	return nil
}

// releaseInBackground deletes the detached pod's veth, then frees its addresses, off the
// runtime's path: deleting a network device waits for RCU grace periods (tens of milliseconds
// on a busy host), and the runtime removes the pod's netns, which deletes the veth anyway. The
// addresses stay allocated until the veth is gone, so no other pod gets them early; a pod start
// that finds its pool exhausted waits for the releases in flight. A failed release keeps the
// allocation for the next remove or synchronize to retry.
func (p *plugin) releaseInBackground(a *activeConfig, alloc *store.Allocation, detached time.Duration) {
	done := make(chan struct{})
	p.releasesMu.Lock()
	if p.releases == nil {
		p.releases = map[string]chan struct{}{}
	}
	p.releases[alloc.Pod.ID] = done
	p.releasesMu.Unlock()
	go func() {
		defer func() {
			p.releasesMu.Lock()
			delete(p.releases, alloc.Pod.ID)
			p.releasesMu.Unlock()
			close(done)
		}()
		ctx := context.Background()
		took, err := release(a, alloc)
		if err != nil {
			log.Errorf(ctx, "nri-bridge: %v", err)
			return
		}
		log.Infof(ctx, "nri-bridge: %s: released %v (%s)", alloc.Pod, alloc.Addrs,
			append(timings{{"detached", detached}}, took...))
	}()
}

// releasing tells whether the pod's release is in flight.
func (p *plugin) releasing(podID string) bool {
	p.releasesMu.Lock()
	defer p.releasesMu.Unlock()
	return p.releases[podID] != nil
}

// waitReleases waits for the releases in flight and tells how many there were.
func (p *plugin) waitReleases() int {
	p.releasesMu.Lock()
	pending := make([]chan struct{}, 0, len(p.releases))
	for _, done := range p.releases {
		pending = append(pending, done)
	}
	p.releasesMu.Unlock()
	for _, done := range pending {
		<-done
	}
	return len(pending)
}

// release tears down the pod's veth and removes its hostPorts (if still there), then frees its
// addresses, and tells how long each step took. The allocation stays when the teardown fails, so
// that a later stop, remove or synchronize retries it.
func release(a *activeConfig, alloc *store.Allocation) (timings, error) {
	start := time.Now()
	if err := a.net.Teardown(alloc); err != nil {
		return nil, fmt.Errorf("%s: %w", alloc.Pod, err)
	}
	if err := a.unpublishHostPorts(alloc.Pod.ID); err != nil {
		return nil, fmt.Errorf("%s: removing its hostPorts: %w", alloc.Pod, err)
	}
	unwired := time.Now()
	if err := a.store.Release(alloc.Pod.ID); err != nil {
		return nil, fmt.Errorf("%s: %w", alloc.Pod, err)
	}
	return timings{{"unwired", unwired.Sub(start)}, {"released", time.Since(unwired)}}, nil
}

// timings are the durations of the steps of a pod's setup or teardown, logged with it
// ("stored 4.1ms, wired 2.3ms"), which is where the benchmark reads them from.
type timings []struct {
	step string
	took time.Duration
}

func (t timings) String() string {
	parts := make([]string, len(t))
	for i, s := range t {
		parts[i] = fmt.Sprintf("%s %s", s.step, s.took.Round(time.Microsecond))
	}
	return strings.Join(parts, ", ")
}

// addrsOf lists the allocation's addresses, in its order.
func addrsOf(alloc *store.Allocation) []string {
	ips := make([]string, 0, len(alloc.Addrs))
	for _, addr := range alloc.Addrs {
		ips = append(ips, addr.Addr().String())
	}
	return ips
}
