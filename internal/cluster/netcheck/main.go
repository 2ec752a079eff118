// Command netcheck is the server and client of the cluster tests' workloads (image
// knext.local/netcheck): a server that tells each client which address it came from, and clients
// that print what the server said.
//
//	netcheck serve [-port 8080]         TCP (HTTP) and UDP on the port, both families
//	netcheck get URL                     HTTP GET; prints the answer
//	netcheck udp HOST:PORT               one UDP datagram; prints the answer
//	netcheck lookup NAME                 the name's addresses, one a line (the pod's resolv.conf)
//	netcheck probe [-interval 200ms] URL...
//	                                     GET each URL forever, one line a request:
//	                                     "<time> ok|fail <url> <answer or error>"
//
// The server's answer, over HTTP (GET /) and UDP alike, is one line: "client=<ip> host=<hostname>".
// Every client gives up after -timeout (default 5s) and exits 1 with the error; probe gives each
// request that long and goes on.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: netcheck serve|get|udp|lookup ...")
		os.Exit(2)
	}
	fs := flag.NewFlagSet(os.Args[1], flag.ExitOnError)
	port := fs.Int("port", 8080, "port to serve TCP (HTTP) and UDP on")
	timeout := fs.Duration("timeout", 5*time.Second, "client timeout")
	interval := fs.Duration("interval", 200*time.Millisecond, "probe: time between the starts of two requests")
	fs.Parse(os.Args[2:])
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	var err error
	switch os.Args[1] {
	case "serve":
		err = serve(*port)
	case "get":
		err = get(ctx, fs.Arg(0))
	case "udp":
		err = udp(ctx, fs.Arg(0))
	case "lookup":
		err = lookup(ctx, fs.Arg(0))
	case "probe":
		err = probe(fs.Args(), *interval, *timeout)
	default:
		err = fmt.Errorf("unknown command %q", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "netcheck:", err)
		os.Exit(1)
	}
}

// answer is what the server says to a client at addr.
func answer(addr net.Addr) string {
	host, _ := os.Hostname()
	ip := addr.String()
	if h, _, err := net.SplitHostPort(ip); err == nil {
		ip = h
	}
	return fmt.Sprintf("client=%s host=%s\n", ip, host)
}

func serve(port int) error {
	addr := ":" + strconv.Itoa(port)
	// "udp" and "tcp" on ":port" listen on both families.
	pc, err := net.ListenPacket("udp", addr)
	if err != nil {
		return err
	}
	go func() {
		buf := make([]byte, 1500)
		for {
			_, from, err := pc.ReadFrom(buf)
			if err != nil {
				continue
			}
			pc.WriteTo([]byte(answer(from)), from) //nolint:errcheck // the client retries or reports
		}
	}()
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		remote, err := net.ResolveTCPAddr("tcp", r.RemoteAddr)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		io.WriteString(w, answer(remote)) //nolint:errcheck
	})
	fmt.Printf("netcheck: serving TCP and UDP on %s\n", addr)
	srv := &http.Server{Addr: addr, Handler: handler, ReadHeaderTimeout: 10 * time.Second}
	return srv.ListenAndServe()
}

func get(ctx context.Context, url string) error {
	body, err := fetch(ctx, url)
	if err != nil {
		return err
	}
	_, err = os.Stdout.Write(body)
	return err
}

// fetch GETs url on a new connection (each request is a new flow through a Service's rules) and
// returns the body of a 200 answer.
func fetch(ctx context.Context, url string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return body, nil
}

// probe GETs every url every interval, forever, each on its own, and prints one line per request.
func probe(urls []string, interval, timeout time.Duration) error {
	if len(urls) == 0 {
		return errors.New("probe: no URL")
	}
	var mu sync.Mutex
	for _, url := range urls {
		go func() {
			for next := time.Now(); ; next = next.Add(interval) {
				time.Sleep(time.Until(next))
				start := time.Now()
				ctx, cancel := context.WithTimeout(context.Background(), timeout)
				body, err := fetch(ctx, url)
				cancel()
				line := fmt.Sprintf("%s ok %s %s", start.UTC().Format(time.RFC3339Nano), url, strings.TrimSpace(string(body)))
				if err != nil {
					line = fmt.Sprintf("%s fail %s %v", start.UTC().Format(time.RFC3339Nano), url, err)
				}
				mu.Lock()
				fmt.Println(line)
				mu.Unlock()
			}
		}()
	}
	select {}
}

func udp(ctx context.Context, addr string) error {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "udp", addr)
	if err != nil {
		return err
	}
	defer conn.Close()
	deadline, _ := ctx.Deadline()
	conn.SetDeadline(deadline) //nolint:errcheck
	buf := make([]byte, 1500)
	// UDP may drop a datagram: ask again every half second until the deadline.
	for {
		if _, err := conn.Write([]byte("netcheck\n")); err != nil {
			return err
		}
		conn.SetReadDeadline(time.Now().Add(500 * time.Millisecond)) //nolint:errcheck
		n, err := conn.Read(buf)
		if err == nil {
			_, err = os.Stdout.Write(buf[:n])
			return err
		}
		var netErr net.Error
		if !errors.As(err, &netErr) || !netErr.Timeout() || time.Now().After(deadline) {
			return fmt.Errorf("udp %s: %w", addr, err)
		}
	}
}

func lookup(ctx context.Context, name string) error {
	addrs, err := net.DefaultResolver.LookupHost(ctx, name)
	if err != nil {
		return err
	}
	for _, a := range addrs {
		fmt.Println(a)
	}
	return nil
}
