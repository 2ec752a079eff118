// Command nri-bridge is an NRI plugin that is the pod network of a CNI-less node: it gives
// every pod with its own network namespace a veth pair to a Linux bridge, one address per
// configured family, default routes through the bridge, and reports the addresses to the
// runtime in its RunPodSandbox answer, once per pod. With -interface (or the key interface) other than
// eth0 it is instead a secondary network next to CNI's eth0: no default routes, no reported IPs,
// no hostPorts.
//
// It runs either pre-installed (the runtime starts it from NRI's plugin_path and hands it the
// drop-in configuration) or standalone (flags and/or -config, reconnecting whenever the
// runtime restarts). Standalone with a kubeconfig, or in a pod with a service account token, it
// is a cluster network (cluster mode): its pod subnets are its Node's spec.podCIDRs and it routes
// the other nodes' pod CIDRs to them. The work is done by the packages under internal/nribridge.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/containerd/nri/pkg/api"
	"github.com/sirupsen/logrus"

	"github.com/knext-dev/knext/internal/nribridge/config"
	"github.com/knext-dev/knext/internal/nribridge/plugin"
)

func main() {
	fs := flag.NewFlagSet("nri-bridge", flag.ExitOnError)
	opts := plugin.Options{Flags: &config.Flags{}}
	opts.Flags.Register(fs)
	fs.StringVar(&opts.Socket, "nri-socket", api.DefaultSocketPath, "NRI `socket` to connect to (standalone mode)")
	fs.StringVar(&opts.Name, "name", plugin.DefaultName, "plugin `name` to register with (standalone mode)")
	fs.StringVar(&opts.Idx, "idx", plugin.DefaultIdx, "plugin `index` to register with (standalone mode)")
	fs.StringVar(&opts.Kubeconfig, "kubeconfig", "", "kubeconfig `file` of the API server: cluster mode (also in a pod with a service account token)")
	fs.StringVar(&opts.NodeName, "node-name", os.Getenv("NODE_NAME"), "`name` of this node's Node (cluster mode; default $NODE_NAME)")
	fs.DurationVar(&opts.APIWait, "api-wait", 10*time.Second, "how long a start in cluster mode waits for the API server before it runs on the last known cluster state")
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
	switch {
	case *check:
		if err := plugin.Check(opts); err != nil {
			fmt.Fprintf(os.Stderr, "nri-bridge: %v\n", err)
			os.Exit(1)
		}
		fmt.Println("nri-bridge: configuration OK")
	case *clean:
		if err := plugin.Cleanup(opts.Flags, os.Stdout); err != nil {
			fmt.Fprintf(os.Stderr, "nri-bridge: cleanup: %v\n", err)
			os.Exit(1)
		}
	default:
		if err := plugin.Run(ctx, opts); err != nil {
			logrus.Errorf("nri-bridge: %v", err)
			os.Exit(1)
		}
	}
}
