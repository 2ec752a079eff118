package ping

import (
	"context"
	"net"
	"path/filepath"
	"testing"
)

func TestPingRoundTrip(t *testing.T) {
	for _, multiplexed := range []bool{false, true} {
		t.Run(map[bool]string{false: "plain", true: "multiplexed"}[multiplexed], func(t *testing.T) {
			testPingRoundTrip(t, multiplexed)
		})
	}
}

func testPingRoundTrip(t *testing.T, multiplexed bool) {
	socket := filepath.Join(t.TempDir(), "ping.sock")
	l, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() {
		if multiplexed {
			served <- ServeMultiplexed(ctx, l)
		} else {
			served <- Serve(ctx, l)
		}
	}()

	c, err := Dial(ctx, socket, multiplexed)
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if err := c.Ping(ctx); err != nil {
			t.Fatalf("ping: %v", err)
		}
	}
	c.Close()
	cancel()
	if err := <-served; err != nil {
		t.Errorf("Serve after cancel = %v, want nil", err)
	}
	if _, err := Dial(context.Background(), socket, multiplexed); err == nil {
		t.Error("the service still accepts connections after Serve returned")
	}
}
