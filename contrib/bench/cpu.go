package main

import (
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// clockTick is the unit of /proc/<pid>/stat's CPU times (USER_HZ, 100 on every Linux the
// benchmark runs on): a 2 s measurement reads a process's CPU to 10 ms, about 1 %.
const clockTick = 10 * time.Millisecond

// CPUPerCall is the CPU time, user and system, that the processes taking part in a measurement
// used per call, in µs: where a query's cost goes, beyond its latency.
type CPUPerCall struct {
	Daemon  float64 `json:"daemonUs"`  // containerd (0 in a round trip, which does not involve it)
	Plugins float64 `json:"pluginsUs"` // every status plugin process of the configuration
	Client  float64 `json:"clientUs"`  // the benchmark itself, the caller
}

// Total is the CPU of every process taking part per call.
func (c CPUPerCall) Total() float64 { return c.Daemon + c.Plugins + c.Client }

// cpuReading is the CPU time used so far by the processes of a measurement.
type cpuReading struct{ daemon, plugins, client time.Duration }

// readCPU reads the CPU time used so far by the daemon (pid 0: none), the plugin processes and
// the benchmark.
func readCPU(daemon int, plugins []int) (cpuReading, error) {
	var r cpuReading
	var err error
	if r.client, err = processCPU("self"); err != nil {
		return r, err
	}
	if daemon != 0 {
		if r.daemon, err = processCPU(strconv.Itoa(daemon)); err != nil {
			return r, err
		}
	}
	for _, pid := range plugins {
		used, err := processCPU(strconv.Itoa(pid))
		if err != nil {
			return r, err
		}
		r.plugins += used
	}
	return r, nil
}

// perCall is the CPU used between two readings per call.
func (from cpuReading) perCall(to cpuReading, calls int) CPUPerCall {
	if calls == 0 {
		return CPUPerCall{}
	}
	us := func(d time.Duration) float64 { return float64(d.Microseconds()) / float64(calls) }
	return CPUPerCall{Daemon: us(to.daemon - from.daemon), Plugins: us(to.plugins - from.plugins), Client: us(to.client - from.client)}
}

// processCPU returns the user and system time of every thread, living or gone, of process pid
// ("self": the benchmark).
func processCPU(pid string) (time.Duration, error) {
	data, err := os.ReadFile("/proc/" + pid + "/stat")
	if err != nil {
		return 0, err
	}
	return parseProcessCPU(string(data))
}

// parseProcessCPU reads utime and stime, the 14th and 15th fields of /proc/<pid>/stat; the
// command name (2nd field, in parentheses) may hold spaces and parentheses itself.
func parseProcessCPU(stat string) (time.Duration, error) {
	end := strings.LastIndexByte(stat, ')')
	if end < 0 {
		return 0, fmt.Errorf("/proc/<pid>/stat: no command name in %q", stat)
	}
	fields := strings.Fields(stat[end+1:]) // from the 3rd field, the state
	if len(fields) < 13 {
		return 0, fmt.Errorf("/proc/<pid>/stat: %d fields after the command name in %q, want at least 13", len(fields), stat)
	}
	var ticks uint64
	for _, field := range fields[11:13] {
		v, err := strconv.ParseUint(field, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("/proc/<pid>/stat: CPU time %q: %w", field, err)
		}
		ticks += v
	}
	return time.Duration(ticks) * clockTick, nil
}

// CPUSummary is the CPU per call of one configuration's status queries, or of the round trip to
// its plugin, in one variant, over the rounds.
type CPUSummary struct {
	Variant string  `json:"variant"`
	Config  string  `json:"config"`
	Call    string  `json:"call"` // "PodSandboxStatus", or a round trip's transport
	Daemon  *Spread `json:"daemonUs"`
	Plugins *Spread `json:"pluginsUs"`
	Client  *Spread `json:"clientUs"`
	Total   *Spread `json:"totalUs"`
}

// cpuSummaries summarize the CPU per call of every configuration's status queries and of (knext-1-plugin)'s
// round trips at the same concurrency.
func (r *report) cpuSummaries() []CPUSummary {
	var out []CPUSummary
	add := func(v variant, key, call string, metric func(*Run) (CPUPerCall, bool)) {
		over := func(field func(CPUPerCall) float64) *Spread {
			return spread(roundValues(r.perRound(key, func(run *Run) (float64, bool) {
				cpu, ok := metric(run)
				return field(cpu), ok
			})))
		}
		total := over(CPUPerCall.Total)
		if total == nil {
			return
		}
		out = append(out, CPUSummary{Variant: v.String(), Config: key, Call: call, Total: total,
			Daemon:  over(func(c CPUPerCall) float64 { return c.Daemon }),
			Plugins: over(func(c CPUPerCall) float64 { return c.Plugins }),
			Client:  over(func(c CPUPerCall) float64 { return c.Client })})
	}
	for _, v := range variants {
		for _, c := range r.Configurations {
			if !c.Status {
				continue
			}
			add(v, c.Key, "PodSandboxStatus", func(run *Run) (CPUPerCall, bool) {
				for _, s := range run.Status {
					if s.variant == v && s.Calls > 0 {
						return s.CPU, true
					}
				}
				return CPUPerCall{}, false
			})
		}
		for _, rt := range roundTrips {
			add(v, cfgOnePlugin, "round trip, "+rt.String(), func(run *Run) (CPUPerCall, bool) {
				for _, p := range run.Ping {
					if !v.Verbose && p.Concurrency == v.Concurrency && p.is(rt) && p.Calls > 0 {
						return p.CPU, true
					}
				}
				return CPUPerCall{}, false
			})
		}
	}
	return out
}

func (r *report) printCPU(out io.Writer) {
	if len(r.CPU) == 0 {
		return
	}
	fmt.Fprintf(out, "\nCPU per call, µs: user and system time of each process taking part (/proc/<pid>/stat, to %s per measurement)"+
		" over its calls; the client is the benchmark. A round trip does not involve containerd; after an idle gap the"+
		" client's figure includes its busy wait. At c1 the processes mostly wait for each other and Go's scheduler spins"+
		" before a thread sleeps, which counts as CPU too: the c16 rows, with the CPUs saturated, say what a call costs.\n", clockTick)
	w := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "variant\tcfg\tcall\tcontainerd\tplugins\tclient\tall\t")
	for _, c := range r.CPU {
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", c.Variant, c.Config, c.Call,
			cell(c.Daemon, "%.0f"), cell(c.Plugins, "%.0f"), cell(c.Client, "%.0f"), cell(c.Total, "%.0f"))
	}
	w.Flush()
}
