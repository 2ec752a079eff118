package ping

import (
	"context"
	"net"
	"path/filepath"
	"testing"

	"github.com/containerd/ttrpc"
)

// serve starts a ping service for the test and returns a client of it, and the service's end.
func serve(t testing.TB) (*ttrpc.Client, func() error) {
	socket := filepath.Join(t.TempDir(), "ping.sock")
	l, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- Serve(ctx, l) }()
	c, err := Dial(ctx, socket)
	if err != nil {
		t.Fatal(err)
	}
	return c, func() error {
		c.Close()
		cancel()
		return <-served
	}
}

func TestPingRoundTripsUntilServeEnds(t *testing.T) {
	c, end := serve(t)
	for range 3 {
		if err := Ping(context.Background(), c); err != nil {
			t.Fatalf("ping: %v", err)
		}
	}
	if err := end(); err != nil {
		t.Errorf("Serve after its context ended = %v, want nil", err)
	}
	if err := Ping(context.Background(), c); err == nil {
		t.Error("a ping after the end succeeded")
	}
}

// BenchmarkRoundTrip is the bare ttrpc round trip on this machine, one process, no daemon:
// `go test -bench RoundTrip -cpu 1,16 ./internal/bench/ping` (-cpu 16 for 16 callers at once).
func BenchmarkRoundTrip(b *testing.B) {
	c, end := serve(b)
	defer end()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if err := Ping(context.Background(), c); err != nil {
				b.Error(err)
				return
			}
		}
	})
}
