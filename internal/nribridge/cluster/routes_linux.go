package cluster

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/knext-dev/knext/internal/nribridge/store"
	"github.com/knext-dev/knext/internal/nribridge/wiring"
)

// RouteProtocol marks the routes nri-bridge makes (the route's protocol, `ip route show proto
// 78`), so that it never changes or removes a route it did not make.
const RouteProtocol netlink.RouteProtocol = 78

// NetlinkRoutes is the main routing table of a network namespace, through netlink.
type NetlinkRoutes struct {
	nl *netlink.Handle
}

// NewNetlinkRoutes returns the routing table that nl talks to (the host's for a zero Handle).
func NewNetlinkRoutes(nl *netlink.Handle) *NetlinkRoutes {
	return &NetlinkRoutes{nl: nl}
}

// List returns the routes of the main table that carry RouteProtocol.
func (t *NetlinkRoutes) List() ([]store.Route, error) {
	found, err := t.nl.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Table: unix.RT_TABLE_MAIN, Protocol: RouteProtocol},
		netlink.RT_FILTER_TABLE|netlink.RT_FILTER_PROTOCOL)
	if err != nil {
		return nil, fmt.Errorf("listing nri-bridge's routes: %w", err)
	}
	var routes []store.Route
	for _, r := range found {
		if r.Dst == nil {
			continue
		}
		dst, ok := wiring.PrefixOf(r.Dst)
		gw, gwOK := netip.AddrFromSlice(r.Gw)
		if ok && gwOK {
			routes = append(routes, store.Route{Dst: dst, Gw: gw.Unmap()})
		}
	}
	return routes, nil
}

// ForeignRouteError says that a route nri-bridge did not make has the destination of a route
// it would make: that route is left alone.
type ForeignRouteError struct {
	Route    store.Route
	Existing string
}

func (e *ForeignRouteError) Error() string {
	return fmt.Sprintf("route %s: the host already routes %s (%s), and nri-bridge leaves routes it did not make alone",
		e.Route, e.Route.Dst, e.Existing)
}

// Replace makes r, or changes nri-bridge's route to r.Dst into r. A route to r.Dst that
// nri-bridge did not make is refused with a ForeignRouteError.
func (t *NetlinkRoutes) Replace(r store.Route) error {
	family := netlink.FAMILY_V6
	if r.Dst.Addr().Is4() {
		family = netlink.FAMILY_V4
	}
	existing, err := t.nl.RouteListFiltered(family, &netlink.Route{Table: unix.RT_TABLE_MAIN, Dst: wiring.IPNet(r.Dst)},
		netlink.RT_FILTER_TABLE|netlink.RT_FILTER_DST)
	if err != nil {
		return fmt.Errorf("route %s: listing the routes to %s: %w", r, r.Dst, err)
	}
	for _, e := range existing {
		if e.Protocol != RouteProtocol {
			return &ForeignRouteError{Route: r, Existing: e.String()}
		}
	}
	if err := t.nl.RouteReplace(t.route(r)); err != nil {
		return fmt.Errorf("route %s: %w", r, err)
	}
	return nil
}

// Delete removes nri-bridge's route r; nothing to do when it is gone. The kernel matches the
// protocol and the gateway: a route nri-bridge did not make is never removed.
func (t *NetlinkRoutes) Delete(r store.Route) error {
	if err := t.nl.RouteDel(t.route(r)); err != nil && !errors.Is(err, unix.ESRCH) {
		return fmt.Errorf("removing route %s: %w", r, err)
	}
	return nil
}

func (t *NetlinkRoutes) route(r store.Route) *netlink.Route {
	return &netlink.Route{Table: unix.RT_TABLE_MAIN, Dst: wiring.IPNet(r.Dst), Gw: r.Gw.AsSlice(), Protocol: RouteProtocol}
}
