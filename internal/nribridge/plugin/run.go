package plugin

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/syslog"
	"os"
	"sync/atomic"
	"time"

	"github.com/containerd/nri/pkg/api"
	"github.com/containerd/nri/pkg/stub"
	"github.com/sirupsen/logrus"
	logrussyslog "github.com/sirupsen/logrus/hooks/syslog"
	"github.com/vishvananda/netlink"

	"github.com/knext-dev/knext/internal/nribridge/cluster"
	"github.com/knext-dev/knext/internal/nribridge/config"
	"github.com/knext-dev/knext/internal/nribridge/firewall"
	"github.com/knext-dev/knext/internal/nribridge/wiring"
)

// The name and index nri-bridge registers with in the standalone mode, unless told otherwise.
const (
	DefaultName = "bridge"
	DefaultIdx  = "10"
)

const reconnectInterval = time.Second

// Options are how nri-bridge runs: its configuration flags; for the standalone mode the
// runtime's NRI socket and the name and index to register with; for cluster mode how it
// reaches the API server and which Node it runs on.
type Options struct {
	Flags  *config.Flags
	Socket string
	Name   string
	Idx    string
	// Kubeconfig is the kubeconfig file of cluster mode; without it, a pod with a service
	// account token runs in cluster mode with its in-cluster configuration.
	Kubeconfig string
	// NodeName is the name of the Node nri-bridge runs on (cluster mode).
	NodeName string
	// APIWait is how long a start in cluster mode waits for the API server before it runs on
	// the last known cluster state.
	APIWait time.Duration
}

// launchedByRuntime tells whether the runtime started the plugin from plugin_path: it then
// passes the connection as a file descriptor in the environment.
func launchedByRuntime() bool {
	return os.Getenv(api.PluginSocketEnvVar) != ""
}

// newPlugin returns the plugin with the -config file of flags, on the host's network and nftables.
func newPlugin(flags *config.Flags) (*plugin, error) {
	p := &plugin{
		flags:       flags,
		newNetwork:  func(s *config.Settings) (podNetwork, error) { return wiring.New(s) },
		newFirewall: func(s *config.Settings) packetFilter { return firewall.NewNFT(s.Bridge) },
	}
	if flags.File != "" {
		doc, err := os.ReadFile(flags.File)
		if err != nil {
			return nil, fmt.Errorf("reading configuration: %w", err)
		}
		p.startupYAML = doc
	}
	return p, nil
}

// Check validates the configuration (file and flags), against the host too, without running. In
// cluster mode the pod subnets are the Node's, which Check does not ask the API server for.
func Check(opts Options) error {
	p, err := newPlugin(opts.Flags)
	if err != nil {
		return err
	}
	if apiServer, err := opts.apiServer(); err != nil || apiServer != nil {
		if err != nil {
			return err
		}
		_, err := checkCluster(p)
		return err
	}
	return p.check(p.startupYAML)
}

// failurePolicy is what the runtime does when nri-bridge fails to answer in time: as NRI asks of
// a plugin that sets up the pod network, the request fails rather than go on without the pod's
// network, and nri-bridge stays connected, keeping the node's network ready.
var failurePolicy = stub.WithFailurePolicy(&api.FailurePolicy{FailRequest: true, KeepConnected: true})

// Run runs the plugin until ctx ends: on the connection the runtime hands it when the runtime
// launched it, otherwise standalone on the runtime's socket, reconnecting whenever the runtime
// restarts.
func Run(ctx context.Context, opts Options) error {
	p, err := newPlugin(opts.Flags)
	if err != nil {
		return err
	}
	defer p.close()

	if launchedByRuntime() {
		// The runtime discards the stdout/stderr of the plugins it launches.
		logToSyslog()
		s, err := stub.New(p, failurePolicy)
		if err != nil {
			return err
		}
		// The connection belongs to this runtime instance: when it goes, the runtime is gone
		// and its next instance launches a new plugin process.
		if err := s.Run(ctx); err != nil && ctx.Err() == nil {
			return err
		}
		return nil
	}

	apiServer, err := opts.apiServer()
	if err != nil {
		return err
	}
	if apiServer != nil {
		nodes, err := cluster.Nodes(apiServer)
		if err != nil {
			return fmt.Errorf("cluster mode: %w", err)
		}
		return runCluster(ctx, p, nodes, cluster.NewNetlinkRoutes(&netlink.Handle{}), opts)
	}
	return runStandalone(ctx, p, opts.Socket, opts.Name, opts.Idx)
}

// runStandalone connects to the runtime's NRI socket and stays connected until ctx ends.
func runStandalone(ctx context.Context, p *plugin, socket, name, idx string) error {
	// Refuse a bad configuration now rather than at the first connection.
	if err := p.configure(p.startupYAML); err != nil {
		return err
	}
	var connectionLost atomic.Bool
	s, err := stub.New(p, failurePolicy, stub.WithPluginName(name), stub.WithPluginIdx(idx), stub.WithSocketPath(socket),
		stub.WithOnClose(func() { connectionLost.Store(true) }))
	if err != nil {
		return err
	}
	return runReconnecting(ctx, s, &connectionLost)
}

// runReconnecting keeps the plugin connected to the runtime until ctx ends, reconnecting after
// every runtime restart. Failed attempts are logged when the error changes or after a connection
// was lost, not on every retry.
func runReconnecting(ctx context.Context, s stub.Stub, connectionLost *atomic.Bool) error {
	var lastErr string
	for {
		err := s.Run(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if err == nil {
			err = errors.New("connection closed")
		}
		if connectionLost.Swap(false) {
			lastErr = ""
		}
		if msg := err.Error(); msg != lastErr {
			logrus.Warnf("nri-bridge: not connected to the runtime (%v); retrying every %s", err, reconnectInterval)
			lastErr = msg
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(reconnectInterval):
		}
	}
}

// logToSyslog sends the log to syslog (journald), falling back to stderr without it.
func logToSyslog() {
	hook, err := logrussyslog.NewSyslogHook("", "", syslog.LOG_DAEMON|syslog.LOG_INFO, "nri-bridge")
	if err != nil {
		return
	}
	logrus.AddHook(hook)
	logrus.SetOutput(io.Discard)
}
