package plugin

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strings"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/knext-dev/knext/internal/nribridge/cluster"
	"github.com/knext-dev/knext/internal/nribridge/config"
	"github.com/knext-dev/knext/internal/nribridge/store"
)

// serviceAccountToken is where a pod's service account token is mounted.
const serviceAccountToken = "/var/run/secrets/kubernetes.io/serviceaccount/token"

// renumberRetry is how often a start that found running pods on other pod CIDRs than the Node's
// looks again whether they are gone.
const renumberRetry = 5 * time.Second

// apiServer returns how to reach the API server in cluster mode: the kubeconfig file, or the
// in-cluster configuration of a pod with a service account token. It is nil without either: file
// mode. A pod without a token (a static pod, a pod with automountServiceAccountToken: false)
// runs in file mode even where the kubelet set KUBERNETES_SERVICE_HOST.
func (o Options) apiServer() (*rest.Config, error) {
	var apiServer *rest.Config
	var err error
	switch _, tokenErr := os.Stat(serviceAccountToken); {
	case o.Kubeconfig != "":
		apiServer, err = clientcmd.BuildConfigFromFlags("", o.Kubeconfig)
		if err != nil {
			return nil, fmt.Errorf("kubeconfig %s: %w", o.Kubeconfig, err)
		}
	case tokenErr != nil:
		return nil, nil
	default:
		apiServer, err = rest.InClusterConfig()
		if errors.Is(err, rest.ErrNotInCluster) {
			return nil, nil
		}
		if err != nil {
			return nil, fmt.Errorf("cluster mode: the pod's in-cluster configuration: %w", err)
		}
	}
	apiServer.UserAgent = "nri-bridge"
	apiServer.ContentType = "application/vnd.kubernetes.protobuf"
	return apiServer, nil
}

// checkCluster validates the plugin's configuration for cluster mode.
func checkCluster(p *plugin) (config.Config, error) {
	cfg, err := config.Resolve(p.startupYAML, p.flags)
	if err == nil {
		err = cfg.CheckCluster()
	}
	if err != nil {
		return config.Config{}, fmt.Errorf("invalid configuration: %w", err)
	}
	return cfg, nil
}

// runCluster runs the plugin in cluster mode until ctx ends: it waits for the node's pod CIDRs
// (from the API server, or the last known ones when the API server does not answer in time)
// before it connects to the runtime, which until then reports NetworkReady false. It stops with
// an error when the Node's pod CIDRs change while it runs.
func runCluster(ctx context.Context, p *plugin, nodes cache.ListerWatcher, routes cluster.RouteTable, opts Options) error {
	if opts.NodeName == "" {
		return errors.New("cluster mode needs the name of this node's Node: -node-name or $NODE_NAME (the DaemonSet sets it from spec.nodeName)")
	}
	cfg, err := checkCluster(p)
	if err != nil {
		return err
	}
	st, err := p.openStore(cfg.StateDir)
	if err != nil {
		return err
	}
	ctrl, err := cluster.New(nodes, opts.NodeName, st, routes, p.nodesChanged)
	if err != nil {
		return fmt.Errorf("cluster mode: %w", err)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go ctrl.Run(ctx)

	podCIDRs, err := waitPodCIDRs(ctx, ctrl, st, opts)
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	p.cluster = &clusterNode{name: opts.NodeName, podCIDRs: podCIDRs, nodesPodCIDRs: ctrl.NodesPodCIDRs}
	renumbered := make(chan error, 1)
	go func() {
		if err := watchPodCIDRs(ctx, ctrl, opts.NodeName, podCIDRs); err != nil {
			renumbered <- err
			cancel()
		}
	}()
	if err := runStandalone(ctx, p, opts.Socket, opts.Name, opts.Idx); err != nil {
		return err
	}
	select {
	case err := <-renumbered:
		return err
	default:
		return nil
	}
}

// waitPodCIDRs waits for the node's pod CIDRs, and then until no running pod holds an address
// outside them.
func waitPodCIDRs(ctx context.Context, ctrl *cluster.Controller, st *store.Store, opts Options) ([]netip.Prefix, error) {
	var lastErr string
	for {
		podCIDRs, fromAPI, err := ctrl.PodCIDRs(ctx, opts.APIWait)
		if err != nil {
			return nil, err
		}
		err = checkNotRenumbering(st, opts.NodeName, podCIDRs)
		if err == nil {
			if fromAPI {
				log.Infof(ctx, "nri-bridge: Node %s's pod CIDRs %v, from the API server", opts.NodeName, podCIDRs)
			}
			return podCIDRs, nil
		}
		if err.Error() != lastErr {
			log.Errorf(ctx, "nri-bridge: %v", err)
			lastErr = err.Error()
		}
		_, changed := ctrl.APIPodCIDRs()
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-changed:
		case <-time.After(renumberRetry):
		}
	}
}

// checkNotRenumbering refuses pod CIDRs that running pods (those whose network namespace still
// exists) hold no address of: nri-bridge never renumbers a running pod. Allocations of pods that
// are gone do not count; the next Synchronize releases them.
func checkNotRenumbering(st *store.Store, node string, podCIDRs []netip.Prefix) error {
	allocs, err := st.List()
	if err != nil {
		return err
	}
	var holders []string
	var old []netip.Prefix
	for _, alloc := range allocs {
		if _, err := os.Stat(alloc.NetNS); err != nil {
			continue
		}
		var outside []string
		for _, addr := range alloc.Addrs {
			if slices.ContainsFunc(podCIDRs, func(c netip.Prefix) bool { return c.Contains(addr.Addr()) }) {
				continue
			}
			outside = append(outside, addr.Addr().String())
			if subnet := addr.Masked(); !slices.Contains(old, subnet) {
				old = append(old, subnet)
			}
		}
		if len(outside) > 0 {
			holders = append(holders, fmt.Sprintf("%s holds %s", alloc.Pod, strings.Join(outside, ", ")))
		}
	}
	if len(holders) == 0 {
		return nil
	}
	const shown = 3
	if len(holders) > shown {
		holders = append(holders[:shown], fmt.Sprintf("and %d more", len(holders)-shown))
	}
	return fmt.Errorf("Node %s's spec.podCIDRs %v differ from the pod CIDRs %v of the allocations in %s, which running pods still hold (%s): "+
		"nri-bridge does not renumber running pods; it takes %v, and connects to the runtime, once they are gone (drain the node)",
		node, podCIDRs, old, st.Dir(), strings.Join(holders, "; "), podCIDRs)
}

// watchPodCIDRs returns an error when the API server gives the Node other pod CIDRs than those
// in use (the Node was created again), nil when ctx ends.
func watchPodCIDRs(ctx context.Context, ctrl *cluster.Controller, node string, inUse []netip.Prefix) error {
	for {
		podCIDRs, changed := ctrl.APIPodCIDRs()
		if len(podCIDRs) > 0 && !samePrefixes(podCIDRs, inUse) {
			return fmt.Errorf("Node %s's spec.podCIDRs changed from %v to %v (was the Node created again?): nri-bridge stops, so that no new pod gets an address of %v; "+
				"started again, it takes %v once no running pod holds an address of %v", node, inUse, podCIDRs, inUse, podCIDRs, inUse)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-changed:
		}
	}
}

// samePrefixes tells whether a and b hold the same prefixes, in any order.
func samePrefixes(a, b []netip.Prefix) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.SortFunc(a, netip.Prefix.Compare)
	slices.SortFunc(b, netip.Prefix.Compare)
	return slices.Equal(a, b)
}
