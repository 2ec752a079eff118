// Command fakenginx stands in for nginx in the images critest pulls
// (registry.k8s.io/e2e-test-images/nginx and gcr.io/k8s-staging-cri-tools/hostnet-nginx-*), which
// no registry can serve here. It does what critest checks of nginx: answers 200 on every path
// over HTTP, writes its PID to /var/run/nginx.pid, runs as a process named nginx (comm, for
// pidof), and shows "nginx: master process ..." as its command line (/proc/<pid>/cmdline).
//
// It listens on $NGINX_LISTEN (default ":80") and exits 0 on SIGTERM, SIGINT or SIGQUIT (as PID 1
// of a container it would otherwise ignore them). Like nginx, whose image links its error log to
// /dev/stderr, it opens /dev/stderr by path to log that it starts its workers: containerd's
// TestIssue10598 checks that a container in a user namespace can.
package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"
)

const (
	pidFile    = "/var/run/nginx.pid"
	titleStart = "nginx: master process "
)

func main() {
	// Real nginx rewrites its argv in place to show this title; Go cannot, so it re-executes itself
	// under the title as argv[0]. Executing the binary's own path (not /proc/self/exe) keeps its
	// comm "nginx".
	if !strings.HasPrefix(os.Args[0], titleStart) {
		exe, err := os.Executable()
		if err != nil {
			log.Fatalf("fakenginx: %v", err)
		}
		title := titleStart + strings.Join(os.Args, " ")
		log.Fatalf("fakenginx: exec %s: %v", exe, syscall.Exec(exe, []string{title}, os.Environ()))
	}

	listen := os.Getenv("NGINX_LISTEN")
	if listen == "" {
		listen = ":80"
	}
	if err := os.WriteFile(pidFile, []byte(strconv.Itoa(os.Getpid())+"\n"), 0o644); err != nil {
		log.Fatalf("fakenginx: %v", err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT, syscall.SIGQUIT)
	defer stop()
	srv := &http.Server{Addr: listen, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "<h1>Welcome to nginx!</h1>")
	}), ReadHeaderTimeout: 10 * time.Second}
	go func() {
		<-ctx.Done()
		srv.Close()
	}()
	errorLog, err := os.OpenFile("/dev/stderr", os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		log.Fatalf("fakenginx: error log: %v", err)
	}
	fmt.Fprintf(errorLog, "%s [notice] %d#%d: start worker processes\n", time.Now().Format("2006/01/02 15:04:05"), os.Getpid(), os.Getpid())
	errorLog.Close()
	log.Printf("fakenginx: serving on %s", listen)
	if err := srv.ListenAndServe(); !errors.Is(err, http.ErrServerClosed) {
		log.Fatalf("fakenginx: %v", err)
	}
}
