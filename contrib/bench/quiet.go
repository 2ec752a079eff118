package main

import (
	"context"
	"fmt"
	"log"
	"os"
	"strconv"
	"strings"
	"time"
)

// Before every timed phase the benchmark waits for the machine's CPUs to be quiet, so that what
// the previous phase or configuration left running (a stopped daemon's exit, the kernel's cleanup
// of removed network namespaces and veths, a plugin's background work) is not billed to the next
// one: on 2 cores that carry-over is as large as the differences measured.
const (
	quietBusy    = 0.10 // share of all CPUs below which a window is quiet
	quietWindow  = 250 * time.Millisecond
	quietWindows = 2 // quiet windows in a row
	quietLimit   = 15 * time.Second
)

// QuietWait is the wait for a quiet machine before one timed phase.
type QuietWait struct {
	Phase   string  `json:"phase"`
	Seconds float64 `json:"seconds"`
	// Quiet is false when the machine was not quiet for quietWindows windows in a row within
	// quietLimit: the phase ran anyway.
	Quiet bool `json:"quiet"`
	// Busy is the share of all CPUs busy in the last window.
	Busy float64 `json:"busy"`
}

// cpuTimes are the jiffies of every CPU together, from /proc/stat's first line.
type cpuTimes struct{ busy, total uint64 }

// parseCPUTimes reads "cpu user nice system idle iowait irq softirq steal ...": idle and iowait
// are idle time; guest time is already counted in user.
func parseCPUTimes(line string) (cpuTimes, error) {
	fields := strings.Fields(line)
	if len(fields) < 9 || fields[0] != "cpu" {
		return cpuTimes{}, fmt.Errorf("/proc/stat: unexpected first line %q", line)
	}
	var t cpuTimes
	for i, field := range fields[1:9] {
		v, err := strconv.ParseUint(field, 10, 64)
		if err != nil {
			return cpuTimes{}, fmt.Errorf("/proc/stat: field %d of %q: %w", i+1, line, err)
		}
		t.total += v
		if i != 3 && i != 4 { // idle, iowait
			t.busy += v
		}
	}
	return t, nil
}

func readCPUTimes() (cpuTimes, error) {
	data, err := os.ReadFile("/proc/stat")
	if err != nil {
		return cpuTimes{}, err
	}
	line, _, _ := strings.Cut(string(data), "\n")
	return parseCPUTimes(line)
}

// busyShare is the share of all CPUs busy between two readings (0 when no time passed).
func busyShare(from, to cpuTimes) float64 {
	if to.total <= from.total {
		return 0
	}
	return float64(to.busy-from.busy) / float64(to.total-from.total)
}

// settle waits until the machine is quiet, at most quietLimit, and records the wait of phase in the
// instance's current run.
func (in *instance) settle(ctx context.Context, phase string) error {
	start := time.Now()
	wait := QuietWait{Phase: phase}
	prev, err := readCPUTimes()
	if err != nil {
		return err
	}
	for quietInARow := 0; quietInARow < quietWindows; {
		if time.Since(start) >= quietLimit {
			break
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(quietWindow):
		}
		now, err := readCPUTimes()
		if err != nil {
			return err
		}
		wait.Busy, prev = busyShare(prev, now), now
		if wait.Busy < quietBusy {
			quietInARow++
		} else {
			quietInARow = 0
		}
		wait.Quiet = quietInARow == quietWindows
	}
	wait.Seconds = time.Since(start).Seconds()
	if !wait.Quiet {
		log.Printf("bench:   %s: the machine was not quiet for %d windows in a row within %s (the last window: %.0f%% of the CPUs busy); measuring anyway",
			phase, quietWindows, quietLimit, 100*wait.Busy)
	}
	in.quietWaits = append(in.quietWaits, wait)
	return nil
}
