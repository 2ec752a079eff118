package main

import (
	"strings"
	"testing"
)

func TestParseCPUTimesCountsIdleAndIOWaitAsIdle(t *testing.T) {
	// user nice system idle iowait irq softirq steal guest guest_nice
	got, err := parseCPUTimes("cpu  100 5 50 1000 40 3 2 1 70 0")
	if err != nil {
		t.Fatal(err)
	}
	if want := (cpuTimes{busy: 161, total: 1201}); got != want {
		t.Errorf("parseCPUTimes = %+v, want %+v (guest is part of user)", got, want)
	}
	for _, bad := range []string{"", "cpu0 1 2 3 4 5 6 7 8", "cpu 1 2 3 x 5 6 7 8", "cpu 1 2 3"} {
		if _, err := parseCPUTimes(bad); err == nil {
			t.Errorf("parseCPUTimes(%q) did not fail", bad)
		}
	}
}

func TestBusyShare(t *testing.T) {
	from, to := cpuTimes{busy: 100, total: 1000}, cpuTimes{busy: 150, total: 1200}
	if got := busyShare(from, to); got != 0.25 {
		t.Errorf("busyShare = %v, want 0.25 (50 of 200 jiffies)", got)
	}
	if got := busyShare(to, to); got != 0 {
		t.Errorf("busyShare without time passing = %v, want 0", got)
	}
}

// A phase that ran without its quiet windows is listed with the busy share it was measured by.
func TestQuietWaitsListThePhasesThatRanWithoutQuiet(t *testing.T) {
	r := &report{
		Runs: []*Run{{Config: cfgUpstream, Round: 1, QuietWaits: []QuietWait{
			{Phase: "status c1", Seconds: 0.5, Quiet: true},
			{Phase: "lifecycle c8 run", Seconds: 15, Busy: 0.04},
		}}},
		Paired: []*PairedRun{{Config: cfgCNILess, Round: 2, QuietWaits: []QuietWait{{Phase: "paired lifecycle c1 run", Seconds: 0.5, Quiet: true}}}},
	}
	var out strings.Builder
	r.printQuietWaits(&out)
	for _, want := range []string{"Before each of the 3 timed phases", "not quiet within 15s, measured anyway: (upstream) round 1 lifecycle c8 run (last window 4%)."} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("quiet waits say %q, want it to contain %q", out.String(), want)
		}
	}
	if strings.Contains(out.String(), "status c1") {
		t.Errorf("quiet waits list a phase that started on a quiet machine: %q", out.String())
	}
}
