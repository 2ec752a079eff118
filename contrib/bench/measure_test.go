package main

import (
	"errors"
	"sync"
	"testing"
	"time"
)

func TestForEachCallsEveryIndexOnce(t *testing.T) {
	var mu sync.Mutex
	seen := map[int]int{}
	if err := forEach(100, 7, func(i int) error {
		mu.Lock()
		defer mu.Unlock()
		seen[i]++
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	for i := range 100 {
		if seen[i] != 1 {
			t.Errorf("index %d called %d times, want once", i, seen[i])
		}
	}
	if len(seen) != 100 {
		t.Errorf("%d indexes called, want 100", len(seen))
	}
}

func TestForEachReturnsErrorsAndStops(t *testing.T) {
	broken := errors.New("pod 3 is broken")
	var mu sync.Mutex
	calls := 0
	err := forEach(1000, 1, func(i int) error {
		mu.Lock()
		defer mu.Unlock()
		calls++
		if i == 3 {
			return broken
		}
		return nil
	})
	if !errors.Is(err, broken) || calls != 4 {
		t.Errorf("forEach = %v after %d calls, want the error after 4 calls", err, calls)
	}
}

func TestIdleGapIsTheQueryLessThePlainRoundTrip(t *testing.T) {
	c1 := StatusSample{variant: variant{1, false}, P50Ms: 0.5}
	pings := []PingSample{{Concurrency: 1, IdleGapMs: 0.4, Calls: 10, P50Ms: 0.3}, {Concurrency: 1, Multiplexed: true, Calls: 10, P50Ms: 0.2},
		{Concurrency: 16, Calls: 10, P50Ms: 0.05}, {Concurrency: 1, Calls: 10, P50Ms: 0.1}}
	if got := idleGap(c1, pings); got != 400*time.Microsecond {
		t.Errorf("gap = %v, want 0.5 - 0.1 ms of the plain c1 round trip", got)
	}
	for name, tc := range map[string]struct {
		s     StatusSample
		pings []PingSample
	}{
		"c16":                      {StatusSample{variant: variant{16, false}, P50Ms: 0.5}, pings},
		"c1 verbose":               {StatusSample{variant: variant{1, true}, P50Ms: 0.5}, pings},
		"plain round trip not yet": {c1, pings[:3]},
		"round trip slower than (knext-1-plugin)'s": {c1, []PingSample{{Concurrency: 1, Calls: 10, P50Ms: 0.6}}},
	} {
		if got := idleGap(tc.s, tc.pings); got != 0 {
			t.Errorf("%s: gap = %v, want none", name, got)
		}
	}
}
