package main

import "testing"

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
