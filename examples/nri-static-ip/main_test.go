package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	nri "github.com/containerd/nri/pkg/adaptation"
	"github.com/containerd/nri/pkg/api"
	"github.com/containerd/nri/pkg/stub"
)

// runtime is an NRI runtime on a private socket that keeps each pod with the IPs the plugins
// reported at RunPodSandbox, and lists them so at synchronization, as knext does.
type runtime struct {
	t      *testing.T
	nri    *nri.Adaptation
	socket string
	mu     sync.Mutex
	pods   map[string]*api.PodSandbox
	synced chan struct{}
	// started is set once Start returned: synchronizations after are the plugins'.
	started atomic.Bool
}

func startRuntime(t *testing.T) *runtime {
	t.Helper()
	dir, err := os.MkdirTemp("", "nri-static-ip-") //nolint:usetesting // short: a Unix socket path is limited to 108 bytes, t.TempDir's holds the test name
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	r := &runtime{t: t, socket: filepath.Join(dir, "nri.sock"), pods: map[string]*api.PodSandbox{}, synced: make(chan struct{}, 4)}
	syncFn := func(ctx context.Context, cb nri.SyncCB) error {
		r.mu.Lock()
		pods := make([]*api.PodSandbox, 0, len(r.pods))
		for _, pod := range r.pods {
			pods = append(pods, pod)
		}
		r.mu.Unlock()
		_, err := cb(ctx, pods, nil)
		if r.started.Load() { // Start synchronizes the pre-installed plugins (none here) first
			r.synced <- struct{}{}
		}
		return err
	}
	update := func(context.Context, []*nri.ContainerUpdate) ([]*nri.ContainerUpdate, error) { return nil, nil }
	r.nri, err = nri.New("test-runtime", "v0", syncFn, update, nri.WithSocketPath(r.socket),
		nri.WithPluginPath(dir), nri.WithPluginConfigPath(dir))
	if err != nil {
		t.Fatal(err)
	}
	if err := r.nri.Start(); err != nil {
		t.Fatal(err)
	}
	r.started.Store(true)
	t.Cleanup(r.nri.Stop)
	return r
}

// connect runs a plugin instance until the test ends or stop is called.
func (r *runtime) connect(p *plugin) (stop func()) {
	r.t.Helper()
	s, err := stub.New(p, stub.WithPluginName("static-ip"), stub.WithPluginIdx("50"), stub.WithSocketPath(r.socket))
	if err != nil {
		r.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.Run(ctx)
	}()
	select {
	case <-r.synced:
	case <-time.After(time.Minute):
		r.t.Fatal("the plugin did not synchronize")
	}
	r.nri.BlockPluginSync().Unblock() // the plugin is registered
	stop = func() {
		s.Stop()
		cancel()
		<-done
	}
	r.t.Cleanup(stop)
	return stop
}

func (r *runtime) run(id string) string {
	r.t.Helper()
	pod := &api.PodSandbox{Id: id, Name: id, Namespace: "test"}
	answers, err := r.nri.RunPodSandbox(context.Background(), &api.RunPodSandboxRequest{Pod: pod})
	if err != nil {
		r.t.Fatal(err)
	}
	if len(answers) != 1 || answers[0].IP == "" {
		r.t.Fatalf("pod %s: want one IP reported, got %+v", id, answers)
	}
	r.mu.Lock()
	r.pods[id] = pod
	r.mu.Unlock()
	return answers[0].IP
}

func (r *runtime) stop(id string) {
	r.t.Helper()
	r.mu.Lock()
	pod := r.pods[id]
	delete(r.pods, id)
	r.mu.Unlock()
	if err := r.nri.StopPodSandbox(context.Background(), &api.StopPodSandboxRequest{Pod: pod}); err != nil {
		r.t.Fatal(err)
	}
}

func (r *runtime) status(id string) []*nri.PodNetworkAnswer {
	r.t.Helper()
	r.mu.Lock()
	pod := r.pods[id]
	r.mu.Unlock()
	result, err := r.nri.PodSandboxStatus(context.Background(), &api.PodSandboxStatusRequest{Pod: pod})
	if err != nil {
		r.t.Fatal(err)
	}
	return result
}

// The plugin reports each pod's address at RunPodSandbox and, not subscribed to status, is not
// asked again; restarted, it rebuilds its state from the pods the runtime lists, so that it
// hands out no address twice.
func TestReportsAtRunPodSandboxAndRebuildsOnSynchronize(t *testing.T) {
	r := startRuntime(t)
	stop := r.connect(newPlugin(false))
	if a, b := r.run("a"), r.run("b"); a != "10.99.0.2" || b != "10.99.0.3" {
		t.Fatalf("pods a and b got %s and %s, want 10.99.0.2 and 10.99.0.3", a, b)
	}
	if answers := r.status("a"); answers != nil {
		t.Errorf("a status query asked the plugin: %+v", answers)
	}

	stop()
	r.connect(newPlugin(false))
	if c := r.run("c"); c != "10.99.0.4" {
		t.Errorf("after a restart, pod c got %s, want 10.99.0.4 (a and b still have .2 and .3)", c)
	}
	r.stop("a")
	if d := r.run("d"); d != "10.99.0.5" {
		t.Errorf("pod d got %s, want 10.99.0.5: an address comes back last", d)
	}
}

// With -status, the plugin answers status queries, and after a restart it answers with the pod's
// address, never with an empty answer.
func TestAnswersStatusAfterARestart(t *testing.T) {
	r := startRuntime(t)
	stop := r.connect(newPlugin(true))
	ip := r.run("a")
	if answers := r.status("a"); len(answers) != 1 || answers[0].IP != ip {
		t.Fatalf("status of pod a: %+v, want %s", answers, ip)
	}
	stop()
	r.connect(newPlugin(true))
	if answers := r.status("a"); len(answers) != 1 || answers[0].IP != ip || answers[0].Err != nil {
		t.Errorf("status of pod a after a restart: %+v, want %s", answers, ip)
	}
}

// docs/plugin-authors.md shows this plugin: its copy must be this file.
func TestDocumentedCopyIsThePlugin(t *testing.T) {
	doc, err := os.ReadFile("../../docs/plugin-authors.md")
	if err != nil {
		t.Fatal(err)
	}
	code, err := os.ReadFile("main.go")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(doc), "```go\n"+string(code)+"```\n") {
		t.Error("docs/plugin-authors.md does not show examples/nri-static-ip/main.go as it is")
	}
}
