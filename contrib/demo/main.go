// Command demo shows knext running a real pod: it starts a knext containerd in a self-contained
// directory (default build/demo), runs a pod and a busybox container in it with crictl, prints the
// pod's network status as `crictl inspectp` shows it, and removes everything again, also on
// Ctrl-C or failure. It builds nothing: run it after `make build images` (as root):
//
//	go run ./contrib/demo [-root build/demo] [-wait]
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	criruntime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/knext-dev/knext/contrib/images/testimages"
	"github.com/knext-dev/knext/integration/harness"
)

func main() {
	root := flag.String("root", filepath.Join("build", "demo"), "directory for the demo's containerd (created, then removed)")
	wait := flag.Bool("wait", false, "keep the pod running until Ctrl-C, to explore it with crictl")
	flag.Parse()
	log.SetFlags(0)
	log.SetPrefix("demo: ")
	log.SetOutput(os.Stdout) // one stream, in order with the crictl output

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, *root, *wait); err != nil {
		if ctx.Err() != nil {
			log.Print("interrupted")
		}
		log.Print(err)
		os.Exit(1)
	}
}

func run(ctx context.Context, root string, wait bool) (err error) {
	h, err := harness.New(ctx, harness.Options{Root: root, Logf: log.Printf})
	if err != nil {
		return err
	}
	defer func() {
		log.Printf("cleaning up %s (pods, containerd, shims, mounts, bridge %s, cgroups)", h.Root, h.Bridge)
		err = errors.Join(err, h.Close())
	}()
	version, err := h.Runtime.Version(ctx, &criruntime.VersionRequest{})
	if err != nil {
		return err
	}
	log.Printf("%s %s is up: socket %s, log %s, CNI bridge %s on %s", version.RuntimeName, version.RuntimeVersion,
		h.Address, h.LogPath, h.Bridge, h.Subnet)

	podConfig := h.PodConfig("demo")
	podFile, err := h.WriteJSON("pod", podConfig)
	if err != nil {
		return err
	}
	containerFile, err := h.WriteJSON("container", h.ContainerConfig("shell", testimages.BusyboxImage, "sleep", "3600"))
	if err != nil {
		return err
	}

	podID, err := crictl(ctx, h, "runp", podFile)
	if err != nil {
		return err
	}
	containerID, err := crictl(ctx, h, "create", podID, containerFile, podFile)
	if err != nil {
		return err
	}
	if _, err := crictl(ctx, h, "start", containerID); err != nil {
		return err
	}
	if _, err := crictl(ctx, h, "pods"); err != nil {
		return err
	}
	if err := showNetwork(ctx, h, podID); err != nil {
		return err
	}
	if _, err := crictl(ctx, h, "exec", containerID, "ip", "-4", "addr", "show", "eth0"); err != nil {
		return err
	}

	if wait {
		fmt.Printf("\nThe pod keeps running until Ctrl-C. In another shell:\n  export %s\n  crictl pods\n",
			strings.Join(h.Env(), " "))
		<-ctx.Done()
		return nil
	}
	if _, err := crictl(ctx, h, "stopp", podID); err != nil {
		return err
	}
	_, err = crictl(ctx, h, "rmp", podID)
	return err
}

// crictl runs and echoes a crictl command and returns its trimmed output.
func crictl(ctx context.Context, h *harness.Harness, args ...string) (string, error) {
	fmt.Printf("\n$ crictl %s\n", strings.Join(args, " "))
	out, err := h.Crictl(ctx, args...)
	fmt.Print(string(out))
	return string(bytes.TrimSpace(out)), err
}

// showNetwork prints the network part of `crictl inspectp`.
func showNetwork(ctx context.Context, h *harness.Harness, podID string) error {
	fmt.Printf("\n$ crictl inspectp %s  # .status.network\n", podID)
	out, err := h.Crictl(ctx, "inspectp", "-o", "json", podID)
	if err != nil {
		return err
	}
	var inspect struct {
		Status struct {
			Network json.RawMessage `json:"network"`
		} `json:"status"`
	}
	if err := json.Unmarshal(out, &inspect); err != nil {
		return fmt.Errorf("crictl inspectp %s: %w", podID, err)
	}
	var network bytes.Buffer
	if err := json.Indent(&network, inspect.Status.Network, "", "  "); err != nil {
		return fmt.Errorf("crictl inspectp %s: network status %q: %w", podID, inspect.Status.Network, err)
	}
	fmt.Println(network.String())
	return nil
}
