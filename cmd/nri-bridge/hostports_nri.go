package main

import "github.com/containerd/nri/pkg/api"

// portMappingsOf reads the pod's port mappings, which the runtime fills from CRI's
// PodSandboxConfig in every pod event.
func portMappingsOf(pod *api.PodSandbox) []portMapping {
	var mappings []portMapping
	for _, m := range pod.GetPortMappings() {
		mappings = append(mappings, portMapping{
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
func protocolOf(p api.Protocol) protocol {
	switch p {
	case api.Protocol_TCP:
		return protoTCP
	case api.Protocol_UDP:
		return protoUDP
	case api.Protocol_SCTP:
		return protoSCTP
	}
	return protocol(p.String())
}
