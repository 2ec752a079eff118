package bench

import (
	"bytes"
	"slices"
	"strings"

	"golang.org/x/perf/benchfmt"
	"golang.org/x/perf/benchmath"
)

// Every measurement is a line in Go's benchmark format, its name the metric, its variant and its
// configuration, and for a paired measurement the base it was measured against:
//
//	BenchmarkStatus/c1/config=knext/base=upstream 612 0.000331 sec/op 0.000325 base-sec/op 1.018 ratio
//
// `benchstat -filter .unit:ratio -row .fullname` and the like read them as they are.
const (
	secPerOp  = "sec/op"
	ratioUnit = "ratio"
)

func value(v float64, unit string) benchfmt.Value { return benchfmt.Value{Value: v, Unit: unit} }

// add records a measurement: the benchmark line of name with iterations n and values.
func (r *round) add(name string, n int, values ...benchfmt.Value) {
	var b bytes.Buffer
	_ = benchfmt.NewWriter(&b).Write(&benchfmt.Result{Name: benchfmt.Name(name), Iters: max(n, 1), Values: values}) // to a buffer
	r.results = append(r.results, strings.TrimSuffix(b.String(), "\n"))
}

// samples are a report's measurements: the values of each benchmark name, by unit.
type samples map[string]map[string][]float64

func parseSamples(lines []string) (samples, error) {
	reader := benchfmt.NewReader(strings.NewReader(strings.Join(lines, "\n")), "results")
	s := samples{}
	for reader.Scan() {
		switch rec := reader.Result().(type) {
		case *benchfmt.SyntaxError:
			return nil, rec
		case *benchfmt.Result:
			name := rec.Name.String()
			if s[name] == nil {
				s[name] = map[string][]float64{}
			}
			for _, v := range rec.Values {
				s[name][v.Unit] = append(s[name][v.Unit], v.Value)
			}
		}
	}
	return s, reader.Err()
}

// pairName is the name of config's measurements of metric against base.
func pairName(metric string, p pairing) string {
	return metric + "/config=" + p.config + "/base=" + p.base
}

// summarize is the median of values and its 95% confidence interval (benchmath: the order
// statistics around the median; infinite below 6 values), or nil for no values.
func summarize(values []float64) *benchmath.Summary {
	if len(values) == 0 {
		return nil
	}
	s := benchmath.AssumeNothing.Summary(benchmath.NewSample(slices.Clone(values), &benchmath.DefaultThresholds), 0.95)
	return &s
}

// ratio summarizes config's paired ratios to base in metric.
func (s samples) ratio(metric string, p pairing) *benchmath.Summary {
	return summarize(s[pairName(metric, p)][ratioUnit])
}

// absolute summarizes key's own figures of metric in unit: as the configuration of its pairs, or
// as their base.
func (s samples) absolute(metric, key, unit string) *benchmath.Summary {
	var values []float64
	for name, units := range s {
		rest, ok := strings.CutPrefix(name, metric+"/config=")
		switch config, base, _ := strings.Cut(rest, "/base="); {
		case !ok:
		case config == key:
			values = append(values, units[unit]...)
		case base == key:
			values = append(values, units["base-"+unit]...)
		}
	}
	return summarize(values)
}
