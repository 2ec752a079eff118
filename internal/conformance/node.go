package conformance

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/vishvananda/netlink"
	criruntime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/knext-dev/knext/internal/conformance/critestimages"
	"github.com/knext-dev/knext/internal/registry"
	"github.com/knext-dev/knext/internal/stack"
)

const (
	// nodeCommandName runs one configuration; run starts it in fresh namespaces.
	nodeCommandName = "node"
	reportFile      = "report.json"
	// rerunsDir holds, in a configuration's result directory, the reruns of the specs that
	// differed: report-<i>.json and critest-<i>.log for rerun i.
	rerunsDir = "reruns"

	// digestSpec is skipped: its image reference pins the digest of the upstream manifest, which
	// no rebuilt image can have.
	digestSpec = "public image with digest should be pulled and removed"
	// critestTimeout bounds one critest run (it takes about 2.5 minutes).
	critestTimeout = 30 * time.Minute
)

// rerunReport is where rerun i (from 1) of a configuration's differing specs leaves its report.
func rerunReport(configDir string, i int) string {
	return filepath.Join(configDir, rerunsDir, fmt.Sprintf("report-%d.json", i))
}

func nodeCommand(args []string) error {
	fs := flag.NewFlagSet(nodeCommandName, flag.ExitOnError)
	var p options
	p.register(fs)
	name := fs.String("config", "", "configuration to run")
	reruns := fs.Int("reruns", 0, "run critest this many times, the reruns of the specs -focus selects, into <out>/<config>/"+rerunsDir+
		" (0: the first run, into <out>/<config>)")
	fs.Parse(args)
	c, err := configurationNamed(*name)
	if err != nil {
		return err
	}
	if err := p.check(); err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	return runConfiguration(ctx, c, p, *reruns)
}

// runConfiguration starts the registry and containerd of configuration c in the current (fresh)
// network namespace, runs critest against them, once or, with reruns, that many times, and leaves
// its reports and the logs in the configuration's result directory (the reruns' in rerunsDir).
func runConfiguration(ctx context.Context, c configuration, p options, reruns int) (err error) {
	dir := filepath.Join(p.out, c.name)
	if reruns > 0 {
		dir = filepath.Join(dir, rerunsDir)
	}
	log.Printf("%s: %s", c.name, c.title)
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		return err
	}
	if err := netlink.LinkSetUp(lo); err != nil {
		return fmt.Errorf("loopback up: %w", err)
	}

	registryAddr, stopRegistry, err := serveImages(p.images, filepath.Join(dir, "registry.log"), filepath.Join(dir, "certs.d"))
	if err != nil {
		return err
	}
	defer stopRegistry()

	// critest pulls fully qualified references (registry.k8s.io/..., gcr.io/..., k8s.gcr.io/...):
	// containerd resolves every one of those registries through the local one (certs.d/<host>/
	// hosts.toml), and the sandbox image is one of them.
	extra := fmt.Sprintf("[plugins.'io.containerd.cri.v1.images'.registry]\nconfig_path = %q\n"+
		"[plugins.'io.containerd.cri.v1.images'.pinned_images]\nsandbox = %q\n",
		filepath.Join(dir, "certs.d"), critestimages.SandboxImage)
	if c.cniLess {
		extra += stack.CNILessConfig(stack.NRIBridgePlugin)
	}
	opts := stack.Options{
		BinDir:               p.binDir,
		Containerd:           filepath.Join(p.binDir, "containerd"),
		ExtraConfig:          extra,
		CNIPortMappings:      !c.cniLess,
		SkipNetworkReadyWait: c.cniLess,
		Logf:                 log.Printf,
	}
	if c.upstream {
		opts.Containerd = filepath.Join(p.upstreamBinDir, "containerd")
	}
	h, err := stack.New(ctx, opts)
	if err != nil {
		return err
	}
	defer func() {
		// The harness removes its root: keep the logs.
		for _, name := range []string{"containerd.log", "nri-bridge.log"} {
			if cpErr := copyFile(filepath.Join(h.Root, name), filepath.Join(dir, name)); cpErr != nil && !errors.Is(cpErr, os.ErrNotExist) {
				err = errors.Join(err, cpErr)
			}
		}
		err = errors.Join(err, h.Close())
	}()
	log.Printf("%s: containerd %s on %s, registry on %s", c.name, opts.Containerd, h.Address, registryAddr)

	// A first pull proves the mirror path before critest depends on it.
	if _, err := h.Images.PullImage(ctx, &criruntime.PullImageRequest{Image: &criruntime.ImageSpec{Image: critestimages.SandboxImage}}); err != nil {
		return fmt.Errorf("pull %s through the local registry %s: %w\n%s", critestimages.SandboxImage, registryAddr, err, h.LogTail(20))
	}
	if c.cniLess {
		if _, err := h.StartNRIBridge(ctx, filepath.Join(p.binDir, "nri-bridge"), h.NRIBridgeArgs("-ipv4-subnet", h.Subnet.String())...); err != nil {
			return err
		}
	}
	if reruns == 0 {
		return runCritest(ctx, h, p.critest, p.focus, filepath.Join(dir, "critest.log"), filepath.Join(dir, reportFile))
	}
	for i := 1; i <= reruns; i++ {
		report := rerunReport(filepath.Dir(dir), i)
		if err := runCritest(ctx, h, p.critest, p.focus, filepath.Join(dir, fmt.Sprintf("critest-%d.log", i)), report); err != nil {
			return err
		}
	}
	return nil
}

// serveImages serves the image archive over TLS on a free port of 127.0.0.1 and makes certsDir a
// registry config_path that points containerd at it for each of its registry hosts.
func serveImages(archive, logPath, certsDir string) (addr string, stop func(), err error) {
	logFile, err := os.Create(logPath)
	if err != nil {
		return "", nil, err
	}
	srv, err := registry.Serve(registry.Options{
		Listen: "127.0.0.1:0", Archives: []string{archive}, Log: log.New(logFile, "", log.LstdFlags),
	})
	if err != nil {
		logFile.Close()
		return "", nil, err
	}
	stop = func() { srv.Close(); logFile.Close() }
	if err := srv.WriteHostsDir(certsDir); err != nil {
		stop()
		return "", nil, err
	}
	return srv.Addr, stop, nil
}

// runCritest runs critest against the harness, with its NRI specs on the harness's NRI socket,
// its output into logPath and its JSON report into report. A critest that fails specs exits
// non-zero: only a missing report is an error here.
func runCritest(ctx context.Context, h *stack.Stack, critest, focus, logPath, report string) error {
	logFile, err := os.Create(logPath)
	if err != nil {
		return err
	}
	defer logFile.Close()
	endpoint := "unix://" + h.Address
	args := []string{
		"-runtime-endpoint", endpoint, "-image-endpoint", endpoint,
		"-config", h.CrictlConfigPath, // not the host's /etc/crictl.yaml
		"-nri-socket", h.NRISocket,
		"-ginkgo.skip", digestSpec,
		"-ginkgo.timeout", critestTimeout.String(),
		"-ginkgo.no-color",
		"-ginkgo.json-report", report,
	}
	if focus != "" {
		args = append(args, "-ginkgo.focus", focus)
	}
	log.Printf("critest %v", args)
	cmd := exec.CommandContext(ctx, critest, args...)
	// Interrupted, Ginkgo still runs the specs' clean-ups and writes its report.
	cmd.Cancel = func() error { return cmd.Process.Signal(os.Interrupt) }
	cmd.WaitDelay = time.Minute
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.Dir = filepath.Dir(report)
	start := time.Now()
	runErr := cmd.Run()
	log.Printf("critest finished in %s: %v", time.Since(start).Round(time.Second), runErr)
	if _, err := os.Stat(report); err != nil {
		return fmt.Errorf("critest wrote no report (%v): see %s", runErr, logFile.Name())
	}
	return ctx.Err()
}

func copyFile(from, to string) error {
	in, err := os.Open(from)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.Create(to)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
