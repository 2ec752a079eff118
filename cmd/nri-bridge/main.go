// Command nri-bridge is an NRI plugin that is the pod network of a CNI-less node: it gives
// every pod with its own network namespace a veth pair to a Linux bridge, one address per
// configured family, default routes through the bridge, and reports the addresses to the
// runtime through NRI's PodSandboxStatus. With -interface (or the key interface) other than
// eth0 it is instead a secondary network next to CNI's eth0: no default routes, no reported IPs,
// no hostPorts.
//
// It runs either pre-installed (the runtime starts it from NRI's plugin_path and hands it the
// drop-in configuration) or standalone (flags and/or -config, reconnecting whenever the
// runtime restarts).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/syslog"
	"os"
	"os/signal"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/containerd/nri/pkg/api"
	"github.com/containerd/nri/pkg/stub"
	"github.com/sirupsen/logrus"
	logrussyslog "github.com/sirupsen/logrus/hooks/syslog"
)

const (
	defaultPluginName = "bridge"
	defaultPluginIdx  = "10"
	reconnectInterval = time.Second
)

func main() {
	fs := flag.NewFlagSet("nri-bridge", flag.ExitOnError)
	flags := &configFlags{}
	flags.register(fs)
	socket := fs.String("nri-socket", api.DefaultSocketPath, "NRI `socket` to connect to (standalone mode)")
	name := fs.String("name", defaultPluginName, "plugin `name` to register with (standalone mode)")
	idx := fs.String("idx", defaultPluginIdx, "plugin `index` to register with (standalone mode)")
	debug := fs.Bool("debug", false, "log debug messages")
	check := fs.Bool("check", false, "validate the configuration (file and flags) against the host, then exit")
	clean := fs.Bool("cleanup", false, "remove the bridge, nftables table, pod veths and allocation store of the configuration (file and flags), then exit; nri-bridge must not be running")
	_ = fs.Parse(os.Args[1:])
	if fs.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "nri-bridge: unexpected arguments %q\n", fs.Args())
		os.Exit(2)
	}
	if *debug {
		logrus.SetLevel(logrus.DebugLevel)
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if *check {
		if err := checkConfig(flags); err != nil {
			fmt.Fprintf(os.Stderr, "nri-bridge: %v\n", err)
			os.Exit(1)
		}
		fmt.Println("nri-bridge: configuration OK")
		return
	}
	if *clean {
		if err := cleanup(flags, os.Stdout); err != nil {
			fmt.Fprintf(os.Stderr, "nri-bridge: cleanup: %v\n", err)
			os.Exit(1)
		}
		return
	}
	if err := run(ctx, flags, *socket, *name, *idx); err != nil {
		logrus.Errorf("nri-bridge: %v", err)
		os.Exit(1)
	}
}

// launchedByRuntime tells whether the runtime started the plugin from plugin_path: it then
// passes the connection as a file descriptor in the environment.
func launchedByRuntime() bool {
	return os.Getenv(api.PluginSocketEnvVar) != ""
}

func newPlugin(flags *configFlags) (*plugin, error) {
	p := &plugin{flags: flags, newNetwork: newHostNetwork, newFirewall: newNFTFirewall}
	if flags.file != "" {
		doc, err := os.ReadFile(flags.file)
		if err != nil {
			return nil, fmt.Errorf("reading configuration: %w", err)
		}
		p.startupYAML = doc
	}
	return p, nil
}

func checkConfig(flags *configFlags) error {
	p, err := newPlugin(flags)
	if err != nil {
		return err
	}
	return p.check(p.startupYAML)
}

func run(ctx context.Context, flags *configFlags, socket, name, idx string) error {
	p, err := newPlugin(flags)
	if err != nil {
		return err
	}
	defer p.close()

	if launchedByRuntime() {
		// The runtime discards the stdout/stderr of the plugins it launches.
		logToSyslog()
		s, err := stub.New(p)
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

	return runStandalone(ctx, p, socket, name, idx)
}

// runStandalone connects to the runtime's NRI socket and stays connected until ctx ends.
func runStandalone(ctx context.Context, p *plugin, socket, name, idx string) error {
	// Refuse a bad configuration now rather than at the first connection.
	if err := p.configure(p.startupYAML); err != nil {
		return err
	}
	var connectionLost atomic.Bool
	s, err := stub.New(p, stub.WithPluginName(name), stub.WithPluginIdx(idx), stub.WithSocketPath(socket),
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
