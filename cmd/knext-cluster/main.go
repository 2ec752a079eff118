// Command knext-cluster brings a local multi-node Kubernetes cluster on knext up and down
// (package cluster; `make cluster` and `make cluster-down` run it):
//
//	knext-cluster up -dir DIR [-nodes 2] [-runtime knext|upstream]
//	knext-cluster status -dir DIR
//	knext-cluster restart -dir DIR -node node-1 [-component kubelet]
//	knext-cluster down -dir DIR
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/knext-dev/knext/internal/cluster"
)

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	logger := log.New(os.Stderr, "", log.Ltime)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var err error
	switch command, args := os.Args[1], os.Args[2:]; command {
	case "up":
		err = up(ctx, args, logger.Printf)
	case "down":
		fs := flag.NewFlagSet("down", flag.ExitOnError)
		dir := fs.String("dir", "", "the cluster's state directory")
		fs.Parse(args)
		err = cluster.Down(*dir, logger.Printf)
	case "status":
		fs := flag.NewFlagSet("status", flag.ExitOnError)
		dir := fs.String("dir", "", "the cluster's state directory")
		fs.Parse(args)
		err = status(ctx, *dir, logger.Printf)
	case "restart":
		err = restart(ctx, args, logger.Printf)
	default:
		usage()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "knext-cluster:", err)
		os.Exit(1)
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: knext-cluster up|down|status|restart [flags] (-h for each one's flags)")
	os.Exit(2)
}

func up(ctx context.Context, args []string, logf func(string, ...any)) error {
	fs := flag.NewFlagSet("up", flag.ExitOnError)
	dir := fs.String("dir", "", "state directory (must not exist or be empty)")
	nodes := fs.Int("nodes", 2, "number of nodes")
	runtime := fs.String("runtime", cluster.RuntimeKnext, "nodes' runtime: knext (CNI-less, nri-bridge) or upstream (containerd + CNI)")
	fs.Parse(args)
	// The binaries and images are where the Makefile's environment says (cluster.EnvConfig).
	cfg, err := cluster.EnvConfig(*dir, *nodes, *runtime)
	if err != nil {
		return err
	}
	cfg.Logf = logf
	start := time.Now()
	c, err := cluster.Up(ctx, cfg)
	if err != nil {
		if c != nil {
			return fmt.Errorf("%w\nthe cluster is left as it is for its logs under %s; `make cluster-down` (knext-cluster down -dir %s) removes it", err, c.Dir, c.Dir)
		}
		return err
	}
	logf("cluster %s up in %s", c.ID, time.Since(start).Round(time.Second))
	return status(ctx, c.Dir, logf)
}

func status(ctx context.Context, dir string, logf func(string, ...any)) error {
	c, err := cluster.Load(dir, logf)
	if err != nil {
		return err
	}
	out, err := c.Kubectl(ctx, nil, "get", "nodes,pods", "-A", "-o", "wide")
	if err != nil {
		return err
	}
	fmt.Printf("%s\nkubeconfig: %s\n    export KUBECONFIG=%s\n    kubectl is %s/kubectl\n", out, c.Kubeconfig(), c.Kubeconfig(), c.Binaries.Kubernetes)
	return nil
}

func restart(ctx context.Context, args []string, logf func(string, ...any)) error {
	fs := flag.NewFlagSet("restart", flag.ExitOnError)
	dir := fs.String("dir", "", "the cluster's state directory")
	node := fs.String("node", "", "node to restart (all of it, or only -component)")
	component := fs.String("component", "", "containerd, kubelet or kube-proxy; or kube-apiserver without -node")
	fs.Parse(args)
	c, err := cluster.Load(*dir, logf)
	if err != nil {
		return err
	}
	switch {
	case *node == "" && *component == "kube-apiserver":
		return c.RestartAPIServer(ctx)
	case *node != "" && *component == "":
		return c.RestartNode(ctx, *node)
	case *node != "":
		return c.RestartProcess(ctx, *node, *component)
	}
	return fmt.Errorf("restart: give -node, -node and -component, or -component kube-apiserver")
}
