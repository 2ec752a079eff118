package plugin

import (
	"github.com/containerd/nri/pkg/api"

	"github.com/knext-dev/knext/internal/nribridge/hostport"
)

// portMappingsOf reads the pod's port mappings, which the runtime fills from CRI's
// PodSandboxConfig in every pod event.
func portMappingsOf(pod *api.PodSandbox) []hostport.Mapping {
	var mappings []hostport.Mapping
	for _, m := range pod.GetPortMappings() {
		mappings = append(mappings, hostport.Mapping{
			Protocol:      protocolOf(m.GetProtocol()),
			ContainerPort: m.GetContainerPort(),
			HostPort:      m.GetHostPort(),
			HostIP:        m.GetHostIp(),
		})
	}
	return mappings
}

// protocolOf names an NRI protocol; a value this nri-bridge does not know keeps its number, for
// the error that refuses it.
func protocolOf(p api.Protocol) hostport.Protocol {
	switch p {
	case api.Protocol_TCP:
		return hostport.TCP
	case api.Protocol_UDP:
		return hostport.UDP
	case api.Protocol_SCTP:
		return hostport.SCTP
	}
	return hostport.Protocol(p.String())
}
