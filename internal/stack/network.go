package stack

import (
	"errors"
	"fmt"

	"github.com/vishvananda/netlink"
)

// netlinkDump runs dump again while the kernel reports it interrupted: the table changed during
// the dump, which is common while other instances create and delete links and routes.
func netlinkDump[T any](what string, dump func() ([]T, error)) ([]T, error) {
	for range 20 {
		result, err := dump()
		if !errors.Is(err, netlink.ErrDumpInterrupted) {
			return result, err
		}
	}
	return nil, fmt.Errorf("list %s: netlink dump interrupted 20 times in a row", what)
}

// BridgePorts returns the names of the interfaces attached to the instance's bridge (one veth
// per pod on the CNI network), or an error if the bridge does not exist.
func (h *Stack) BridgePorts() ([]string, error) {
	return BridgePorts(h.Bridge)
}

// BridgePorts returns the names of the interfaces attached to bridge name, or an error if the
// bridge does not exist.
func BridgePorts(name string) ([]string, error) {
	bridge, err := netlink.LinkByName(name)
	if err != nil {
		return nil, fmt.Errorf("bridge %s: %w", name, err)
	}
	links, err := netlinkDump("links", netlink.LinkList)
	if err != nil {
		return nil, err
	}
	var ports []string
	for _, l := range links {
		if l.Attrs().MasterIndex == bridge.Attrs().Index {
			ports = append(ports, l.Attrs().Name)
		}
	}
	return ports, nil
}
