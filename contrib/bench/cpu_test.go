package main

import (
	"os"
	"testing"
	"time"
)

func TestParseProcessCPUAddsUserAndSystemTime(t *testing.T) {
	// A command name with a space and a parenthesis: the fields count from the last ')'.
	stat := "4242 (bench) (x) S 1 4242 4242 0 -1 4194560 500 0 0 0 170 30 7 9 20 0 12 0 100 0 0"
	got, err := parseProcessCPU(stat)
	if err != nil {
		t.Fatal(err)
	}
	if want := 200 * clockTick; got != want {
		t.Errorf("parseProcessCPU = %v, want %v (utime 170 + stime 30 ticks; children's 7 and 9 not counted)", got, want)
	}
	for _, bad := range []string{"", "4242 bench S 1", "4242 (bench) S 1 2 3", "4242 (bench) S 1 4242 4242 0 -1 4194560 500 0 0 0 x 30"} {
		if _, err := parseProcessCPU(bad); err == nil {
			t.Errorf("parseProcessCPU(%q) did not fail", bad)
		}
	}
}

func TestProcessCPUReadsTheBenchmarkItself(t *testing.T) {
	before, err := readCPU(0, []int{os.Getpid()})
	if err != nil {
		t.Fatal(err)
	}
	// Spin until both readings of this process grow (on a loaded machine, wall time is not CPU
	// time; the two are read one after the other, so they may differ by a clock tick).
	var after cpuReading
	for start := time.Now(); after.client-before.client < 2*clockTick || after.plugins-before.plugins < 2*clockTick; {
		if time.Since(start) > 5*time.Second {
			t.Fatalf("5 s of spinning read as %v of the benchmark's CPU and %v of the same process as a plugin",
				after.client-before.client, after.plugins-before.plugins)
		}
		if after, err = readCPU(0, []int{os.Getpid()}); err != nil {
			t.Fatal(err)
		}
	}
	if after.daemon != 0 {
		t.Errorf("no daemon given, read %v", after.daemon)
	}
	if _, err := readCPU(0, []int{-1}); err == nil {
		t.Error("a plugin without a process did not fail")
	}
}

func TestCPUPerCall(t *testing.T) {
	from := cpuReading{daemon: time.Second, plugins: time.Second, client: time.Second}
	to := cpuReading{daemon: 1300 * time.Millisecond, plugins: 1100 * time.Millisecond, client: 1200 * time.Millisecond}
	got := from.perCall(to, 1000)
	if want := (CPUPerCall{Daemon: 300, Plugins: 100, Client: 200}); got != want || got.Total() != 600 {
		t.Errorf("perCall = %+v (total %v), want %+v, total 600", got, got.Total(), want)
	}
	if got := from.perCall(to, 0); got != (CPUPerCall{}) {
		t.Errorf("perCall without calls = %+v, want zero", got)
	}
}

func TestCPUSummariesShowQueriesAndRoundTripsOncePerConcurrency(t *testing.T) {
	r := &report{Configurations: configurations(50 * time.Millisecond)}
	r.Runs = append(runs(cfgUpstream, 0.2, 0.2), runs(cfgOnePlugin, 0.5, 0.5)...)
	for i, run := range r.Runs {
		run.Status[0].CPU = CPUPerCall{Daemon: float64(100 + i), Client: 50}
	}
	for _, run := range r.Runs[2:] {
		run.Status[0].CPU.Plugins = 40
		run.Ping = []PingSample{{Concurrency: 1, IdleGapMs: 0.5, Calls: 10, CPU: CPUPerCall{Plugins: 70, Client: 80}},
			{Concurrency: 1, Calls: 10, CPU: CPUPerCall{Plugins: 20, Client: 30}},
			{Concurrency: 1, Multiplexed: true, Calls: 10, CPU: CPUPerCall{Plugins: 25, Client: 35}},
			{Concurrency: 16, Calls: 10, CPU: CPUPerCall{Plugins: 1}}}
	}
	got := r.cpuSummaries()
	if len(got) != 6 {
		t.Fatalf("CPU summaries = %+v, want (upstream) and (knext-1-plugin) queries, (knext-1-plugin)'s three round trips at c1, its plain one at c16", got)
	}
	if a := got[0]; a.Config != cfgUpstream || a.Call != "PodSandboxStatus" || a.Daemon.Median != 100.5 || a.Total.Median != 150.5 {
		t.Errorf("(upstream) = %+v, want containerd 100.5 µs and 150.5 µs in all (median of 2 rounds)", a)
	}
	if c := got[1]; c.Config != cfgOnePlugin || c.Plugins.Median != 40 || c.Total.Min != 192 {
		t.Errorf("(knext-1-plugin) = %+v, want plugins 40 µs, total from 192 µs", c)
	}
	if rt, mux := got[2], got[3]; rt.Variant != "c1" || rt.Total.Median != 50 || mux.Total.Median != 60 || rt.Daemon.Median != 0 {
		t.Errorf("round trips = %+v, %+v, want c1 at 50 and 60 µs, no containerd", rt, mux)
	}
	if idle := got[4]; idle.Call != "round trip, ttrpc after an idle gap" || idle.Total.Median != 150 {
		t.Errorf("idle round trip = %+v, want 150 µs, told apart from the back-to-back one", idle)
	}
	if c16 := got[5]; c16.Variant != "c16" || c16.Call != "round trip, ttrpc" || c16.Total.Median != 1 {
		t.Errorf("last = %+v, want the plain round trip at c16 (not again under c16 verbose)", c16)
	}
}
