package plugin

import (
	"context"

	"github.com/containerd/nri/pkg/api"
	"github.com/containerd/nri/pkg/stub"
)

// Implementing stub.PodSandboxStatusInterface subscribes the plugin to POD_SANDBOX_STATUS.
var _ stub.PodSandboxStatusInterface = (*plugin)(nil)

// PodSandboxStatus reports the pod's allocated addresses: IPv4 as the primary IP when both
// families are configured. A pod the plugin has no allocation for gets an empty answer, and so
// does every pod on a secondary interface: its IPs are the pod network's.
func (p *plugin) PodSandboxStatus(_ context.Context, pod *api.PodSandbox) (*api.PodSandboxStatusResponse, error) {
	a, err := p.current()
	if err != nil {
		return nil, err
	}
	if a.settings.Secondary() {
		return &api.PodSandboxStatusResponse{}, nil
	}
	ips, err := p.podIPs(pod)
	if err != nil {
		return nil, err
	}
	if len(ips) == 0 {
		return &api.PodSandboxStatusResponse{}, nil
	}
	return &api.PodSandboxStatusResponse{Ip: ips[0], AdditionalIps: ips[1:]}, nil
}
