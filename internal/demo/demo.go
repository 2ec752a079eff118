// Package demo is knext-demo (cmd/knext-demo): it shows knext running pods without CNI: it starts a knext containerd with
// disable_cni = true in a self-contained directory (default build/demo), shows that the network
// is not ready until the NRI plugin nri-bridge connects, runs two pods with a busybox container
// each, prints their IPs as `crictl inspectp` shows them (with the source of every IP), pings one
// pod from the other, and removes everything again, also on Ctrl-C or failure. It builds
// nothing: run it after `make build images` (as root):
//
//	go run ./cmd/knext-demo [-root build/demo] [-nri-bridge build/bin/nri-bridge] [-wait]
package demo

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log"
	"net/netip"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	criruntime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/knext-dev/knext/internal/ociimage"
	"github.com/knext-dev/knext/internal/stack"
)

// Main runs the demo with the command line of the process.
func Main() {
	root := flag.String("root", filepath.Join("build", "demo"), "directory for the demo's containerd (created, then removed)")
	bridge := flag.String("nri-bridge", defaultNRIBridge(), "nri-bridge binary")
	wait := flag.Bool("wait", false, "keep the pods running until Ctrl-C, to explore them with crictl")
	flag.Parse()
	log.SetFlags(0)
	log.SetPrefix("demo: ")
	log.SetOutput(os.Stdout) // one stream, in order with the crictl output

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, *root, *bridge, *wait); err != nil {
		if ctx.Err() != nil {
			log.Print("interrupted")
		}
		log.Print(err)
		os.Exit(1)
	}
}

// defaultNRIBridge is $KNEXT_BIN_DIR/nri-bridge, else nri-bridge next to the demo's binary (both
// are in build/bin after `make build demo`).
func defaultNRIBridge() string {
	if dir := os.Getenv("KNEXT_BIN_DIR"); dir != "" {
		return filepath.Join(dir, "nri-bridge")
	}
	if self, err := os.Executable(); err == nil {
		return filepath.Join(filepath.Dir(self), "nri-bridge")
	}
	return "nri-bridge"
}

func run(ctx context.Context, root, bridgeBinary string, wait bool) (err error) {
	if _, err := os.Stat(bridgeBinary); err != nil {
		return fmt.Errorf("nri-bridge binary: %w (run `make build` or pass -nri-bridge)", err)
	}
	h, err := stack.New(ctx, stack.Options{Root: root, Logf: log.Printf, ExtraConfig: stack.CNILessConfig(stack.NRIBridgePlugin), SkipNetworkReadyWait: true})
	if err != nil {
		return err
	}
	defer func() {
		log.Printf("cleaning up %s (pods, nri-bridge, containerd, shims, mounts, bridge %s, cgroups)", h.Root, h.Bridge)
		err = errors.Join(err, h.Close())
	}()
	version, err := h.Runtime.Version(ctx, &criruntime.VersionRequest{})
	if err != nil {
		return err
	}
	log.Printf("%s %s is up with disable_cni = true: socket %s, log %s", version.RuntimeName, version.RuntimeVersion, h.Address, h.LogPath)
	if err := showNetworkReady(ctx, h); err != nil {
		return err
	}

	args := h.NRIBridgeArgs("-ipv4-subnet", h.Subnet.String(), "-ipv6-subnet", h.NRIBridgeIPv6Subnet())
	log.Printf("starting the NRI plugin: nri-bridge %s", strings.Join(args, " "))
	if _, err := h.StartNRIBridge(ctx, bridgeBinary, args...); err != nil {
		return err
	}
	if err := showNetworkReady(ctx, h); err != nil {
		return err
	}

	containerFile, err := h.WriteJSON("container", h.ContainerConfig("shell", ociimage.BusyboxImage, "sleep", "3600"))
	if err != nil {
		return err
	}
	var pods, containers []string
	for _, name := range []string{"web", "client"} {
		podFile, err := h.WriteJSON("pod-"+name, h.PodConfig(name))
		if err != nil {
			return err
		}
		podID, err := crictl(ctx, h, "runp", podFile)
		if err != nil {
			return err
		}
		pods = append(pods, podID)
		containerID, err := crictl(ctx, h, "create", podID, containerFile, podFile)
		if err != nil {
			return err
		}
		if _, err := crictl(ctx, h, "start", containerID); err != nil {
			return err
		}
		containers = append(containers, containerID)
	}
	if _, err := crictl(ctx, h, "pods"); err != nil {
		return err
	}
	var webIPs []string
	for i, podID := range pods {
		ips, err := showNetwork(ctx, h, podID)
		if err != nil {
			return err
		}
		if i == 0 {
			webIPs = ips
		}
	}
	if _, err := crictl(ctx, h, "exec", containers[1], "ip", "addr", "show", "eth0"); err != nil {
		return err
	}
	for _, ip := range webIPs {
		if _, err := crictl(ctx, h, "exec", containers[1], "ping", "-c", "2", "-W", "5", ip); err != nil {
			return err
		}
	}

	if wait {
		fmt.Printf("\nThe pods keep running until Ctrl-C. In another shell:\n  export %s\n  crictl pods\n",
			strings.Join(h.Env(), " "))
		<-ctx.Done()
		return nil
	}
	for _, podID := range pods {
		if _, err := crictl(ctx, h, "stopp", podID); err != nil {
			return err
		}
		if _, err := crictl(ctx, h, "rmp", podID); err != nil {
			return err
		}
	}
	return nil
}

// crictl runs and echoes a crictl command and returns its trimmed output.
func crictl(ctx context.Context, h *stack.Stack, args ...string) (string, error) {
	fmt.Printf("\n$ crictl %s\n", strings.Join(args, " "))
	out, err := h.Crictl(ctx, args...)
	fmt.Print(string(out))
	return string(bytes.TrimSpace(out)), err
}

// showNetworkReady prints the NetworkReady condition as `crictl info` shows it.
func showNetworkReady(ctx context.Context, h *stack.Stack) error {
	fmt.Printf("\n$ crictl info  # .status.conditions[NetworkReady]\n")
	out, err := h.Crictl(ctx, "info", "-o", "json")
	if err != nil {
		return err
	}
	var info struct {
		Status struct {
			Conditions []json.RawMessage `json:"conditions"`
		} `json:"status"`
	}
	if err := json.Unmarshal(out, &info); err != nil {
		return fmt.Errorf("crictl info: %w", err)
	}
	for _, raw := range info.Status.Conditions {
		var cond struct{ Type string }
		if err := json.Unmarshal(raw, &cond); err == nil && cond.Type == criruntime.NetworkReady {
			return printJSON(raw)
		}
	}
	return fmt.Errorf("crictl info shows no %s condition:\n%s", criruntime.NetworkReady, out)
}

// showNetwork prints the network part of `crictl inspectp`: the pod's IPs and where each comes
// from. It returns the pod's IPs, primary first.
func showNetwork(ctx context.Context, h *stack.Stack, podID string) ([]string, error) {
	fmt.Printf("\n$ crictl inspectp %s  # .status.network, .podNetwork\n", podID)
	out, err := h.Crictl(ctx, "inspectp", "-o", "json", podID)
	if err != nil {
		return nil, err
	}
	var inspect struct {
		Status struct {
			Network json.RawMessage `json:"network"`
		} `json:"status"`
		PodNetwork json.RawMessage `json:"podNetwork"`
	}
	if err := json.Unmarshal(out, &inspect); err != nil {
		return nil, fmt.Errorf("crictl inspectp %s: %w", podID, err)
	}
	for _, part := range []json.RawMessage{inspect.Status.Network, inspect.PodNetwork} {
		if err := printJSON(part); err != nil {
			return nil, fmt.Errorf("crictl inspectp %s: %w", podID, err)
		}
	}
	var network struct {
		IP            string `json:"ip"`
		AdditionalIPs []struct {
			IP string `json:"ip"`
		} `json:"additionalIps"`
	}
	if err := json.Unmarshal(inspect.Status.Network, &network); err != nil {
		return nil, fmt.Errorf("crictl inspectp %s: network status: %w", podID, err)
	}
	if _, err := netip.ParseAddr(network.IP); err != nil {
		return nil, fmt.Errorf("pod %s has no IP (%q): see %s", podID, network.IP, h.LogPath)
	}
	ips := []string{network.IP}
	for _, ip := range network.AdditionalIPs {
		ips = append(ips, ip.IP)
	}
	return ips, nil
}

func printJSON(raw json.RawMessage) error {
	var indented bytes.Buffer
	if err := json.Indent(&indented, raw, "", "  "); err != nil {
		return fmt.Errorf("%q: %w", raw, err)
	}
	fmt.Println(indented.String())
	return nil
}
