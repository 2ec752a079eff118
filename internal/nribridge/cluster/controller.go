package cluster

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	nrilog "github.com/containerd/nri/pkg/log"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/knext-dev/knext/internal/nribridge/store"
)

var log = nrilog.Get()

// RouteTable is the node's routing table as the controller uses it (NetlinkRoutes); a fake
// replaces it in tests.
type RouteTable interface {
	// List returns the routes nri-bridge made that the table holds (without node names).
	List() ([]store.Route, error)
	// Replace makes a route, or changes nri-bridge's route to its destination into it.
	Replace(store.Route) error
	// Delete removes a route nri-bridge made; nothing to do when it is gone.
	Delete(store.Route) error
}

const (
	// resyncInterval is how often the routes are checked and repaired without any change of the
	// Nodes (a route someone deleted, a gateway that was unreachable).
	resyncInterval = 30 * time.Second
	// waitLogInterval is how often a wait for the node's pod CIDRs says that it still waits.
	waitLogInterval = 30 * time.Second
)

// Controller keeps nri-bridge's view of the cluster from the Nodes in the API server: this
// node's pod CIDRs, the other nodes, and a route to each of their pod CIDRs.
type Controller struct {
	node     string
	store    *store.Store
	routes   RouteTable
	informer cache.SharedIndexInformer
	kick     chan struct{}
	// onNodesChange is called when the other nodes' pod CIDRs change.
	onNodesChange func()

	mu sync.Mutex
	// state is the last known cluster state, as the store holds it.
	state store.ClusterState
	// synced tells that the state reflects the API server's Nodes (the informer listed them).
	synced bool
	// apiPodCIDRs are this node's spec.podCIDRs as the API server last said them: nil while
	// it did not, or while the Node does not exist or has none.
	apiPodCIDRs []netip.Prefix
	ownSeen     bool  // the API server has this node's Node
	apiErr      error // the informer's last list or watch error
	// changed is closed, and replaced, at each change of the above.
	changed chan struct{}
	// problems are the problems of the last reconciliation, by subject, each logged once.
	problems map[string]string
}

// New returns the controller of the Node called node, which lists and watches the Nodes with
// nodes (Nodes), starting from the cluster state in st. onNodesChange (may be nil) is called
// whenever the other nodes' pod CIDRs change.
func New(nodes cache.ListerWatcher, node string, st *store.Store, routes RouteTable, onNodesChange func()) (*Controller, error) {
	c := &Controller{
		node: node, store: st, routes: routes, onNodesChange: onNodesChange,
		kick: make(chan struct{}, 1), changed: make(chan struct{}), problems: map[string]string{},
		state: store.ClusterState{Node: node},
	}
	stored, err := st.ClusterState()
	if err != nil {
		return nil, err
	}
	switch {
	case stored == nil:
	case stored.Node == node:
		c.state = *stored
	default:
		// Its routes are still nri-bridge's to remove; the rest belongs to the other node.
		log.Warnf(context.Background(), "nri-bridge: the store's cluster state is node %s's, this is node %s: not using its pod CIDRs %v",
			stored.Node, node, stored.PodCIDRs)
		c.state.Routes = stored.Routes
	}

	c.informer = cache.NewSharedIndexInformer(nodes, &corev1.Node{}, 0, cache.Indexers{})
	if err := c.informer.SetTransform(stripNode); err != nil {
		return nil, err
	}
	err = c.informer.SetWatchErrorHandler(func(_ *cache.Reflector, err error) {
		c.mu.Lock()
		defer c.mu.Unlock()
		c.apiErr = err
		c.notifyLocked()
	})
	if err != nil {
		return nil, err
	}
	_, err = c.informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { c.wake() },
		UpdateFunc: func(any, any) { c.wake() },
		DeleteFunc: func(any) { c.wake() },
	})
	return c, err
}

// wake makes the controller reconcile soon; wakes while it is busy are one.
func (c *Controller) wake() {
	select {
	case c.kick <- struct{}{}:
	default:
	}
}

// notifyLocked wakes whoever waits for a change; c.mu is held.
func (c *Controller) notifyLocked() {
	close(c.changed)
	c.changed = make(chan struct{})
}

// Run makes the routes of the last known cluster state at once, then watches the Nodes and
// reconciles the routes and the state with them until ctx ends.
func (c *Controller) Run(ctx context.Context) {
	c.mu.Lock()
	stored := slices.Clone(c.state.Routes)
	c.mu.Unlock()
	for _, r := range stored {
		if err := c.routes.Replace(r); err != nil {
			log.Warnf(ctx, "nri-bridge: restoring the last known %v", err)
		}
	}
	go c.informer.RunWithContext(ctx)
	go func() {
		if cache.WaitForCacheSync(ctx.Done(), c.informer.HasSynced) {
			c.wake()
		}
	}()
	ticker := time.NewTicker(resyncInterval)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-c.kick:
		case <-ticker.C:
		}
		if c.informer.HasSynced() {
			c.reconcile(ctx)
		}
	}
}

// reconcile brings the state and the routes in line with the Nodes the informer holds.
func (c *Controller) reconcile(ctx context.Context) {
	c.mu.Lock()
	next := cloneState(&c.state)
	c.mu.Unlock()

	problems := map[string]string{}
	var apiPodCIDRs []netip.Prefix
	ownSeen := false
	next.Nodes = nil
	for _, obj := range c.informer.GetStore().List() {
		n, ok := obj.(*corev1.Node)
		if !ok {
			continue
		}
		node, nodeProblems := nodeOf(n)
		for _, p := range nodeProblems {
			problems["node "+n.Name+": "+p] = fmt.Sprintf("Node %s: %s", n.Name, p)
		}
		if n.Name == c.node {
			ownSeen, apiPodCIDRs = true, node.PodCIDRs
			continue
		}
		next.Nodes = append(next.Nodes, node)
	}
	slices.SortFunc(next.Nodes, func(a, b store.Node) int { return strings.Compare(a.Name, b.Name) })
	if len(apiPodCIDRs) > 0 {
		next.PodCIDRs = apiPodCIDRs
	}
	wanted, routeProblems := wantedRoutes(next)
	for dst, p := range routeProblems {
		problems["route "+dst.String()] = p
	}
	next.Routes = c.syncRoutes(ctx, next, wanted, problems)
	c.logProblems(ctx, problems)

	c.mu.Lock()
	nodesChanged := !slices.Equal(podCIDRsOf(c.state.Nodes), podCIDRsOf(next.Nodes))
	if !stateEqual(&c.state, next) {
		next.Updated = time.Now().UTC()
		c.persist(ctx, next)
		c.state = *next
	}
	if !c.synced || c.ownSeen != ownSeen || !slices.Equal(c.apiPodCIDRs, apiPodCIDRs) || c.apiErr != nil {
		c.synced, c.ownSeen, c.apiPodCIDRs, c.apiErr = true, ownSeen, apiPodCIDRs, nil
		c.notifyLocked()
	}
	c.mu.Unlock()
	if nodesChanged && c.onNodesChange != nil {
		c.onNodesChange()
	}
}

// syncRoutes makes the wanted routes and removes the other routes nri-bridge made, and returns
// the routes it made (or may have made) afterwards. A route is recorded in the store before it
// is made, so that a crash never leaves a route of nri-bridge that the store does not know.
// Failures are left in problems; the next reconciliation retries them.
func (c *Controller) syncRoutes(ctx context.Context, next *store.ClusterState, wanted []store.Route, problems map[string]string) []store.Route {
	made := next.Routes
	if intent := unionRoutes(made, wanted); len(intent) != len(made) {
		pending := cloneState(next)
		pending.Routes = intent
		c.persist(ctx, pending)
	}
	present, err := c.routes.List()
	if err != nil {
		problems["routes"] = err.Error()
	}
	for _, r := range wanted {
		if containsRoute(present, r) {
			continue
		}
		if err := c.routes.Replace(r); err != nil {
			problems["route "+r.Dst.String()] = err.Error()
			continue
		}
		log.Infof(ctx, "nri-bridge: route %s", r)
	}
	kept := slices.Clone(wanted)
	for _, r := range made {
		if containsRoute(wanted, r) {
			continue
		}
		if err := c.routes.Delete(r); err != nil {
			problems["route "+r.Dst.String()+" removal"] = err.Error()
			kept = append(kept, r)
			continue
		}
		log.Infof(ctx, "nri-bridge: removed route %s", r)
	}
	sortRoutes(kept)
	return kept
}

// logProblems logs each problem once, when it first appears.
func (c *Controller) logProblems(ctx context.Context, problems map[string]string) {
	for subject, p := range problems {
		if c.problems[subject] != p {
			log.Warnf(ctx, "nri-bridge: %s", p)
		}
	}
	c.problems = problems
}

func (c *Controller) persist(ctx context.Context, state *store.ClusterState) {
	if err := c.store.PutClusterState(state); err != nil {
		log.Errorf(ctx, "nri-bridge: keeping the cluster state in the store: %v", err)
	}
}

// PodCIDRs waits for this node's pod CIDRs and returns them: the Node's spec.podCIDRs once the
// API server has given them (fromAPI), or, when it has not answered within wait, the last known
// ones, if there are any. Until then nri-bridge has no pod subnet, and it says so in its log.
func (c *Controller) PodCIDRs(ctx context.Context, wait time.Duration) (cidrs []netip.Prefix, fromAPI bool, err error) {
	start := time.Now()
	var lastReason string
	var lastLog time.Time
	for {
		c.mu.Lock()
		synced, apiPodCIDRs, ownSeen, apiErr, changed := c.synced, c.apiPodCIDRs, c.ownSeen, c.apiErr, c.changed
		state := cloneState(&c.state)
		c.mu.Unlock()
		if len(apiPodCIDRs) > 0 {
			log.Infof(ctx, "nri-bridge: Node %s's pod CIDRs %v, from the API server", c.node, apiPodCIDRs)
			return apiPodCIDRs, true, nil
		}
		if !synced && len(state.PodCIDRs) > 0 && time.Since(start) >= wait {
			log.Warnf(ctx, "nri-bridge: the API server did not answer within %s (%v): running on the last known cluster state (of %s): pod CIDRs %v, %d other nodes, %d routes; reconciling once it answers",
				wait, apiErr, state.Updated.Format(time.RFC3339), state.PodCIDRs, len(state.Nodes), len(state.Routes))
			return state.PodCIDRs, false, nil
		}
		var reason string
		switch {
		case !synced && apiErr != nil:
			reason = fmt.Sprintf("the API server does not answer: %v", apiErr)
		case !synced:
			reason = "the API server has not answered yet"
		case !ownSeen:
			reason = fmt.Sprintf("there is no Node %s", c.node)
		default:
			reason = fmt.Sprintf("Node %s has no spec.podCIDRs yet (the kube-controller-manager allocates them with --allocate-node-cidrs)", c.node)
		}
		// The API server usually answers within a second: no word about a wait that short.
		if time.Since(start) >= time.Second && (reason != lastReason || time.Since(lastLog) >= waitLogInterval) {
			log.Infof(ctx, "nri-bridge: waiting for the pod CIDRs of Node %s (spec.podCIDRs): %s. Until then nri-bridge does not connect to the runtime: the node's NetworkReady stays false",
				c.node, reason)
			lastReason, lastLog = reason, time.Now()
		}
		select {
		case <-ctx.Done():
			return nil, false, ctx.Err()
		case <-changed:
		case <-time.After(time.Second): // the wait's end and the log's interval
		}
	}
}

// APIPodCIDRs returns this node's pod CIDRs as the API server last said them (nil until it did,
// and while its Node does not exist or has none), and a channel closed at the next change.
func (c *Controller) APIPodCIDRs() ([]netip.Prefix, <-chan struct{}) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.apiPodCIDRs), c.changed
}

// NodesPodCIDRs are the other nodes' pod CIDRs, as last known.
func (c *Controller) NodesPodCIDRs() []netip.Prefix {
	c.mu.Lock()
	defer c.mu.Unlock()
	return podCIDRsOf(c.state.Nodes)
}

func cloneState(s *store.ClusterState) *store.ClusterState {
	c := *s
	c.PodCIDRs = slices.Clone(s.PodCIDRs)
	c.Nodes = slices.Clone(s.Nodes)
	c.Routes = slices.Clone(s.Routes)
	return &c
}

// stateEqual tells whether two states hold the same knowledge, whenever it was updated.
func stateEqual(a, b *store.ClusterState) bool {
	return a.Node == b.Node && slices.Equal(a.PodCIDRs, b.PodCIDRs) && slices.Equal(a.Routes, b.Routes) &&
		slices.EqualFunc(a.Nodes, b.Nodes, func(x, y store.Node) bool {
			return x.Name == y.Name && slices.Equal(x.PodCIDRs, y.PodCIDRs) && slices.Equal(x.InternalIPs, y.InternalIPs)
		})
}

// containsRoute tells whether routes hold r's destination through r's gateway.
func containsRoute(routes []store.Route, r store.Route) bool {
	return slices.ContainsFunc(routes, func(o store.Route) bool { return o.Dst == r.Dst && o.Gw == r.Gw })
}

// unionRoutes is a followed by the routes of b it does not hold.
func unionRoutes(a, b []store.Route) []store.Route {
	union := slices.Clone(a)
	for _, r := range b {
		if !containsRoute(union, r) {
			union = append(union, r)
		}
	}
	return union
}
