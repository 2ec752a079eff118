// Package ping is a no-op ttrpc service: the benchmark's status plugin serves it next to its NRI
// connection, so that the benchmark can measure a bare ttrpc round trip to the very process that
// answers containerd's PodSandboxStatus calls, the floor of a status query through NRI. It is
// served plain, and over NRI's connection multiplexer as containerd reaches its plugins: the
// difference is the multiplexer's share of a status query.
package ping

import (
	"context"
	"errors"
	"fmt"
	"net"

	"github.com/containerd/nri/pkg/net/multiplex"
	"github.com/containerd/ttrpc"
	"google.golang.org/protobuf/types/known/emptypb"
)

const (
	service = "knext.bench.v1.Ping"
	method  = "Ping"
)

// Serve answers pings on l until l is closed or ctx ends.
func Serve(ctx context.Context, l net.Listener) error {
	return serve(ctx, l, false)
}

// ServeMultiplexed answers pings on l until l is closed or ctx ends, on the plugin service
// connection of NRI's multiplexer over each connection, as an NRI plugin serves containerd.
func ServeMultiplexed(ctx context.Context, l net.Listener) error {
	return serve(ctx, l, true)
}

func serve(ctx context.Context, l net.Listener, multiplexed bool) error {
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
	if multiplexed {
		err = serveTrunks(ctx, server, l)
	} else {
		err = server.Serve(ctx, l)
	}
	if errors.Is(err, ttrpc.ErrServerClosed) || ctx.Err() != nil {
		return nil
	}
	return err
}

// serveTrunks serves the plugin service connection of each connection accepted on l.
func serveTrunks(ctx context.Context, server *ttrpc.Server, l net.Listener) error {
	go func() {
		<-ctx.Done()
		l.Close()
	}()
	for {
		trunk, err := l.Accept()
		if err != nil {
			return err
		}
		// The mux drops frames of connections not yet listened on: read only once listening.
		mux := multiplex.Multiplex(trunk, multiplex.WithBlockedRead())
		service, err := mux.Listen(multiplex.PluginServiceConn)
		if err != nil {
			mux.Close()
			return err
		}
		mux.Unblock()
		go server.Serve(ctx, service) // ends with the server
	}
}

// Client is one ttrpc connection to a ping service; it is safe for concurrent use, and
// concurrent calls share the connection, as containerd's calls to an NRI plugin do.
type Client struct {
	socket string
	client *ttrpc.Client
	mux    multiplex.Mux // nil for a plain connection
}

// Dial connects to the ping service on socket: Serve's, or with multiplexed ServeMultiplexed's.
func Dial(ctx context.Context, socket string, multiplexed bool) (*Client, error) {
	conn, err := (&net.Dialer{}).DialContext(ctx, "unix", socket)
	if err != nil {
		return nil, fmt.Errorf("ping service on %s: %w", socket, err)
	}
	if !multiplexed {
		return &Client{socket: socket, client: ttrpc.NewClient(conn)}, nil
	}
	mux := multiplex.Multiplex(conn)
	service, err := mux.Open(multiplex.PluginServiceConn)
	if err != nil {
		mux.Close()
		return nil, fmt.Errorf("ping service on %s: %w", socket, err)
	}
	return &Client{socket: socket, client: ttrpc.NewClient(service), mux: mux}, nil
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
	err := c.client.Close()
	if c.mux != nil {
		err = errors.Join(err, c.mux.Close())
	}
	return err
}
