package integration

import (
	"context"
	"encoding/json"
	"os"
	"testing"
	"time"

	criruntime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/knext-dev/knext/internal/stack"
)

// testTimeout bounds each test's CRI calls; the go test -timeout should be larger.
const testTimeout = 3 * time.Minute

// TestMain lets the test binary double as a crashing harness owner (see runCrashingOwner), and
// removes the binaries the tests built.
func TestMain(m *testing.M) {
	if os.Getenv(crashingOwnerEnv) != "" {
		os.Exit(runCrashingOwner())
	}
	code := m.Run()
	removeBuiltBinaries()
	os.Exit(code)
}

// startHarness starts a private containerd for t and tears it down when t ends, pass or fail.
func startHarness(t *testing.T, opts stack.Options) (*stack.Stack, context.Context) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("integration tests need root")
	}
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	opts.Logf = t.Logf
	h, err := stack.New(ctx, opts)
	if err != nil {
		cancel()
		t.Fatalf("start harness: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Log(h.LogTail(60))
		}
		cancel()
		if err := h.Close(); err != nil {
			t.Errorf("close harness: %v", err)
		}
	})
	return h, ctx
}

// runPod runs config's pod and returns its ID.
func runPod(t *testing.T, ctx context.Context, h *stack.Stack, config *criruntime.PodSandboxConfig) string {
	t.Helper()
	resp, err := h.Runtime.RunPodSandbox(ctx, &criruntime.RunPodSandboxRequest{Config: config})
	if err != nil {
		t.Fatalf("run pod %s: %v", config.Metadata.Name, err)
	}
	return resp.PodSandboxId
}

// podStatus returns the CRI status of pod id.
func podStatus(t *testing.T, ctx context.Context, h *stack.Stack, id string) *criruntime.PodSandboxStatus {
	t.Helper()
	resp, err := h.Runtime.PodSandboxStatus(ctx, &criruntime.PodSandboxStatusRequest{PodSandboxId: id})
	if err != nil {
		t.Fatalf("status of pod %s: %v", id, err)
	}
	return resp.Status
}

// inspectp is the part of `crictl inspectp -o json` the tests read.
type inspectp struct {
	Status struct {
		ID      string `json:"id"`
		State   string `json:"state"`
		Network *struct {
			IP            string `json:"ip"`
			AdditionalIPs []struct {
				IP string `json:"ip"`
			} `json:"additionalIps"`
		} `json:"network"`
	} `json:"status"`
	// crictl shows each verbose info entry at the top level; podNetwork is knext's provenance.
	PodNetwork podNetworkInfo `json:"podNetwork"`
}

// crictlInspectpOutput returns what `crictl inspectp -o json` prints for pod id.
func crictlInspectpOutput(t *testing.T, ctx context.Context, h *stack.Stack, id string) []byte {
	t.Helper()
	out, err := h.Crictl(ctx, "inspectp", "-o", "json", id)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func crictlInspectp(t *testing.T, ctx context.Context, h *stack.Stack, id string) inspectp {
	t.Helper()
	out := crictlInspectpOutput(t, ctx, h, id)
	var result inspectp
	if err := json.Unmarshal(out, &result); err != nil {
		t.Fatalf("crictl inspectp %s: %v\n%s", id, err, out)
	}
	return result
}
