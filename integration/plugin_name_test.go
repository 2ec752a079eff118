package integration

import (
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/knext-dev/knext/internal/stack"
)

// One connected plugin per name, on a CNI-less node. A second plugin that registers as
// 10-bridge while nri-bridge is connected (NRI's own stub, as a leftover copy or a surge
// rollout would) replaces nri-bridge, whose connection is closed: never two plugins under one
// name. It cannot change the running pod's primary IP: the pod's status fails naming both IPs
// rather than report the impostor's. Once nri-bridge reconnects, it replaces the impostor in
// turn and the pod reports its IP again.
func TestOnePluginPerName(t *testing.T) {
	t.Parallel()
	n := startCNILessNode(t, func(h *stack.Stack) []string { return []string{"-ipv4-subnet", ipv4Subnet(h)} })
	n.startBridge(t)
	pod := n.runBridgePod(t, "web")
	ip := statusIPs(podStatus(t, n.ctx, n.h, pod.id))[0]

	// Stopped, nri-bridge cannot reconnect while the impostor is connected.
	bridge := n.bridge.PID()
	if err := syscall.Kill(bridge, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	resumed := false
	resume := func() {
		if !resumed {
			resumed = true
			if err := syscall.Kill(bridge, syscall.SIGCONT); err != nil {
				t.Error(err)
			}
		}
	}
	t.Cleanup(resume)

	impostor := startTestPlugin(t, n.ctx, n.h, "10", stack.NRIBridgePlugin)
	waitLogLine(t, n.h, nriBridgeName+"["+strconv.Itoa(impostor.process.PID())+"] replaces the connected plugin", nriBridgeName+"["+strconv.Itoa(bridge)+"]")
	impostor.behave(t, "", behaveReport("10.66.6.6"))
	err := podStatusError(t, n.ctx, n.h, pod.id)
	wantErrorNaming(t, err, "has the primary IP "+ip, "10.66.6.6 (nri:"+nriBridgeName+")", "the primary IP of a running pod never changes")
	if out, err := n.h.Crictl(n.ctx, "inspectp", pod.id); strings.Contains(string(out), "10.66.6.6") {
		t.Errorf("crictl inspectp of pod %s shows the impostor's IP (%v):\n%s", pod.id, err, out)
	}

	resume()
	if err := impostor.waitExit(t, 30*time.Second); err == nil {
		t.Errorf("the impostor %s exited without error, want its connection closed by nri-bridge's return", impostor.nriName())
	}
	waitLogLine(t, n.h, nriBridgeName+"["+strconv.Itoa(bridge)+"] replaces the connected plugin", nriBridgeName+"["+strconv.Itoa(impostor.process.PID())+"]")
	if got := statusIPs(podStatus(t, n.ctx, n.h, pod.id)); len(got) == 0 || got[0] != ip {
		t.Errorf("pod %s reports %v once nri-bridge is back, want %s first", pod.id, got, ip)
	}
	n.waitNetworkReady(t, true)
}
