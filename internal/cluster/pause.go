package cluster

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/knext-dev/knext/internal/stack"
)

// nodeMonitorPeriod is how often the controller-manager checks the nodes' leases (its default).
const nodeMonitorPeriod = 5 * time.Second

// The controllers that judge the nodes by their leases: stopped first and continued last, once the
// nodes have renewed their leases. Their caches may still hold the old leases for a moment, so a
// node can still be marked NotReady at the resume; Resume returns once it is Ready again.
var leaseJudges = []string{"kube-controller-manager", "kube-scheduler"}

// Pause stops every process of the cluster with SIGSTOP, the control plane, every node's daemons,
// shims and pods, so that a cluster kept for later takes no CPU while another is measured.
func (c *Cluster) Pause() error {
	if c.paused {
		return nil
	}
	c.logf("cluster %s: pausing", c.ID)
	judges := c.judges()
	if err := c.signal(syscall.SIGSTOP, judges); err != nil {
		return err
	}
	// Listed again until no new one appears: a daemon stopped late may have started a child.
	stopped := judges
	for range 5 {
		pids, err := c.Processes()
		if err != nil {
			return err
		}
		fresh := slices.DeleteFunc(pids, func(pid int) bool { return slices.Contains(stopped, pid) })
		if len(fresh) == 0 {
			c.paused = true
			return nil
		}
		if err := c.signal(syscall.SIGSTOP, fresh); err != nil {
			return err
		}
		stopped = append(stopped, fresh...)
	}
	return fmt.Errorf("cluster %s: new processes kept appearing while pausing it", c.ID)
}

// Resume continues what Pause stopped, if it did, and waits until the cluster has caught up with
// the time it was stopped: every kubelet has renewed its lease, then the controller-manager and
// the scheduler run again, and every node is Ready without a taint of the node lifecycle.
func (c *Cluster) Resume(ctx context.Context) error {
	if !c.paused {
		return nil
	}
	resumed := time.Now()
	pids, err := c.Processes()
	if err != nil {
		return err
	}
	judges := c.judges()
	if err := c.signal(syscall.SIGCONT, slices.DeleteFunc(pids, func(pid int) bool { return slices.Contains(judges, pid) })); err != nil {
		return err
	}
	client, err := c.Client()
	if err != nil {
		return err
	}
	err = poll(ctx, 2*time.Minute, func() error {
		for _, n := range c.Nodes {
			lease, err := client.CoordinationV1().Leases(corev1.NamespaceNodeLease).Get(ctx, n.Name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if renewed := lease.Spec.RenewTime; renewed == nil || renewed.Time.Before(resumed) {
				return fmt.Errorf("the kubelet of %s has not renewed its lease since the resume (kubelet running: %t)",
					n.Name, n.Processes["kubelet"] != nil && n.Processes["kubelet"].running())
			}
		}
		return nil
	})
	if err == nil {
		err = c.signal(syscall.SIGCONT, judges)
	}
	if err == nil {
		c.paused = false
		// The controller-manager's first check may still read old leases from its cache and mark
		// a node NotReady for a moment: wait for the next, then for the nodes Ready.
		select {
		case <-ctx.Done():
			err = ctx.Err()
		case <-time.After(nodeMonitorPeriod + time.Second):
			err = poll(ctx, 2*time.Minute, func() error { return nodesReady(ctx, client, len(c.Nodes)) })
		}
	}
	if err != nil {
		return fmt.Errorf("cluster %s: resume: %w", c.ID, err)
	}
	c.logf("cluster %s: resumed, its nodes Ready after %s", c.ID, time.Since(resumed).Round(time.Second))
	return nil
}

// judges are the PIDs of the running leaseJudges.
func (c *Cluster) judges() []int {
	var pids []int
	for _, name := range leaseJudges {
		if p := c.ControlPlane.Processes[name]; p != nil && p.running() {
			pids = append(pids, p.PID)
		}
	}
	return pids
}

func (c *Cluster) signal(sig syscall.Signal, pids []int) error {
	for _, pid := range pids {
		if err := syscall.Kill(pid, sig); err != nil && !errors.Is(err, syscall.ESRCH) {
			return fmt.Errorf("cluster %s: %s pid %d: %w", c.ID, sig, pid, err)
		}
	}
	return nil
}

// Processes lists the PIDs of every process of the cluster: the recorded daemons, the processes
// in the nodes' mount namespaces (containerd's shims) and in their pod cgroups.
func (c *Cluster) Processes() ([]int, error) {
	var pids []int
	daemons := func(ps map[string]*Process) {
		for _, p := range ps {
			if p.running() {
				pids = append(pids, p.PID)
			}
		}
	}
	daemons(c.ControlPlane.Processes)
	for _, n := range c.Nodes {
		daemons(n.Processes)
		inNamespace, err := stack.MountNamespaceProcesses(n.MountNS)
		if err != nil {
			return nil, err
		}
		inCgroups, err := stack.CgroupProcesses(n.CgroupRoot)
		if err != nil {
			return nil, err
		}
		pids = append(append(pids, inNamespace...), inCgroups...)
	}
	slices.Sort(pids)
	return slices.Compact(pids), nil
}
