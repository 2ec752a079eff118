package stack

import (
	"context"
	"fmt"
	"path/filepath"
	"time"

	criruntime "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// NRIBridgeProcess names nri-bridge's process, and so its log (Root/nri-bridge.log).
const NRIBridgeProcess = "nri-bridge"

// NetworkReadyTimeout bounds the wait for NetworkReady once what provides the network has started.
const NetworkReadyTimeout = 30 * time.Second

// NRIBridgeArgs returns the flags that run nri-bridge as the instance's pod network: its NRI
// socket, the instance's bridge name (no CNI bridge uses it on a CNI-less node), a state
// directory under the root, then flags (its subnets, e.g. "-ipv4-subnet", h.Subnet.String()).
func (h *Stack) NRIBridgeArgs(flags ...string) []string {
	return append([]string{"-nri-socket", h.NRISocket, "-bridge", h.Bridge, "-state-dir", h.NRIBridgeStateDir()}, flags...)
}

// NRIBridgeStateDir is nri-bridge's state directory under the root.
func (h *Stack) NRIBridgeStateDir() string {
	return filepath.Join(h.Root, "nri-bridge-state")
}

// NRIBridgeIPv6Subnet returns an IPv6 /64 for nri-bridge derived from the instance's /24, as
// unique among instances as their /24s.
func (h *Stack) NRIBridgeIPv6Subnet() string {
	v4 := h.Subnet.IP.To4()
	return fmt.Sprintf("fd6b:6e78:%d:%d::/64", v4[1], v4[2])
}

// StartNRIBridge starts the nri-bridge binary with args (see NRIBridgeArgs) and waits until CRI
// reports the network ready. It returns the process also on error, for the caller to stop
// (Close stops it in any case).
func (h *Stack) StartNRIBridge(ctx context.Context, binary string, args ...string) (*Process, error) {
	p, err := h.StartProcess(NRIBridgeProcess, binary, args...)
	if err != nil {
		return nil, err
	}
	if err := h.WaitNetworkReady(ctx, true, NetworkReadyTimeout, p); err != nil {
		return p, fmt.Errorf("nri-bridge %s: %w\n%s", binary, err, Tail(p.LogPath, 20, nil))
	}
	return p, nil
}

// NetworkCondition returns CRI's NetworkReady condition.
func (h *Stack) NetworkCondition(ctx context.Context) (*criruntime.RuntimeCondition, error) {
	resp, err := h.Runtime.Status(ctx, &criruntime.StatusRequest{})
	if err != nil {
		return nil, err
	}
	for _, c := range resp.GetStatus().GetConditions() {
		if c.Type == criruntime.NetworkReady {
			return c, nil
		}
	}
	return nil, fmt.Errorf("CRI status has no %s condition: %v", criruntime.NetworkReady, resp.GetStatus().GetConditions())
}

// WaitNetworkReady waits up to timeout until CRI's NetworkReady condition is want. It gives up
// early when one of the processes that should provide the network has exited.
func (h *Stack) WaitNetworkReady(ctx context.Context, want bool, timeout time.Duration, providers ...*Process) error {
	return poll(ctx, timeout, func() error {
		cond, err := h.NetworkCondition(ctx)
		if err != nil {
			return err
		}
		if cond.Status == want {
			return nil
		}
		for _, p := range providers {
			if exited, exitErr := p.Exited(); exited {
				return Permanent(fmt.Errorf("%s exited (%v) with NetworkReady %v (%s: %s)", p.Name, exitErr, cond.Status, cond.Reason, cond.Message))
			}
		}
		return fmt.Errorf("NetworkReady %v (%s: %s), want %v", cond.Status, cond.Reason, cond.Message, want)
	})
}
