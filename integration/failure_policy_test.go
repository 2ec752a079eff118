package integration

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	criruntime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/knext-dev/knext/internal/stack"
)

// What a plugin's failure policy does when the plugin does not answer in time, on the real
// stack, for each of its four values. A status query that times out never drops the plugin,
// whatever its policy: it fails only with fail_request, and otherwise the plugin's last known
// answer stands in. A RunPodSandbox that times out fails the new pod only with fail_request
// (leaving nothing behind), and drops the plugin unless keep_connected. A StopPodSandbox that
// times out never fails the kubelet's call, which waits for the timeout; with fail_request the
// plugins after it do not get the request, and the plugin is dropped unless keep_connected.
func TestFailurePolicy(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		policy                     string
		failRequest, keepConnected bool
	}{
		{"none", false, false},
		{"fail_request", true, false},
		{"keep_connected", false, true},
		{"both", true, true},
	} {
		t.Run(tc.policy, func(t *testing.T) {
			t.Parallel()
			h, ctx := startHarness(t, stack.Options{NRIRequestTimeout: 500 * time.Millisecond})
			plugin := startTestPluginWithPolicy(t, ctx, h, "10", "net", tc.policy)
			after := startTestPlugin(t, ctx, h, "20", "after")
			id := runPod(t, ctx, h, annotatedPodConfig(h, "web", map[string]string{annotationIP: "192.0.2.90"}))
			closing := `closing plugin ` + plugin.nriName()

			plugin.behave(t, "web", behaveHang)
			status, err := h.Runtime.PodSandboxStatus(ctx, &criruntime.PodSandboxStatusRequest{PodSandboxId: id})
			if tc.failRequest {
				wantErrorNaming(t, err, "plugin "+plugin.nriName()+" failed to handle PodSandboxStatus request")
			} else if err != nil || status.GetStatus().GetNetwork().GetIp() != "192.0.2.90" {
				t.Errorf("status of pod %s while the plugin hangs: IP %q, error %v; want its last known 192.0.2.90", id,
					status.GetStatus().GetNetwork().GetIp(), err)
			}
			if n := logCount(t, h, closing); n != 0 {
				t.Errorf("a status query that timed out closed plugin %s (%d log lines)", plugin.nriName(), n)
			}
			plugin.behave(t, "web", "")
			wantPodReady(t, ctx, h, id)

			hold := filepath.Join(plugin.dir, "hold-run.late")
			if err := os.WriteFile(hold, nil, 0o644); err != nil {
				t.Fatal(err)
			}
			resp, err := h.Runtime.RunPodSandbox(ctx, &criruntime.RunPodSandboxRequest{Config: h.PodConfig("late")})
			if err := os.Remove(hold); err != nil {
				t.Fatal(err)
			}
			if tc.failRequest {
				if err == nil {
					t.Fatalf("policy %s: RunPodSandbox succeeded while the plugin did not answer", tc.policy)
				}
				wantErrorNaming(t, err, "plugin "+plugin.nriName()+" failed to handle RunPodSandbox request", "deadline exceeded")
				wantNothingLeftBehind(t, ctx, h, plugin.waitRunPodSandbox(t, "late"), 1)
			} else if err != nil {
				t.Errorf("RunPodSandbox while the plugin does not answer, with policy %s: %v", tc.policy, err)
			} else {
				wantPodReady(t, ctx, h, resp.GetPodSandboxId())
			}
			if dropped := logCount(t, h, closing) != 0; dropped == tc.keepConnected {
				t.Errorf("policy %s: plugin %s dropped after its RunPodSandbox timed out: %v, want %v", tc.policy, plugin.nriName(), dropped, !tc.keepConnected)
			}

			if !tc.keepConnected {
				if err := plugin.waitExit(t, 30*time.Second); err == nil {
					t.Errorf("plugin %s ended without error when it was dropped", plugin.nriName())
				}
				plugin.start(t, ctx)
			}
			closed := logCount(t, h, closing)
			hold = filepath.Join(plugin.dir, "hold-stop.web")
			if err := os.WriteFile(hold, nil, 0o644); err != nil {
				t.Fatal(err)
			}
			_, err = h.Runtime.StopPodSandbox(ctx, &criruntime.StopPodSandboxRequest{PodSandboxId: id})
			if err := os.Remove(hold); err != nil {
				t.Fatal(err)
			}
			if err != nil {
				t.Errorf("policy %s: StopPodSandbox failed while the plugin did not answer: %v", tc.policy, err)
			}
			if got := slices.Contains(after.podEvents(t, id), "StopPodSandbox"); got == tc.failRequest {
				t.Errorf("policy %s: the plugin after %s got StopPodSandbox: %v, want %v", tc.policy, plugin.nriName(), got, !tc.failRequest)
			}
			if dropped := logCount(t, h, closing) != closed; dropped == tc.keepConnected {
				t.Errorf("policy %s: plugin %s dropped after its StopPodSandbox timed out: %v, want %v", tc.policy, plugin.nriName(), dropped, !tc.keepConnected)
			}
		})
	}
}
