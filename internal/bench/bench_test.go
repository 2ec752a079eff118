package bench

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/perf/benchmath"

	"github.com/knext-dev/knext/internal/docregion"
)

func summary(center, lo, hi float64) *benchmath.Summary {
	return &benchmath.Summary{Center: center, Lo: lo, Hi: hi}
}

func TestJudgeWidensTheIntervalByTheAAPairs(t *testing.T) {
	narrowAA, wideAA := summary(1, 0.995, 1.005), summary(1, 0.96, 1.05)
	for _, c := range []struct {
		name      string
		ratio, aa *benchmath.Summary
		limit     float64
		want      string
	}{
		{"within the limit, the A/A pair narrow", summary(1.0, 0.99, 1.01), narrowAA, 1.02, met},
		{"within the limit, but the A/A pair reaches 4% below 1", summary(1.0, 0.99, 1.01), wideAA, 1.02, unresolved},
		{"beyond the limit by more than the A/A pair reaches above 1", summary(1.2, 1.1, 1.3), wideAA, 1.02, missed},
		{"straddles the limit", summary(1.02, 1.0, 1.04), narrowAA, 1.02, unresolved},
		{"well below a limit below 1", summary(0.5, 0.45, 0.55), wideAA, 0.7, met},
		{"too few values for an interval", summary(1, math.Inf(-1), math.Inf(1)), narrowAA, 1.02, unresolved},
		{"no A/A pair", summary(1, 0.99, 1.01), nil, 1.02, unresolved},
		{"not measured", nil, narrowAA, 1.02, notMeasured},
	} {
		if got := judge(c.ratio, c.aa, c.limit); got != c.want {
			t.Errorf("%s: %s, want %s", c.name, got, c.want)
		}
	}
	for verdicts, want := range map[string]string{"met,met": met, "met,unresolved": unresolved, "unresolved,missed": missed,
		"not measured,not measured": notMeasured, "met,not measured": unresolved} {
		if got := overall(strings.Split(verdicts, ",")); got != want {
			t.Errorf("overall(%s) = %s, want %s", verdicts, got, want)
		}
	}
}

// testReport is testdata/report.json, a synthetic report: rounds of paired measurements whose
// base is 1 ms drifting by up to 20% from round to round, both sides alike, and whose ratio is
// 1.00 (knext's Status/c1 and the A/A pair's), 1.01 (the RunPodSandbox reporter's Status/c1), 1.5
// (knext's Status/c16), 1.6 (a status plugin's Status/c1), 1.2 (CNI-less RunPodSandbox/c1 against
// the floor), 0.5 in 4 rounds only (CNI-less StopRemove/c1), 0.9 without an A/A pair (the
// cluster's ready-p50), 1.1 (the cluster's status-p99, ScaleSweep); 3 rounds redone, 1 kept loaded.
func testReport(t *testing.T) *report {
	r, err := readReport(filepath.Join("testdata", "report.json"))
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestTargetsAndSummaryComeFromTheBenchmarkLines(t *testing.T) {
	r := testReport(t)
	s, err := parseSamples(r.Results)
	if err != nil {
		t.Fatal(err)
	}
	rows, verdicts := s.targetRows()
	row := func(what, metric string) []string { // a target's name is on its first row
		name := ""
		for _, row := range slices.Concat(rows...) {
			if row[0] != "" {
				name = row[0]
			}
			if strings.HasPrefix(name, what) && row[1] == metric {
				return row
			}
		}
		t.Fatalf("no row %s %s in %q", what, metric, rows)
		return nil
	}
	for _, c := range []struct{ what, metric, ratio, verdict string }{
		{"Cost when unused: PodSandboxStatus", "Status/c1", "1.00 [1.00–1.00]", met},
		{"Cost when unused: PodSandboxStatus", "Status/c16", "1.50 [1.50–1.50]", missed},
		{"Cost when unused: PodSandboxStatus", "Status/c1-verbose", "–", notMeasured},
		{"CNI-less stop and removal", "StopRemove/c1", "0.50 [-∞–∞]", unresolved},
		{"Cluster: pods Ready", "Cluster/ready-p50", "0.90 [0.90–0.90]", unresolved},
	} {
		if got := row(c.what, c.metric); got[2] != c.ratio || got[5] != c.verdict {
			t.Errorf("%s %s: ratio %s, verdict %s; want %s, %s", c.what, c.metric, got[2], got[5], c.ratio, c.verdict)
		}
	}
	if verdicts[0] != missed || verdicts[len(verdicts)-1] != notMeasured {
		t.Errorf("overall verdicts %q: want the first missed (c16), the last not measured", verdicts)
	}
	summary := s.summaryMarkdown(r)
	for _, want := range []string{
		"- **Cost when unused: PodSandboxStatus**, (knext) ≤ 1.02 × (upstream): **missed**. Status/c1 1.00 [1.00–1.00], A/A 1.00 [1.00–1.00]: met; Status/c16 1.50",
		"- **Cost when unused: pod start and removal**, (knext) ≤ 1.02 × (upstream): **not measured**.\n",
		"3 rounds were discarded and measured again because other processes used more than 25% of the CPUs",
		"1 rounds were kept loaded after 3 attempts each",
	} {
		if !strings.Contains(summary, want) {
			t.Errorf("summary lacks %q:\n%s", want, summary)
		}
	}
	// Upstream's own figures are the base's of every pair; knext's its own.
	tables := s.tables(r.Settings)
	status := tables[slices.IndexFunc(tables, func(t Table) bool { return t.ID == "status" })]
	if want := [][]string{{"upstream", "–", "1.100", "–", "1.100", "–", "–", "–", "–", "–", "–"},
		{"knext", "upstream", "1.101", "1.00 [1.00–1.00]", "1.651", "1.50 [1.50–1.50]", "–", "–", "–", "–", "0.00"},
		{"knext-1-plugin", "upstream", "1.761", "1.60 [1.60–1.60]", "–", "–", "–", "–", "–", "–", "1.00"},
		{"knext-1-run-plugin", "upstream", "1.112", "1.01 [1.01–1.01]", "–", "–", "–", "–", "–", "–", "0.00"},
		{"upstream-again", "upstream", "1.101", "1.00 [1.00–1.00]", "1.101", "1.00 [1.00–1.00]", "–", "–", "–", "–", "–"},
	}; !slices.EqualFunc(status.Rows, want, slices.Equal) {
		t.Errorf("status rows %q, want %q", status.Rows, want)
	}
}

var update = flag.Bool("update", false, "rewrite testdata/rendered.md from testdata/report.json")

// pageRegions are the regions of docs/performance.md that render fills.
var pageRegions = []string{"run", "summary", "targets", "status", "lifecycle", "scale", "cluster", "cluster-endpoints", "cluster-node"}

// Every region of the page rendered from the synthetic report is testdata/rendered.md: what the
// page says, word for word, for a report (go test -update rewrites it after a deliberate change).
func TestRenderFillsEveryRegionAndDrawsThePlots(t *testing.T) {
	regions, plots, err := render([]*report{testReport(t)}, "performance")
	if err != nil {
		t.Fatal(err)
	}
	var page strings.Builder
	for _, id := range pageRegions {
		fmt.Fprintf(&page, "## %s\n\n<!-- bench:%s -->\n<!-- /bench:%s -->\n\n", id, id, id)
	}
	rendered, err := docregion.Fill(page.String(), "bench", regions)
	if err != nil {
		t.Fatal(err)
	}
	golden := filepath.Join("testdata", "rendered.md")
	if *update {
		if err := os.WriteFile(golden, []byte(rendered), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if want, err := os.ReadFile(golden); err != nil || rendered != string(want) {
		t.Errorf("the regions rendered from testdata/report.json differ from %s (%v); rendered:\n%s", golden, err, rendered)
	}
	for _, name := range []string{"targets.svg", "status.svg", "cluster.svg"} {
		if svg := string(plots[name]); !strings.HasPrefix(svg, "<?xml") || !strings.Contains(svg, "</svg>") {
			t.Errorf("%s is no SVG: %.200s", name, svg)
		}
	}
	if _, err := docregion.Fill("<!-- bench:run -->\n<!-- /bench:run -->", "bench", regions); err == nil {
		t.Error("regions the page lacks were dropped silently")
	}
}

// The committed page is what its committed reports render to: no figure or verdict on it that the
// reports do not hold.
func TestPageIsRenderedFromItsReport(t *testing.T) {
	dir := filepath.Join("..", "..", "docs")
	var reports []*report
	for _, name := range []string{"report.json", "cluster.json"} { // make bench-doc's order
		r, err := readReport(filepath.Join(dir, "performance", name))
		if err != nil {
			t.Fatal(err)
		}
		reports = append(reports, r)
	}
	regions, plots, err := render(reports, "performance")
	if err != nil {
		t.Fatal(err)
	}
	page, err := os.ReadFile(filepath.Join(dir, "performance.md"))
	if err != nil {
		t.Fatal(err)
	}
	if rendered, err := docregion.Fill(string(page), "bench", regions); err != nil || rendered != string(page) {
		t.Errorf("docs/performance.md is not what its report renders to (%v): run make bench-doc", err)
	}
	for name, svg := range plots {
		if committed, err := os.ReadFile(filepath.Join(dir, "performance", name)); err != nil || string(committed) != string(svg) {
			t.Errorf("docs/performance/%s is not what its report draws (%v): run make bench-doc", name, err)
		}
	}
}

// The runs of make bench and make bench-cluster, each its own report, render the page as one
// run of every part would, but for the run region, which names both.
func TestReportsOfSeparateRunsRenderAsOne(t *testing.T) {
	whole, nodes, cluster := testReport(t), testReport(t), testReport(t)
	nodes.file, cluster.file = "report.json", "cluster.json"
	nodes.Settings.ClusterPods, cluster.Settings.Repeats = 1, 7
	isCluster := func(line string) bool { return strings.HasPrefix(line, "BenchmarkCluster/") }
	nodes.Results = slices.DeleteFunc(slices.Clone(whole.Results), isCluster)
	cluster.Results = slices.DeleteFunc(slices.Clone(whole.Results), func(line string) bool { return !isCluster(line) })
	nodes.Phases, cluster.Phases = whole.Phases[:1], whole.Phases[1:]
	nodes.Redone, cluster.Redone, nodes.KeptLoaded, cluster.KeptLoaded = 1, whole.Redone-1, 0, whole.KeptLoaded
	if len(cluster.Results) == 0 || len(nodes.Results) == len(whole.Results) {
		t.Fatal("the synthetic report lacks the cluster part or the others")
	}
	want, _, err := render([]*report{whole}, "performance")
	if err != nil {
		t.Fatal(err)
	}
	got, _, err := render([]*report{nodes, cluster}, "performance")
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range pageRegions {
		if id != "run" && got[id] != want[id] {
			t.Errorf("region %s of the two runs differs from the one run's:\n%s\nwant:\n%s", id, got[id], want[id])
		}
	}
	for _, run := range []string{"parts status, lifecycle, scale come from [`report.json`]", "parts cluster come from [`cluster.json`]"} {
		if !strings.Contains(got["run"], run) {
			t.Errorf("the run region does not say %q:\n%s", run, got["run"])
		}
	}
	if _, _, err := render([]*report{whole, cluster}, "performance"); err == nil || !strings.Contains(err.Error(), "both measure part cluster") {
		t.Errorf("two reports measuring the cluster part rendered: %v", err)
	}
}

func TestMeasureRoundRedoesALoadedRound(t *testing.T) {
	rep := &report{Settings: settings{MaxLoad: 0.2, MaxRedos: 2}}
	loads := []float64{0.5, 0.1, 0.9, 0.9, 0.9}
	measure := func(r *round) error {
		r.phases = append(r.phases, Phase{Name: "p", Load: loads[0]})
		r.add(fmt.Sprintf("X/attempt=%d", r.attempt), 1, value(loads[0], "load"))
		loads = loads[1:]
		return nil
	}
	// Round 1: loaded, then quiet. Round 2: loaded thrice, kept.
	for n := 1; n <= 2; n++ {
		if err := rep.measureRound("part", n, measure); err != nil {
			t.Fatal(err)
		}
	}
	var discarded []bool
	for _, p := range rep.Phases {
		discarded = append(discarded, p.Discarded)
	}
	if want := []string{"BenchmarkX/attempt=1 1 0.1 load", "BenchmarkX/attempt=2 1 0.9 load"}; !slices.Equal(rep.Results, want) ||
		rep.Redone != 3 || rep.KeptLoaded != 1 || !slices.Equal(discarded, []bool{true, false, true, true, false}) {
		t.Errorf("results %q, redone %d, kept loaded %d, discarded %v", rep.Results, rep.Redone, rep.KeptLoaded, discarded)
	}
	failure := errors.New("broken")
	if err := rep.measureRound("part", 3, func(*round) error { return failure }); !errors.Is(err, failure) {
		t.Errorf("a failed round: %v", err)
	}
}

func TestOthersShareLeavesOutTheBenchsProcesses(t *testing.T) {
	start := time.Now()
	from := cpuTimes{at: start, busy: 100, ours: map[int]float64{1: 10, 2: 5, 3: 7}}
	// 2 s later: ours +1 s (pid 1) and +0.5 s (pid 4, new), pid 3 exited; others 0.3 s.
	to := cpuTimes{at: start.Add(2 * time.Second), busy: 100 + 1.5 + 0.3, ours: map[int]float64{1: 11, 2: 5, 4: 0.5}}
	cpus := 2 * float64(runtime.NumCPU())
	if others, own := to.shares(from); math.Abs(others-0.3/cpus) > 1e-9 || math.Abs(own-1.5/cpus) > 1e-9 {
		t.Errorf("shares: others' %v, own %v; want %v, %v", others, own, 0.3/cpus, 1.5/cpus)
	}
	if others, own := from.shares(from); others != 0 || own != 0 {
		t.Errorf("shares of no time: %v, %v", others, own)
	}
}

// containerd's metrics, trimmed: an NRI plugin's call and CNI's setup of pods, with buckets.
const metricsText = `# TYPE containerd_nri_plugin_latency_seconds histogram
containerd_nri_plugin_latency_seconds_bucket{operation="RunPodSandbox",plugin="10-bridge",le="0.005"} 2
containerd_nri_plugin_latency_seconds_bucket{operation="RunPodSandbox",plugin="10-bridge",le="0.01"} 3
containerd_nri_plugin_latency_seconds_bucket{operation="RunPodSandbox",plugin="10-bridge",le="+Inf"} 4
containerd_nri_plugin_latency_seconds_sum{operation="RunPodSandbox",plugin="10-bridge"} 0.03
containerd_nri_plugin_latency_seconds_count{operation="RunPodSandbox",plugin="10-bridge"} 4
containerd_nri_plugin_latency_seconds_bucket{operation="PodSandboxStatus",plugin="10-status",le="+Inf"} 4
containerd_nri_plugin_latency_seconds_sum{operation="PodSandboxStatus",plugin="10-status"} 0.002
containerd_nri_plugin_latency_seconds_count{operation="PodSandboxStatus",plugin="10-status"} 4
# TYPE containerd_cri_network_plugin_operations_duration_seconds_seconds histogram
containerd_cri_network_plugin_operations_duration_seconds_seconds_bucket{operation_type="set_up_pod",le="+Inf"} 4
containerd_cri_network_plugin_operations_duration_seconds_seconds_sum{operation_type="set_up_pod"} 0.1
containerd_cri_network_plugin_operations_duration_seconds_seconds_count{operation_type="set_up_pod"} 4
`

func TestHistogramsAreDeltasPerPluginAndOperation(t *testing.T) {
	before, beforeErr := parseHistograms(strings.NewReader(metricsText))
	after, afterErr := parseHistograms(strings.NewReader(strings.NewReplacer(
		`le="0.005"} 2`, `le="0.005"} 3`, `le="0.01"} 3`, `le="0.01"} 12`, `le="+Inf"} 4`, `le="+Inf"} 14`,
		`plugin="10-bridge"} 0.03`, `plugin="10-bridge"} 0.13`, `plugin="10-bridge"} 4`, `plugin="10-bridge"} 14`).Replace(metricsText)))
	if err := errors.Join(beforeErr, afterErr); err != nil {
		t.Fatal(err)
	}
	// 10 more calls taking 100 ms.
	delta := after.since(before)
	if bridge := delta[timerKey{"10-bridge", "RunPodSandbox"}]; bridge.count != 10 || math.Abs(bridge.mean()-0.01) > 1e-9 {
		t.Errorf("bridge's RunPodSandbox: %+v, mean %v; want 10 calls of 10 ms", bridge, bridge.mean())
	}
	if cni := delta[timerKey{cniTimer, "set_up_pod"}]; cni.count != 0 || cni.mean() != 0 {
		t.Errorf("CNI's setup without calls: %+v, mean %v", cni, cni.mean())
	}
	if got := after.add(before, 1).pluginCalls("PodSandboxStatus"); got != 8 {
		t.Errorf("status calls of two nodes = %d, want 8", got)
	}
	if _, err := parseHistograms(strings.NewReader("not metrics {")); err == nil {
		t.Error("malformed metrics were accepted")
	}
}

func TestLoadRecordsEveryCallUntilItsDeadline(t *testing.T) {
	failure := errors.New("odd call")
	seconds, err := load(t.Context(), 4, 20*time.Millisecond, func(_ context.Context, i int) error {
		if i%2 == 1 {
			return failure
		}
		return nil
	})
	var failed, calls int
	if _, scanErr := fmt.Sscanf(fmt.Sprint(err), "%d of %d calls failed", &failed, &calls); scanErr != nil || !errors.Is(err, failure) ||
		len(seconds) == 0 || calls != failed+len(seconds) || len(seconds)-failed > 4 || failed-len(seconds) > 4 {
		t.Errorf("load = %d calls, error %v; want as many failed, give or take a worker's last call", len(seconds), err)
	}
}

func TestSideOfAlternatesAndSwapsEachRound(t *testing.T) {
	for round, want := range map[int]string{1: "01100110", 2: "10011001"} {
		var got strings.Builder
		for k := range 8 {
			got.WriteByte(byte('0' + sideOf(k, round)))
		}
		if got.String() != want {
			t.Errorf("round %d: sides %s, want %s", round, got.String(), want)
		}
	}
}
