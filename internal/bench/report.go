package bench

import (
	"debug/buildinfo"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/procfs"
)

// report is the bench's JSON report: the machine, the settings, every timed phase with the load
// during it, and every measurement in Go's benchmark format. The page's tables, plots and
// verdicts are computed from it (tables.go, doc.go).
type report struct {
	Started        time.Time         `json:"started"`
	Finished       time.Time         `json:"finished"`
	Machine        machine           `json:"machine"`
	Settings       settings          `json:"settings"`
	Configurations []configuration   `json:"configurations"`
	Binaries       map[string]string `json:"binaries"` // --version of each daemon
	// DependencyDifferences are the modules linked at other versions into the two daemons than
	// the patched ones: none, when the daemons differ by knext's patches only.
	DependencyDifferences []string `json:"dependencyDifferences"`
	Phases                []Phase  `json:"phases"`
	// Redone counts the rounds measured again for the load; KeptLoaded those kept after
	// -max-redos attempts.
	Redone     int `json:"redone"`
	KeptLoaded int `json:"keptLoaded"`
	// ClusterIdle is the share of the CPUs the idle clusters used: the cluster part's quiet floor.
	ClusterIdle float64  `json:"clusterIdle"`
	Results     []string `json:"results"`

	meter *loadMeter
	file  string // the report's file name, as the page links it
}

// partOf is the part that measures each benchmark, by the first element of its name.
var partOf = map[string]string{"Status": "status", "PluginCalls": "status", "RunPodSandbox": "lifecycle", "StopRemove": "lifecycle",
	"ScaleSweep": "scale", "RestartReady": "scale", "RestartAnswered": "scale", "Cluster": "cluster"}

// parts are the parts r holds measurements of, in the order it measured them.
func (r *report) parts() (parts []string) {
	for _, line := range r.Results {
		name, _, _ := strings.Cut(strings.TrimPrefix(line, "Benchmark"), "/")
		if !slices.Contains(parts, partOf[name]) {
			parts = append(parts, partOf[name])
		}
	}
	return parts
}

// merged is one report of the runs of reports, each of other parts: their measurements and counts
// of redone rounds together, the first's settings but the cluster's, from the run of that part.
func merged(reports []*report) (*report, error) {
	m, measured := *reports[0], map[string]string{} // part → report
	m.Results, m.Redone, m.KeptLoaded = nil, 0, 0
	for _, r := range reports {
		for _, part := range r.parts() {
			if other, twice := measured[part]; twice {
				return nil, fmt.Errorf("reports %s and %s both measure part %s", other, r.file, part)
			}
			measured[part] = r.file
			if part == "cluster" {
				m.Settings.ClusterNodes, m.Settings.ClusterPods, m.Settings.NodePods = r.Settings.ClusterNodes, r.Settings.ClusterPods, r.Settings.NodePods
			}
		}
		m.Results, m.Redone, m.KeptLoaded = append(m.Results, r.Results...), m.Redone+r.Redone, m.KeptLoaded+r.KeptLoaded
	}
	return &m, nil
}

type machine struct {
	CPU    string `json:"cpu"`
	CPUs   int    `json:"cpus"`
	Kernel string `json:"kernel"`
	Memory string `json:"memory"`
	Go     string `json:"go"`
}

func newReport(s settings) (*report, error) {
	fs, err := procfs.NewDefaultFS()
	if err != nil {
		return nil, err
	}
	m := machine{CPUs: runtime.NumCPU(), Go: runtime.Version()}
	if cpus, err := fs.CPUInfo(); err == nil && len(cpus) > 0 {
		m.CPU = cpus[0].ModelName
	}
	if mem, err := fs.Meminfo(); err == nil && mem.MemTotal != nil {
		m.Memory = fmt.Sprintf("%.1f GiB", float64(*mem.MemTotal)/(1<<20))
	}
	if release, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = strings.TrimSpace(string(release))
	}
	r := &report{Started: time.Now().UTC(), Machine: m, Settings: s, Configurations: configurations(), Binaries: map[string]string{},
		DependencyDifferences: dependencyDifferences(s.Upstream, s.Knext), meter: &loadMeter{fs: fs, shims: map[string]bool{}}}
	for key, binary := range map[string]string{"knext": s.Knext, "upstream": s.Upstream} {
		out, err := exec.Command(binary, "--version").Output()
		r.Binaries[key] = strings.TrimSpace(string(out))
		if err != nil {
			r.Binaries[key] = fmt.Sprintf("%s --version: %v", binary, err)
		}
		shim, err := filepath.EvalSymlinks(filepath.Join(filepath.Dir(binary), "containerd-shim-runc-v2"))
		if err == nil {
			shim, err = filepath.Abs(shim)
		}
		if err != nil {
			return nil, fmt.Errorf("the shim next to %s: %w", binary, err)
		}
		r.meter.shims[shim] = true
	}
	return r, nil
}

// dependencyDifferences lists them (knext's patched modules are built from the workspace).
func dependencyDifferences(upstream, knext string) []string {
	versions := map[string][2]string{}
	for side, binary := range []string{upstream, knext} {
		info, err := buildinfo.ReadFile(binary)
		if err != nil {
			return []string{err.Error()}
		}
		for _, dep := range info.Deps {
			v := versions[dep.Path]
			v[side] = dep.Version
			versions[dep.Path] = v
		}
	}
	diffs := []string{}
	for path, v := range versions {
		if path != "github.com/containerd/containerd/v2" && path != "github.com/containerd/nri" && v[0] != v[1] {
			diffs = append(diffs, fmt.Sprintf("%s: upstream %q, knext %q", path, v[0], v[1]))
		}
	}
	slices.Sort(diffs)
	return diffs
}

func (r *report) write(path string) error {
	data, err := json.MarshalIndent(r, "", " ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return os.WriteFile(path, append(data, '\n'), 0o644)
}

func readReport(path string) (*report, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	r := &report{file: filepath.Base(path)}
	if err := json.Unmarshal(data, r); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return r, nil
}
