package main

import (
	"errors"
	"sync"
	"testing"
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
