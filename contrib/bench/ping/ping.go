// Package ping is a no-op ttrpc service: the benchmark's status plugin serves it next to its NRI
// connection, so that the benchmark can measure a bare ttrpc round trip to the very process that
// answers containerd's PodSandboxStatus calls, the floor of a status query through NRI.
package ping

import (
	"context"
	"fmt"
	"net"

	"github.com/containerd/ttrpc"
	"google.golang.org/protobuf/types/known/emptypb"
)

const (
	service = "knext.bench.v1.Ping"
	method  = "Ping"
)

// Serve answers pings on l until l is closed or ctx ends.
func Serve(ctx context.Context, l net.Listener) error {
	server, err := ttrpc.NewServer()
	if err != nil {
		return err
	}
	server.RegisterService(service, &ttrpc.ServiceDesc{Methods: map[string]ttrpc.Method{
		method: func(_ context.Context, unmarshal func(any) error) (any, error) {
			var req emptypb.Empty
			if err := unmarshal(&req); err != nil {
				return nil, err
			}
			return &emptypb.Empty{}, nil
		},
	}})
	go func() {
		<-ctx.Done()
		server.Close()
	}()
	err = server.Serve(ctx, l)
	if err == ttrpc.ErrServerClosed {
		return nil
	}
	return err
}

// Client is one ttrpc connection to a ping service; it is safe for concurrent use, and
// concurrent calls share the connection, as containerd's calls to an NRI plugin do.
type Client struct {
	socket string
	client *ttrpc.Client
}

// Dial connects to the ping service on socket.
func Dial(ctx context.Context, socket string) (*Client, error) {
	conn, err := (&net.Dialer{}).DialContext(ctx, "unix", socket)
	if err != nil {
		return nil, fmt.Errorf("ping service on %s: %w", socket, err)
	}
	return &Client{socket: socket, client: ttrpc.NewClient(conn)}, nil
}

// Ping makes one round trip.
func (c *Client) Ping(ctx context.Context) error {
	if err := c.client.Call(ctx, service, method, &emptypb.Empty{}, &emptypb.Empty{}); err != nil {
		return fmt.Errorf("ping service on %s: %w", c.socket, err)
	}
	return nil
}

// Close closes the connection.
func (c *Client) Close() error {
	return c.client.Close()
}
