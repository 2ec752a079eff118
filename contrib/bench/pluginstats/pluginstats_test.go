package pluginstats

import (
	"context"
	"net"
	"path/filepath"
	"testing"
)

func TestFetchReadsServedStats(t *testing.T) {
	socket := filepath.Join(t.TempDir(), "stats.sock")
	l, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	want := Stats{Plugin: "10-status", Synchronized: true, Pods: 50, StatusCalls: 1234}
	done := make(chan error, 1)
	go func() { done <- Serve(l, func() Stats { return want }) }()

	got, err := Fetch(context.Background(), socket)
	if err != nil || got != want {
		t.Errorf("Fetch = %+v, %v; want %+v", got, err, want)
	}
	l.Close()
	if err := <-done; err != nil {
		t.Errorf("Serve after the listener closed: %v, want nil", err)
	}
	if _, err := Fetch(context.Background(), socket); err == nil {
		t.Error("Fetch from a closed socket succeeded, want an error")
	}
}
