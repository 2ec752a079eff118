// Package ping is a no-op ttrpc service. The bench's status plugin serves it, so that the bench
// can measure a bare ttrpc round trip to the very process that answers containerd's
// PodSandboxStatus calls: the floor a status query through NRI cannot go below.
package ping

import (
	"context"
	"errors"
	"fmt"
	"net"

	"github.com/containerd/ttrpc"
	"google.golang.org/protobuf/types/known/emptypb"
)

const service, method = "knext.bench.v1.Ping", "Ping"

// Serve answers pings on l until ctx ends.
func Serve(ctx context.Context, l net.Listener) error {
	server, err := ttrpc.NewServer()
	if err != nil {
		return err
	}
	server.RegisterService(service, &ttrpc.ServiceDesc{Methods: map[string]ttrpc.Method{
		method: func(_ context.Context, unmarshal func(any) error) (any, error) {
			return &emptypb.Empty{}, unmarshal(&emptypb.Empty{})
		},
	}})
	defer context.AfterFunc(ctx, func() { server.Close() })()
	if err := server.Serve(ctx, l); err != nil && !errors.Is(err, ttrpc.ErrServerClosed) && ctx.Err() == nil {
		return err
	}
	return nil
}

// Dial connects to the ping service on socket. The client is safe for concurrent use: concurrent
// calls share the connection, as containerd's calls to an NRI plugin do.
func Dial(ctx context.Context, socket string) (*ttrpc.Client, error) {
	conn, err := (&net.Dialer{}).DialContext(ctx, "unix", socket)
	if err != nil {
		return nil, fmt.Errorf("ping service on %s: %w", socket, err)
	}
	return ttrpc.NewClient(conn), nil
}

// Ping makes one round trip.
func Ping(ctx context.Context, c *ttrpc.Client) error {
	return c.Call(ctx, service, method, &emptypb.Empty{}, &emptypb.Empty{})
}
