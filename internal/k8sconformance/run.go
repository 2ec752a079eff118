package k8sconformance

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/knext-dev/knext/internal/cluster"
)

// runner runs e2e.test on a fresh cluster of each runtime.
type runner struct {
	e2eTest string // the suite's binary
	images  string // the archive of the images its specs run (the images command)
	nodes   int
	out     string        // the results directory
	timeout time.Duration // of one e2e.test run
	logf    func(string, ...any)
}

// attempt is one run of e2e.test on one cluster, as run.json records it.
type attempt struct {
	Column string `json:"column"`
	Number int    `json:"number"` // 1: the first run; then the reruns
	Focus  string `json:"focus"`
	// Dir holds the run's JUnit report (junit_01.xml), e2e.test's output (e2e.log) and the
	// cluster's logs (logs/), relative to the results directory.
	Dir       string  `json:"dir"`
	ClusterUp float64 `json:"clusterUpSeconds"`
	Suite     float64 `json:"suiteSeconds"` // e2e.test's run
}

// junitReport is where e2e.test writes its JUnit report in --report-dir.
const junitReport = "junit_01.xml"

// run brings up a cluster of the column's runtime with the images, runs e2e.test with focus on
// it, keeps the cluster's logs and removes it. It fails when e2e.test wrote no JUnit report, not
// when specs fail: the report says which.
func (r *runner) run(ctx context.Context, a *attempt) (err error) {
	dir := filepath.Join(r.out, a.Dir)
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	// Unix socket paths under the cluster directory are limited to 108 bytes: keep it short.
	clusterDir, err := os.MkdirTemp("", "knc-")
	if err != nil {
		return err
	}
	cfg, err := cluster.EnvConfig(clusterDir, r.nodes, a.Column)
	if err != nil {
		return err
	}
	cfg.Images = append(cfg.Images, r.images)
	cfg.Logf = r.logf
	start := time.Now()
	c, err := cluster.Up(ctx, cfg)
	a.ClusterUp = time.Since(start).Seconds()
	if c == nil {
		_ = os.Remove(clusterDir) // empty: Up failed before creating anything
	} else {
		defer func() {
			keepLogs(c, filepath.Join(dir, "logs"), r.logf)
			if downErr := cluster.Down(c.Dir, r.logf); downErr != nil {
				err = errors.Join(err, downErr)
			}
		}()
	}
	if err != nil {
		return fmt.Errorf("%s cluster: %w", a.Column, err)
	}
	r.logf("%s run %d: e2e.test --ginkgo.focus=%q (output: %s)", a.Column, a.Number, a.Focus, filepath.Join(dir, "e2e.log"))
	start = time.Now()
	err = r.e2e(ctx, c, dir, a.Focus)
	a.Suite = time.Since(start).Seconds()
	if _, statErr := os.Stat(filepath.Join(dir, junitReport)); statErr != nil {
		return fmt.Errorf("%s run %d wrote no JUnit report (%v): see %s", a.Column, a.Number, err, filepath.Join(dir, "e2e.log"))
	}
	return nil
}

// e2e runs e2e.test against the cluster, its output into dir/e2e.log and its JUnit report into
// dir. Its exit status only says whether every spec passed.
func (r *runner) e2e(ctx context.Context, c *cluster.Cluster, dir, focus string) error {
	// Ginkgo times the suite out itself (and still writes the report); this is the backstop.
	ctx, cancel := context.WithTimeout(ctx, r.timeout+5*time.Minute)
	defer cancel()
	log, err := os.Create(filepath.Join(dir, "e2e.log"))
	if err != nil {
		return err
	}
	defer log.Close()
	cmd := exec.CommandContext(ctx, r.e2eTest,
		"--kubeconfig="+c.Kubeconfig(),
		"--kubectl-path="+filepath.Join(c.Binaries.Kubernetes, "kubectl"),
		"--provider=skeleton",
		"--report-dir="+dir,
		"--ginkgo.focus="+focus,
		"--ginkgo.timeout="+r.timeout.String(),
		"--ginkgo.no-color")
	cmd.Dir, cmd.Stdout, cmd.Stderr = dir, log, log
	// Ginkgo's own interrupt handling reports what ran so far; the cluster goes anyway.
	cmd.Cancel = func() error { return cmd.Process.Signal(os.Interrupt) }
	cmd.WaitDelay = time.Minute
	return cmd.Run()
}

// keepLogs copies the log of every process of the cluster into dir, as <process>.log
// ("node-1-kubelet.log"), before Down removes them.
func keepLogs(c *cluster.Cluster, dir string, logf func(string, ...any)) {
	processes := slices.Collect(maps.Values(c.ControlPlane.Processes))
	for _, n := range c.Nodes {
		processes = append(processes, slices.Collect(maps.Values(n.Processes))...)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		logf("keeping the cluster's logs: %v", err)
		return
	}
	for _, p := range processes {
		name := strings.ReplaceAll(p.Name, "/", "-") + ".log"
		data, err := os.ReadFile(p.Log)
		if err == nil {
			err = os.WriteFile(filepath.Join(dir, name), data, 0o644)
		}
		if err != nil {
			logf("keeping the cluster's logs: %v", err)
		}
	}
}
