package plugin

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"

	"github.com/knext-dev/knext/internal/nribridge/config"
	"github.com/knext-dev/knext/internal/nribridge/firewall"
	"github.com/knext-dev/knext/internal/nribridge/hostport"
	"github.com/knext-dev/knext/internal/nribridge/store"
)

// packetFilter is what the plugin does to the host's packet filter for hostPorts and masquerade
// (firewall.NFT); a fake replaces it in tests that run without root.
type packetFilter interface {
	// Apply makes the plugin's nftables table hold exactly rs.
	Apply(rs *firewall.Ruleset) error
}

// publishHostPorts claims the ports the pod publishes and installs their rules. The claim fails,
// naming the holder, when another pod holds one of the ports. Pods without host ports cost
// nothing here.
func (a *activeConfig) publishHostPorts(alloc *store.Allocation, ports []hostport.Mapping) error {
	if len(ports) == 0 {
		return nil
	}
	a.firewallMu.Lock()
	defer a.firewallMu.Unlock()
	created, err := a.store.ClaimHostPorts(alloc.Pod, ports)
	if err != nil {
		return err
	}
	err = a.applyRulesetLocked()
	// A new claim goes with its failure, so that the caller's undo needs no working firewall
	// (rules a failed apply may have left are gone with the next one); a replayed claim stays,
	// as the rest of the pod's network does.
	if err != nil && created {
		if releaseErr := a.store.ReleaseHostPorts(alloc.Pod.ID); releaseErr != nil {
			err = errors.Join(err, releaseErr)
		}
	}
	return err
}

// unpublishHostPorts removes the pods' rules (in one rebuild of the table), then their claims: a
// rule never outlives the claim that the next Synchronize would rebuild it from.
func (a *activeConfig) unpublishHostPorts(podIDs ...string) error {
	a.firewallMu.Lock()
	defer a.firewallMu.Unlock()
	var holders []string
	for _, id := range podIDs {
		held, err := a.store.HostPortsOf(id)
		if err != nil {
			return err
		}
		if held != nil {
			holders = append(holders, id)
		}
	}
	if len(holders) == 0 {
		return nil
	}
	if err := a.applyRulesetLocked(holders...); err != nil {
		return err
	}
	for _, id := range holders {
		if err := a.store.ReleaseHostPorts(id); err != nil {
			return err
		}
	}
	return nil
}

// podIDs are the IDs of the allocations' pods.
func podIDs(allocs []*store.Allocation) []string {
	ids := make([]string, 0, len(allocs))
	for _, alloc := range allocs {
		ids = append(ids, alloc.Pod.ID)
	}
	return ids
}

// applyRulesetLocked builds the table from the store, leaving out the pods without, and applies
// it. The caller holds firewallMu, so that the table never goes back to an older state of the
// store.
func (a *activeConfig) applyRulesetLocked(without ...string) error {
	allocs, err := a.store.List()
	if err != nil {
		return err
	}
	held, err := a.store.AllHostPorts()
	if err != nil {
		return err
	}
	var pods []firewall.PublishedPod
	for _, alloc := range allocs {
		if ports := held[alloc.Pod.ID]; ports != nil && !slices.Contains(without, alloc.Pod.ID) {
			pods = append(pods, firewall.PublishedPod{Pod: alloc.Pod, Addrs: alloc.Addrs, Ports: ports.Ports})
		}
	}
	var nodesPodCIDRs []netip.Prefix
	if a.nodesPodCIDRs != nil {
		nodesPodCIDRs = a.nodesPodCIDRs()
	}
	return a.firewall.Apply(firewall.Build(a.settings, pods, nodesPodCIDRs))
}

// nodesChanged rebuilds the table with the other nodes' pod CIDRs when they changed (cluster
// mode): pod traffic to them is not masqueraded.
func (p *plugin) nodesChanged() {
	a := p.active.Load()
	if a == nil || !a.settings.Masquerade {
		return
	}
	a.firewallMu.Lock()
	defer a.firewallMu.Unlock()
	if err := a.applyRulesetLocked(); err != nil {
		log.Errorf(context.Background(), "nri-bridge: the other nodes' pod CIDRs changed: rebuilding the nftables table: %v", err)
	}
}

// syncHostPorts reconciles the hostPorts with the pods the runtime lists, after Synchronize
// released the pods that are gone: a listed pod that has an allocation but no claim (started by
// an nri-bridge without hostPort support) gets its ports claimed, a claim without allocation is
// dropped, and the table is rebuilt from the store, whatever happened to it meanwhile. Failures
// are logged: failing Synchronize would disconnect the plugin and leave every pod without status.
func (a *activeConfig) syncHostPorts(ctx context.Context, listed []podWithPorts) {
	a.firewallMu.Lock()
	defer a.firewallMu.Unlock()
	allocs, err := a.store.List()
	if err != nil {
		log.Errorf(ctx, "nri-bridge: synchronize hostPorts: %v", err)
		return
	}
	held, err := a.store.AllHostPorts()
	if err != nil {
		log.Errorf(ctx, "nri-bridge: synchronize hostPorts: %v", err)
		return
	}
	allocated := map[string]*store.Allocation{}
	for _, alloc := range allocs {
		allocated[alloc.Pod.ID] = alloc
	}
	for id, ports := range held {
		if allocated[id] == nil {
			if err := a.store.ReleaseHostPorts(id); err != nil {
				log.Errorf(ctx, "nri-bridge: synchronize: releasing the hostPorts of %s: %v", ports.Pod, err)
			}
		}
	}
	for _, pod := range listed {
		alloc := allocated[pod.ref.ID]
		if alloc == nil || held[pod.ref.ID] != nil {
			continue
		}
		ports, err := publishedPortsOf(a.settings, pod.ports)
		if err == nil && len(ports) > 0 {
			_, err = a.store.ClaimHostPorts(alloc.Pod, ports)
		}
		if err != nil {
			log.Errorf(ctx, "nri-bridge: synchronize: %s: %v", pod.ref, err)
		}
	}
	if err := a.applyRulesetLocked(); err != nil {
		log.Errorf(ctx, "nri-bridge: synchronize: %v", err)
	}
}

// podWithPorts is a pod as the runtime lists it, with its port mappings.
type podWithPorts struct {
	ref   store.PodRef
	ports []hostport.Mapping
}

// publishedPortsOf validates the ports a pod publishes against the configuration. On a secondary
// interface a pod publishes none: its hostPorts are the pod network's (CNI's portmap).
func publishedPortsOf(s *config.Settings, mappings []hostport.Mapping) ([]hostport.Mapping, error) {
	if s.Secondary() {
		return nil, nil
	}
	ports, err := hostport.Published(mappings, s.HasFamily(true), s.HasFamily(false))
	if err != nil {
		return nil, fmt.Errorf("port mappings: %w", err)
	}
	return ports, nil
}
