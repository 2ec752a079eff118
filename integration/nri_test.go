package integration

import (
	"context"
	"slices"
	"sync"
	"testing"

	"github.com/containerd/nri/pkg/api"
	"github.com/containerd/nri/pkg/stub"

	"github.com/knext-dev/knext/internal/stack"
)

// podRecorder is an NRI plugin that remembers the pods it is told about.
type podRecorder struct {
	mu   sync.Mutex
	pods map[string]*api.PodSandbox // by pod UID
}

func (r *podRecorder) RunPodSandbox(_ context.Context, pod *api.PodSandbox) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.pods[pod.Uid] = pod
	return nil
}

func (r *podRecorder) pod(uid string) *api.PodSandbox {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.pods[uid]
}

// TestNRIPluginOnHarnessSocket connects an external NRI plugin to the instance's own NRI socket
// and checks that it sees a new pod with the pod's CNI IP.
func TestNRIPluginOnHarnessSocket(t *testing.T) {
	t.Parallel()
	h, ctx := startHarness(t, stack.Options{})
	recorder := &podRecorder{pods: map[string]*api.PodSandbox{}}
	plugin, err := stub.New(recorder, stub.WithSocketPath(h.NRISocket), stub.WithPluginName("recorder"), stub.WithPluginIdx("50"))
	if err != nil {
		t.Fatal(err)
	}
	if err := plugin.Start(ctx); err != nil {
		t.Fatalf("NRI plugin on %s: %v", h.NRISocket, err)
	}
	h.AddCleanup(func() error { plugin.Stop(); return nil })

	config := h.PodConfig("nri-seen")
	id := runPod(t, ctx, h, config)
	ip := podStatus(t, ctx, h, id).GetNetwork().GetIp()

	seen := recorder.pod(config.Metadata.Uid)
	if seen == nil {
		t.Fatalf("NRI plugin was not told about pod %s (uid %s)", id, config.Metadata.Uid)
	}
	if seen.Id != id || seen.Name != config.Metadata.Name || seen.Namespace != stack.PodNamespace {
		t.Errorf("NRI plugin saw pod %s %s/%s, want %s %s/%s", seen.Id, seen.Namespace, seen.Name, id, stack.PodNamespace, config.Metadata.Name)
	}
	if !slices.Contains(seen.Ips, ip) {
		t.Errorf("NRI plugin saw pod %s with IPs %v, want its CNI IP %s among them", id, seen.Ips, ip)
	}
}
