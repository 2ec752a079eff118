package conformance

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/knext-dev/knext/internal/compare"
)

// configuration is one runtime set-up critest runs against.
type configuration struct {
	name     string // column and directory name
	title    string
	upstream bool // pristine upstream containerd instead of knext
	cniLess  bool // disable_cni = true and nri-bridge as the pod network, instead of CNI
}

var configurations = []configuration{
	{name: "upstream-cni", title: "upstream containerd with CNI (bridge, host-local, portmap, loopback)", upstream: true},
	{name: "knext-cni", title: "knext with the same CNI"},
	{name: "knext-cniless", title: "knext CNI-less (disable_cni = true) with nri-bridge", cniLess: true},
}

func configurationNamed(name string) (configuration, error) {
	var names []string
	for _, c := range configurations {
		if c.name == name {
			return c, nil
		}
		names = append(names, c.name)
	}
	return configuration{}, fmt.Errorf("unknown configuration %q (have %s)", name, strings.Join(names, ", "))
}

// options are the inputs of a run, passed on from run to each node.
type options struct {
	critest, images, binDir, upstreamBinDir, out string
	focus                                        string // critest's -ginkgo.focus; empty: every spec
}

func (p *options) register(fs *flag.FlagSet) {
	fs.StringVar(&p.critest, "critest", "", "critest binary (sigs.k8s.io/cri-tools/cmd/critest)")
	fs.StringVar(&p.images, "images", "", "archive of the images critest pulls (knext-conformance images)")
	fs.StringVar(&p.binDir, "bin-dir", os.Getenv("KNEXT_BIN_DIR"), "knext's binaries: containerd, containerd-shim-runc-v2, ctr, nri-bridge (make build)")
	fs.StringVar(&p.upstreamBinDir, "upstream-bin-dir", os.Getenv("KNEXT_UPSTREAM_BIN_DIR"), "upstream containerd and its shim (make upstream)")
	fs.StringVar(&p.out, "out", "", "directory for the results: <out>/<configuration>/{critest.log,report.json,...}")
	fs.StringVar(&p.focus, "focus", "", "run only the specs matching this regular expression (critest -ginkgo.focus)")
}

func (p *options) args() []string {
	return []string{"-critest", p.critest, "-images", p.images, "-bin-dir", p.binDir,
		"-upstream-bin-dir", p.upstreamBinDir, "-out", p.out, "-focus", p.focus}
}

// check makes the paths absolute and checks that the inputs exist.
func (p *options) check() error {
	var errs []error
	for _, f := range []struct{ flag, value string }{{"-critest", p.critest}, {"-images", p.images},
		{"-bin-dir", p.binDir}, {"-upstream-bin-dir", p.upstreamBinDir}, {"-out", p.out}} {
		if f.value == "" {
			errs = append(errs, fmt.Errorf("%s is required", f.flag))
		}
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	// critest runs in its result directory.
	for _, path := range []*string{&p.critest, &p.images, &p.binDir, &p.upstreamBinDir, &p.out} {
		abs, err := filepath.Abs(*path)
		if err != nil {
			return err
		}
		*path = abs
	}
	for _, path := range []string{p.critest, p.images, filepath.Join(p.binDir, "containerd"),
		filepath.Join(p.binDir, "nri-bridge"), filepath.Join(p.upstreamBinDir, "containerd")} {
		if _, err := os.Stat(path); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func runCommand(args []string) error {
	fs := flag.NewFlagSet("run", flag.ExitOnError)
	var p options
	p.register(fs)
	parallel := fs.Bool("parallel", false, "run the configurations at the same time (each has its own network namespace)")
	only := fs.String("only", "", "comma-separated configurations to run (default: all)")
	reruns := fs.Int("reruns", compare.DefaultReruns, "run each spec that differs from the first configuration this many times more, in every configuration")
	fs.Parse(args)
	if err := p.check(); err != nil {
		return err
	}
	if os.Geteuid() != 0 {
		return errors.New("needs root (containerd, network namespaces)")
	}
	// In the order of configurations: the first is what the others are compared with.
	selected := configurations
	if *only != "" {
		names := strings.Split(*only, ",")
		for _, name := range names {
			if _, err := configurationNamed(name); err != nil {
				return err
			}
		}
		selected = slices.DeleteFunc(slices.Clone(configurations), func(c configuration) bool { return !slices.Contains(names, c.name) })
	}

	// A Ctrl-C reaches every node too (same process group); they clean up and exit, and this
	// process waits for them instead of dying first.
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	self, err := os.Executable()
	if err != nil {
		return err
	}
	fmt.Printf("critest %s against %d configurations, %s; results in %s\n", filepath.Base(p.critest),
		len(selected), map[bool]string{true: "in parallel", false: "one after the other"}[*parallel], p.out)
	start := time.Now()
	results := make([]*result, len(selected))
	eachConfiguration(selected, *parallel, func(i int, c configuration) {
		results[i] = &result{config: c}
		results[i].duration, results[i].err = runNode(ctx, self, c, p, 0)
		if results[i].err == nil {
			results[i].specs, results[i].err = readReport(filepath.Join(p.out, c.name, reportFile))
		}
		fmt.Printf("  %-14s %s in %s\n", c.name, results[i].summary(), results[i].duration.Round(time.Second))
	})

	// What differs from the first configuration runs again, in every configuration, and only that.
	if differing := compareResults(results).differing(); len(differing) > 0 && *reruns > 0 {
		fmt.Printf("%d spec(s) differ from %s: running them %d more times in every configuration\n", len(differing), results[0].config.name, *reruns)
		rerun := p
		rerun.focus = compare.GinkgoFocus(differing)
		eachConfiguration(selected, *parallel, func(i int, c configuration) {
			r := results[i]
			duration, err := runNode(ctx, self, c, rerun, *reruns)
			r.duration += duration
			if err != nil {
				r.err = errors.Join(r.err, err)
			} else {
				r.readReruns(filepath.Join(p.out, c.name), *reruns)
			}
			fmt.Printf("  %-14s reruns in %s\n", c.name, duration.Round(time.Second))
		})
	}
	fmt.Printf("all configurations: %s\n\n", time.Since(start).Round(time.Second))

	return printComparison(results)
}

// eachConfiguration calls run for each configuration, at the same time or one after the other.
func eachConfiguration(configs []configuration, parallel bool, run func(int, configuration)) {
	var wg sync.WaitGroup
	for i, c := range configs {
		if parallel {
			wg.Go(func() { run(i, c) })
		} else {
			run(i, c)
		}
	}
	wg.Wait()
}

// reportCommand prints the comparison of the reports a run left in -out.
func reportCommand(args []string) error {
	fs := flag.NewFlagSet("report", flag.ExitOnError)
	out := fs.String("out", "", "directory a run wrote its results to")
	fs.Parse(args)
	if *out == "" {
		fs.Usage()
		os.Exit(2)
	}
	var results []*result
	for _, c := range configurations {
		path := filepath.Join(*out, c.name, reportFile)
		if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
			continue // not run
		}
		r := &result{config: c}
		r.specs, r.err = readReport(path)
		dir, reruns := filepath.Join(*out, c.name), 0
		for ; ; reruns++ {
			if _, err := os.Stat(rerunReport(dir, reruns+1)); err != nil {
				break
			}
		}
		r.readReruns(dir, reruns)
		results = append(results, r)
	}
	if len(results) == 0 {
		return fmt.Errorf("no %s in %s/<configuration>", reportFile, *out)
	}
	return printComparison(results)
}

func printComparison(results []*result) error {
	comparison := compareResults(results)
	comparison.print(os.Stdout)
	if err := comparison.verdict(); err != nil {
		return err
	}
	fmt.Printf("\nconformance: no configuration regressed against %s (%d spec(s) fixed, %d flaky), none failed a spec everywhere.\n",
		results[0].config.name, len(comparison.selected(compare.Fixed)), len(comparison.selected(compare.Flaky)))
	return nil
}

// runNode runs one configuration in a child process with a network and an IPC namespace of its
// own: critest's fixed host ports (12000-12003), the CNI and nri-bridge bridges and firewall
// rules, host-network pods and critest's shared memory segments all stay in there, so runs
// neither collide with each other nor touch the host's network. With reruns, the child runs
// critest that many times (the node command's -reruns), into the configuration's rerunsDir.
func runNode(ctx context.Context, self string, c configuration, p options, reruns int) (time.Duration, error) {
	start := time.Now()
	dir := filepath.Join(p.out, c.name)
	if reruns > 0 {
		dir = filepath.Join(dir, rerunsDir)
	}
	if err := os.RemoveAll(dir); err != nil {
		return 0, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return 0, err
	}
	log, err := os.Create(filepath.Join(dir, "node.log"))
	if err != nil {
		return 0, err
	}
	defer log.Close()
	if ctx.Err() != nil {
		return 0, ctx.Err()
	}

	// Pdeathsig fires when the thread that started the child ends: keep it until the child exits.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	args := append([]string{nodeCommandName, "-config", c.name, "-reruns", strconv.Itoa(reruns)}, p.args()...)
	cmd := exec.Command(self, args...)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags: syscall.CLONE_NEWNET | syscall.CLONE_NEWIPC,
		Pdeathsig:  syscall.SIGKILL,
	}
	if err := cmd.Run(); err != nil {
		return time.Since(start), fmt.Errorf("%s: %w (see %s)", c.name, err, log.Name())
	}
	return time.Since(start), nil
}
