package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
)

// firewall is what the plugin does to the host's packet filter for hostPorts and masquerade; a
// fake replaces it in tests that run without root.
type firewall interface {
	// apply makes the plugin's nftables table hold exactly rs.
	apply(rs *ruleset) error
	// enableHairpin lets a pod reach itself through its hostPorts.
	enableHairpin(hostVeth string) error
}

// publishHostPorts claims the ports the pod publishes and installs their rules. The claim fails,
// naming the holder, when another pod holds one of the ports. Pods without host ports cost
// nothing here.
func (a *activeConfig) publishHostPorts(alloc *allocation, ports []portMapping) error {
	if len(ports) == 0 {
		return nil
	}
	a.firewallMu.Lock()
	defer a.firewallMu.Unlock()
	created, err := a.store.claimHostPorts(alloc.Pod, ports)
	if err != nil {
		return err
	}
	err = a.firewall.enableHairpin(alloc.HostVeth)
	if err == nil {
		err = a.applyRulesetLocked()
	}
	// A new claim goes with its failure, so that the caller's undo needs no working firewall
	// (rules a failed apply may have left are gone with the next one); a replayed claim stays,
	// as the rest of the pod's network does.
	if err != nil && created {
		if releaseErr := a.store.releaseHostPorts(alloc.Pod.ID); releaseErr != nil {
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
		held, err := a.store.hostPortsOf(id)
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
		if err := a.store.releaseHostPorts(id); err != nil {
			return err
		}
	}
	return nil
}

// podIDs are the IDs of the allocations' pods.
func podIDs(allocs []*allocation) []string {
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
	allocs, err := a.store.list()
	if err != nil {
		return err
	}
	held, err := a.store.allHostPorts()
	if err != nil {
		return err
	}
	var pods []publishedPod
	for _, alloc := range allocs {
		if ports := held[alloc.Pod.ID]; ports != nil && !slices.Contains(without, alloc.Pod.ID) {
			pods = append(pods, publishedPod{pod: alloc.Pod, addrs: alloc.Addrs, ports: ports.Ports})
		}
	}
	return a.firewall.apply(buildRuleset(a.settings, pods))
}

// syncHostPorts reconciles the hostPorts with the pods the runtime lists, after Synchronize
// released the pods that are gone: a listed pod that has an allocation but no claim (started by
// an nri-bridge without hostPort support) gets its ports claimed, a claim without allocation is
// dropped, and the table is rebuilt from the store, whatever happened to it meanwhile. Failures
// are logged: failing Synchronize would disconnect the plugin and leave every pod without status.
func (a *activeConfig) syncHostPorts(ctx context.Context, listed []podWithPorts) {
	a.firewallMu.Lock()
	defer a.firewallMu.Unlock()
	allocs, err := a.store.list()
	if err != nil {
		log.Errorf(ctx, "nri-bridge: synchronize hostPorts: %v", err)
		return
	}
	held, err := a.store.allHostPorts()
	if err != nil {
		log.Errorf(ctx, "nri-bridge: synchronize hostPorts: %v", err)
		return
	}
	allocated := map[string]*allocation{}
	for _, alloc := range allocs {
		allocated[alloc.Pod.ID] = alloc
	}
	for id, ports := range held {
		if allocated[id] == nil {
			if err := a.store.releaseHostPorts(id); err != nil {
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
			if _, err = a.store.claimHostPorts(alloc.Pod, ports); err == nil {
				err = a.firewall.enableHairpin(alloc.HostVeth)
			}
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
	ref   podRef
	ports []portMapping
}

// hasFamily tells whether pods get an address of the family (IPv4 or IPv6).
func (s *settings) hasFamily(is4 bool) bool {
	for _, p := range s.pools {
		if p.subnet.Addr().Is4() == is4 {
			return true
		}
	}
	return false
}

// publishedPortsOf validates the ports a pod publishes against the configuration. On a secondary
// interface a pod publishes none: its hostPorts are the pod network's (CNI's portmap).
func publishedPortsOf(s *settings, mappings []portMapping) ([]portMapping, error) {
	if s.secondary() {
		return nil, nil
	}
	ports, err := publishedPorts(mappings, s.hasFamily(true), s.hasFamily(false))
	if err != nil {
		return nil, fmt.Errorf("port mappings: %w", err)
	}
	return ports, nil
}
