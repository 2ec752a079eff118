// Package pluginstats carries a benchmark status plugin's counters to the benchmark: the plugin
// serves them as JSON over HTTP on a unix socket, the benchmark fetches them between phases.
package pluginstats

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"
)

// Stats is a plugin's state as the benchmark needs it.
type Stats struct {
	Plugin       string `json:"plugin"`
	Synchronized bool   `json:"synchronized"` // NRI has sent Synchronize
	Pods         int    `json:"pods"`         // pods the plugin holds an IP for
	StatusCalls  int64  `json:"statusCalls"`  // PodSandboxStatus calls received so far
}

// Serve answers every HTTP request on l with current(), until l is closed.
func Serve(l net.Listener, current func() Stats) error {
	server := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			_ = json.NewEncoder(w).Encode(current())
		}),
		ReadHeaderTimeout: 5 * time.Second,
	}
	err := server.Serve(l)
	if errors.Is(err, net.ErrClosed) {
		return nil
	}
	return err
}

// Fetch reads the stats a plugin serves on socket.
func Fetch(ctx context.Context, socket string) (Stats, error) {
	client := &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", socket)
		},
	}}
	defer client.CloseIdleConnections()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://plugin/stats", nil)
	if err != nil {
		return Stats{}, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return Stats{}, fmt.Errorf("plugin stats on %s: %w", socket, err)
	}
	defer resp.Body.Close()
	var stats Stats
	if err := json.NewDecoder(resp.Body).Decode(&stats); err != nil {
		return Stats{}, fmt.Errorf("plugin stats on %s: %w", socket, err)
	}
	return stats, nil
}
