package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	criruntime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/knext-dev/knext/internal/ociimage"
	"github.com/knext-dev/knext/internal/stack"
)

// podNetworkInfoKey is the verbose PodSandboxStatus info entry that shows where a pod's IPs come
// from (C6).
const podNetworkInfoKey = "podNetwork"

// podNetworkInfo is the podNetworkInfoKey entry.
type podNetworkInfo struct {
	IPs         []reportedIP  `json:"ips"`
	NRINoAnswer []nriNoAnswer `json:"nriNoAnswer"`
}

// nriNoAnswer is a subscribed NRI plugin that gave no live answer, and why.
type nriNoAnswer struct {
	Plugin string `json:"plugin"`
	Error  string `json:"error"`
}

// reportedIP is one reported IP with its source ("cni" or "nri:<plugin>") and, for NRI, whether
// the plugin's answer was "live" or "last-known".
type reportedIP struct {
	IP     string `json:"ip"`
	Source string `json:"source"`
	NRI    string `json:"nri,omitempty"`
}

func cniSourced(ip string) reportedIP { return reportedIP{IP: ip, Source: "cni"} }

func liveFrom(p *testPlugin, ip string) reportedIP {
	return reportedIP{IP: ip, Source: "nri:" + p.nriName(), NRI: "live"}
}

func lastKnownFrom(p *testPlugin, ip string) reportedIP {
	return reportedIP{IP: ip, Source: "nri:" + p.nriName(), NRI: "last-known"}
}

// annotatedPodConfig is h.PodConfig(name) with annotations.
func annotatedPodConfig(h *stack.Stack, name string, annotations map[string]string) *criruntime.PodSandboxConfig {
	config := h.PodConfig(name)
	config.Annotations = annotations
	return config
}

// verbosePodStatus returns pod id's verbose CRI status and its podNetwork info.
func verbosePodStatus(t *testing.T, ctx context.Context, h *stack.Stack, id string) (*criruntime.PodSandboxStatus, podNetworkInfo) {
	t.Helper()
	resp, err := h.Runtime.PodSandboxStatus(ctx, &criruntime.PodSandboxStatusRequest{PodSandboxId: id, Verbose: true})
	if err != nil {
		t.Fatalf("verbose status of pod %s: %v", id, err)
	}
	return resp.Status, parsePodNetworkInfo(t, id, resp.Info)
}

func parsePodNetworkInfo(t *testing.T, id string, info map[string]string) podNetworkInfo {
	t.Helper()
	raw, ok := info[podNetworkInfoKey]
	if !ok {
		t.Fatalf("verbose status of pod %s has no %q info, only %v", id, podNetworkInfoKey, slices.Sorted(maps.Keys(info)))
	}
	var network podNetworkInfo
	if err := json.Unmarshal([]byte(raw), &network); err != nil {
		t.Fatalf("verbose status of pod %s: %s info %q: %v", id, podNetworkInfoKey, raw, err)
	}
	return network
}

// statusIPs is the CRI view of a pod's IPs: the primary first.
func statusIPs(status *criruntime.PodSandboxStatus) []string {
	var ips []string
	if ip := status.GetNetwork().GetIp(); ip != "" {
		ips = append(ips, ip)
	}
	for _, ip := range status.GetNetwork().GetAdditionalIps() {
		ips = append(ips, ip.GetIp())
	}
	return ips
}

// wantIPs checks the CRI IPs and their provenance in one verbose status.
func wantIPs(t *testing.T, id string, status *criruntime.PodSandboxStatus, network podNetworkInfo, want ...reportedIP) {
	t.Helper()
	wantCRI := make([]string, 0, len(want))
	for _, ip := range want {
		wantCRI = append(wantCRI, ip.IP)
	}
	if got := statusIPs(status); !slices.Equal(got, wantCRI) {
		t.Errorf("pod %s reports IPs %v (primary first), want %v", id, got, wantCRI)
	}
	if !slices.Equal(network.IPs, want) {
		t.Errorf("pod %s shows provenance %+v, want %+v", id, network.IPs, want)
	}
}

// cniIPsOf returns the IPs host-local allocated to pod id, independently of what CRI reports,
// IPv4 first.
func cniIPsOf(t *testing.T, h *stack.Stack, id string) []string {
	t.Helper()
	dir := filepath.Join(h.IPAMDataDir, h.Network)
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var ips []netip.Addr
	for _, e := range entries {
		ip, err := netip.ParseAddr(e.Name())
		if err != nil {
			continue
		}
		owner, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if strings.HasPrefix(string(owner), id) {
			ips = append(ips, ip)
		}
	}
	slices.SortFunc(ips, netip.Addr.Compare)
	var sorted []string
	for _, ip := range ips {
		sorted = append(sorted, ip.String())
	}
	return sorted
}

// cniIPOf returns the one IP host-local allocated to pod id.
func cniIPOf(t *testing.T, h *stack.Stack, id string) string {
	t.Helper()
	ips := cniIPsOf(t, h, id)
	if len(ips) != 1 {
		t.Fatalf("host-local allocated %v to pod %s, want one IP", ips, id)
	}
	return ips[0]
}

// podStatusError returns the error of pod id's CRI status, failing the test if there is none.
func podStatusError(t *testing.T, ctx context.Context, h *stack.Stack, id string) error {
	t.Helper()
	resp, err := h.Runtime.PodSandboxStatus(ctx, &criruntime.PodSandboxStatusRequest{PodSandboxId: id})
	if err == nil {
		t.Fatalf("status of pod %s succeeded with IPs %v, want an error", id, statusIPs(resp.Status))
	}
	return err
}

// wantErrorNaming checks that err names every one of names.
func wantErrorNaming(t *testing.T, err error, names ...string) {
	t.Helper()
	for _, name := range names {
		if !strings.Contains(err.Error(), name) {
			t.Errorf("error %q does not name %s", err, name)
		}
	}
}

// wantPodReady checks through ListPodSandbox, which does not report IPs, that pod id is READY.
func wantPodReady(t *testing.T, ctx context.Context, h *stack.Stack, id string) {
	t.Helper()
	resp, err := h.Runtime.ListPodSandbox(ctx, &criruntime.ListPodSandboxRequest{Filter: &criruntime.PodSandboxFilter{Id: id}})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Items) != 1 || resp.Items[0].State != criruntime.PodSandboxState_SANDBOX_READY {
		t.Errorf("pod %s is listed as %v, want one READY pod", id, resp.Items)
	}
}

// runContainer creates and starts a sleeping busybox container in pod podID.
func runContainer(t *testing.T, ctx context.Context, h *stack.Stack, podID string, podConfig *criruntime.PodSandboxConfig, name string) string {
	t.Helper()
	created, err := h.Runtime.CreateContainer(ctx, &criruntime.CreateContainerRequest{
		PodSandboxId:  podID,
		Config:        h.ContainerConfig(name, ociimage.BusyboxImage, "sleep", "3600"),
		SandboxConfig: podConfig,
	})
	if err != nil {
		t.Fatalf("create container %s in pod %s: %v", name, podID, err)
	}
	if _, err := h.Runtime.StartContainer(ctx, &criruntime.StartContainerRequest{ContainerId: created.ContainerId}); err != nil {
		t.Fatalf("start container %s in pod %s: %v", name, podID, err)
	}
	return created.ContainerId
}

// wantUpstream checks whether the daemon that answers is upstream containerd or knext, whose
// version says knext.
func wantUpstream(t *testing.T, ctx context.Context, h *stack.Stack, upstream bool) {
	t.Helper()
	resp, err := h.Runtime.Version(ctx, &criruntime.VersionRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if isKnext := strings.Contains(resp.RuntimeVersion, "knext"); isKnext == upstream {
		t.Fatalf("runtime version %q: want upstream %v", resp.RuntimeVersion, upstream)
	}
}

// Test 1: a plugin that sets the primary IP displaces the CNI IP to the additional IPs, in CRI
// and in crictl inspectp with provenance; containerd logs the plugins' answers once per change.
func TestPodStatusPluginSetsPrimaryIP(t *testing.T) {
	t.Parallel()
	h, ctx := startHarness(t, stack.Options{})
	plugin := startTestPlugin(t, ctx, h, "10", "netip")
	id := runPod(t, ctx, h, annotatedPodConfig(h, "nri-primary", map[string]string{annotationIP: "192.0.2.10"}))
	cniIP := cniIPOf(t, h, id)

	status, network := verbosePodStatus(t, ctx, h, id)
	wantIPs(t, id, status, network, liveFrom(plugin, "192.0.2.10"), cniSourced(cniIP))

	// What an operator sees.
	shown := crictlInspectp(t, ctx, h, id)
	if n := shown.Status.Network; n == nil || n.IP != "192.0.2.10" || len(n.AdditionalIPs) != 1 || n.AdditionalIPs[0].IP != cniIP {
		t.Errorf("crictl inspectp %s shows network %+v, want ip 192.0.2.10 and additional %s", id, n, cniIP)
	}
	if want := []reportedIP{liveFrom(plugin, "192.0.2.10"), cniSourced(cniIP)}; !slices.Equal(shown.PodNetwork.IPs, want) {
		t.Errorf("crictl inspectp %s shows provenance %+v, want %+v", id, shown.PodNetwork.IPs, want)
	}

	// The plugins' answers are logged at info level once when they change (the first time at
	// RunPodSandbox), not on every query.
	podStatus(t, ctx, h, id)
	first := answersLogLine(id, "nri-primary", "{Plugin:"+plugin.nriName()+" IP:192.0.2.10 AdditionalIPs:[]}")
	if n := logCount(t, h, first); n != 1 {
		t.Errorf("containerd logged %q %d times after RunPodSandbox and three queries, want once", first, n)
	}
	plugin.behave(t, "nri-primary", behaveReport("192.0.2.10", "192.0.2.11"))
	for range 2 {
		status, network = verbosePodStatus(t, ctx, h, id)
		wantIPs(t, id, status, network, liveFrom(plugin, "192.0.2.10"), liveFrom(plugin, "192.0.2.11"), cniSourced(cniIP))
	}
	changed := answersLogLine(id, "nri-primary", "{Plugin:"+plugin.nriName()+" IP:192.0.2.10 AdditionalIPs:[192.0.2.11]}")
	for line, want := range map[string]int{first: 1, changed: 1} {
		if n := logCount(t, h, line); n != want {
			t.Errorf("containerd logged %q %d times after the plugin's answer changed and two queries, want %d", line, n, want)
		}
	}
}

// answersLogLine is how containerd logs, at info level, the NRI plugins' answers (each
// "{Plugin:<nri name> IP:<ip> AdditionalIPs:[<ips>]}") about pod sandbox id of the pod named pod
// when they change.
func answersLogLine(id, pod string, answers ...string) string {
	return `level=info msg="NRI plugins report the IPs of pod sandbox \"` + id + `\" (` + stack.PodNamespace + "/" + pod +
		"): [" + strings.Join(answers, " ") + `]"`
}

// Test 2: a plugin that sets only additional IPs keeps the CNI primary first; its IPs come
// out canonical.
func TestPodStatusPluginAddsIPs(t *testing.T) {
	t.Parallel()
	h, ctx := startHarness(t, stack.Options{})
	plugin := startTestPlugin(t, ctx, h, "10", "secondary")
	id := runPod(t, ctx, h, annotatedPodConfig(h, "nri-additional", map[string]string{
		annotationAdditionalIPs: "192.0.2.20,2001:DB8::20",
	}))
	cniIP := cniIPOf(t, h, id)

	status, network := verbosePodStatus(t, ctx, h, id)
	wantIPs(t, id, status, network, cniSourced(cniIP), liveFrom(plugin, "192.0.2.20"), liveFrom(plugin, "2001:db8::20"))
}

// statusResponses returns pod id's plain and verbose CRI status responses.
func statusResponses(t *testing.T, ctx context.Context, h *stack.Stack, id string) (plain, verbose *criruntime.PodSandboxStatusResponse) {
	t.Helper()
	var err error
	if plain, err = h.Runtime.PodSandboxStatus(ctx, &criruntime.PodSandboxStatusRequest{PodSandboxId: id}); err != nil {
		t.Fatalf("status of pod %s: %v", id, err)
	}
	if verbose, err = h.Runtime.PodSandboxStatus(ctx, &criruntime.PodSandboxStatusRequest{PodSandboxId: id, Verbose: true}); err != nil {
		t.Fatalf("verbose status of pod %s: %v", id, err)
	}
	return plain, verbose
}

// wantSameBytes checks that knext's response is byte for byte upstream's, in the deterministic
// wire form (map entries sorted).
func wantSameBytes(t *testing.T, what string, knext, upstream proto.Message) {
	t.Helper()
	marshal := proto.MarshalOptions{Deterministic: true}
	knextBytes, err := marshal.Marshal(knext)
	if err != nil {
		t.Fatal(err)
	}
	upstreamBytes, err := marshal.Marshal(upstream)
	if err != nil {
		t.Fatal(err)
	}
	if string(knextBytes) != string(upstreamBytes) {
		t.Errorf("%s: knext answers\n%v\nupstream answers\n%v", what, knext, upstream)
	}
}

// wantNoPodNetworkInfo checks that verbose info has no podNetwork entry: NRI plugins had no say.
func wantNoPodNetworkInfo(t *testing.T, id string, info map[string]string) {
	t.Helper()
	if raw, ok := info[podNetworkInfoKey]; ok {
		t.Errorf("verbose status of pod %s has %q info %s, want none: no NRI plugin has a say in its IPs", id, podNetworkInfoKey, raw)
	}
}

// Test 3: with no plugin, PodSandboxStatus is byte for byte what upstream containerd answers
// for the same pod on the same root, verbose status included.
func TestPodStatusWithoutPluginIsUpstreams(t *testing.T) {
	t.Parallel()
	upstream := upstreamContainerd(t)
	h, ctx := startHarness(t, stack.Options{})
	config := h.PodConfig("no-plugin")
	id := runPod(t, ctx, h, config)
	runContainer(t, ctx, h, id, config, "sleeper")

	wantUpstream(t, ctx, h, false)
	knextPlain, knextVerbose := statusResponses(t, ctx, h, id)
	if err := h.RestartBinary(ctx, upstream); err != nil {
		t.Fatal(err)
	}
	wantUpstream(t, ctx, h, true)
	upstreamPlain, upstreamVerbose := statusResponses(t, ctx, h, id)

	if len(upstreamPlain.Status.GetNetwork().GetIp()) == 0 || len(upstreamVerbose.Info) == 0 {
		t.Errorf("pod %s: upstream reports IP %q and verbose info %v: the comparison proves nothing", id, upstreamPlain.Status.GetNetwork().GetIp(), upstreamVerbose.Info)
	}
	wantSameBytes(t, "status of pod "+id, knextPlain, upstreamPlain)
	wantSameBytes(t, "verbose status of pod "+id, knextVerbose, upstreamVerbose)
	wantNoPodNetworkInfo(t, id, knextVerbose.Info)
}

// Test 4: a host-network pod reports no IP, shows no NRI provenance, and its plugin is never
// asked, not even for the events of its containers.
func TestPodStatusHostNetworkNeverAsksPlugin(t *testing.T) {
	t.Parallel()
	h, ctx := startHarness(t, stack.Options{})
	plugin := startTestPlugin(t, ctx, h, "10", "netip")
	config := h.HostNetworkPodConfig("host-net-nri")
	config.Annotations = map[string]string{annotationIP: "192.0.2.40"}
	id := runPod(t, ctx, h, config)
	container := runContainer(t, ctx, h, id, config, "sleeper")
	if _, err := h.Runtime.StopContainer(ctx, &criruntime.StopContainerRequest{ContainerId: container, Timeout: 1}); err != nil {
		t.Fatal(err)
	}

	resp, err := h.Runtime.PodSandboxStatus(ctx, &criruntime.PodSandboxStatusRequest{PodSandboxId: id, Verbose: true})
	if err != nil {
		t.Fatalf("verbose status of host-network pod %s: %v", id, err)
	}
	if ips := statusIPs(resp.Status); len(ips) != 0 {
		t.Errorf("host-network pod %s reports IPs %v, want none", id, ips)
	}
	wantNoPodNetworkInfo(t, id, resp.Info)
	if calls := plugin.calls(t, ""); calls != 0 {
		t.Errorf("NRI plugin %s was asked %d times about a host-network pod, want never", plugin.nriName(), calls)
	}
}

// Test 5: two plugins reporting different primary IPs for a new pod fail its RunPodSandbox,
// naming the pod, both plugins and both IPs, and leave nothing behind. For a running pod, a
// plugin that starts reporting a primary IP other than the one another plugin reports fails its
// status alike; the pod stays READY and keeps working, and its status recovers with the owner's
// IP once the other plugin stops claiming.
func TestPodStatusConflictingPlugins(t *testing.T) {
	t.Parallel()
	h, ctx := startHarness(t, stack.Options{})
	alpha := startTestPlugin(t, ctx, h, "10", "alpha")
	beta := startTestPlugin(t, ctx, h, "20", "beta")
	_, err := h.Runtime.RunPodSandbox(ctx, &criruntime.RunPodSandboxRequest{Config: annotatedPodConfig(h, "conflict", map[string]string{
		pluginAnnotation("alpha", "ip"): "192.0.2.51",
		pluginAnnotation("beta", "ip"):  "192.0.2.52",
	})})
	refused := wantRunRefused(t, ctx, h, err, "conflict", 0, []*testPlugin{alpha, beta},
		"NRI plugins "+alpha.nriName()+" and "+beta.nriName()+" both report the primary IP of the pod: 192.0.2.51 and 192.0.2.52")
	wantCNIReleased(t, h, refused)

	// The refused pod holds no IP: a running pod gets alpha's.
	config := annotatedPodConfig(h, "conflict-later", map[string]string{pluginAnnotation("alpha", "ip"): "192.0.2.51"})
	id := runPod(t, ctx, h, config)
	cniIP := cniIPOf(t, h, id)
	status, network := verbosePodStatus(t, ctx, h, id)
	wantIPs(t, id, status, network, liveFrom(alpha, "192.0.2.51"), cniSourced(cniIP))

	beta.behave(t, "conflict-later", behaveReport("192.0.2.52"))
	err = podStatusError(t, ctx, h, id)
	wantErrorNaming(t, err, fmt.Sprintf("pod sandbox %q (%s/conflict-later)", id, stack.PodNamespace),
		"NRI plugins "+alpha.nriName()+" and "+beta.nriName()+" both report the primary IP of the pod: 192.0.2.51 and 192.0.2.52")
	wantPodReady(t, ctx, h, id)
	container := runContainer(t, ctx, h, id, config, "sleeper")
	if _, err := h.Runtime.ExecSync(ctx, &criruntime.ExecSyncRequest{ContainerId: container, Cmd: []string{"true"}, Timeout: 30}); err != nil {
		t.Errorf("exec in pod %s while its status fails: %v", id, err)
	}

	beta.behave(t, "conflict-later", "")
	status, network = verbosePodStatus(t, ctx, h, id)
	wantIPs(t, id, status, network, liveFrom(alpha, "192.0.2.51"), cniSourced(cniIP))
}

// invalidPodIP is a value no pod can hold as its IP, and why.
type invalidPodIP struct {
	value   string
	primary bool // reported as the primary IP, else as an additional IP
	why     string
}

// invalidPodIPs are values an answer may not hold: not bare IP addresses, and special addresses.
var invalidPodIPs = []invalidPodIP{
	{"192.0.2.300", true, "not a bare IPv4 or IPv6 address"},
	{"192.0.2.62/24", false, "not a bare IPv4 or IPv6 address"},
	{"fe80::62%eth0", false, "not a bare IPv4 or IPv6 address"},
	{"0.0.0.0", true, "an unspecified address, which no pod can hold"},
	{"::", false, "an unspecified address, which no pod can hold"},
	{"127.0.0.1", true, "a loopback address, which no pod can hold"},
	{"::1", false, "a loopback address, which no pod can hold"},
	{"169.254.0.62", false, "a link-local address, which no pod can hold"},
	{"fe80::62", true, "a link-local address, which no pod can hold"},
	{"224.0.0.62", true, "a multicast address, which no pod can hold"},
	{"ff02::62", false, "a multicast address, which no pod can hold"},
	{"255.255.255.255", true, "the broadcast address, which no pod can hold"},
}

// Test 6: an answer with a value no pod can hold as its IP (not a bare IPv4 or IPv6 address; an
// unspecified, loopback, link-local, multicast or broadcast address), as the primary or an
// additional IP, fails a new pod's RunPodSandbox, naming the plugin, the pod and the value, and
// leaves nothing behind. For a running pod the same answers fail its status alike, while the
// pod stays READY; they are never remembered: once the plugin answers validly again its IPs are
// live, and once it is gone its last valid answer stands in.
func TestPodStatusInvalidIP(t *testing.T) {
	t.Parallel()
	h, ctx := startHarness(t, stack.Options{})
	plugin := startTestPlugin(t, ctx, h, "10", "netip")
	running := runPod(t, ctx, h, annotatedPodConfig(h, "running", map[string]string{annotationIP: "192.0.2.60"}))
	cniIP := cniIPOf(t, h, running)
	valid := []reportedIP{liveFrom(plugin, "192.0.2.60"), cniSourced(cniIP)}
	status, network := verbosePodStatus(t, ctx, h, running)
	wantIPs(t, running, status, network, valid...)

	for i, tc := range invalidPodIPs {
		name := fmt.Sprintf("invalid-%d", i)
		annotations := map[string]string{annotationIP: tc.value}
		if !tc.primary {
			annotations = map[string]string{annotationAdditionalIPs: "192.0.2.61," + tc.value}
		}
		_, err := h.Runtime.RunPodSandbox(ctx, &criruntime.RunPodSandboxRequest{Config: annotatedPodConfig(h, name, annotations)})
		refused := wantRunRefused(t, ctx, h, err, name, 1, []*testPlugin{plugin},
			invalidNetworkError(plugin, name)+fmt.Sprintf("invalid IP %q: %s", tc.value, tc.why))
		wantCNIReleased(t, h, refused)
	}

	for _, tc := range invalidPodIPs {
		behaviour := behaveReport(tc.value)
		if !tc.primary {
			behaviour = behaveReport("192.0.2.60", tc.value)
		}
		plugin.behave(t, "running", behaviour)
		wantErrorNaming(t, podStatusError(t, ctx, h, running),
			invalidNetworkError(plugin, "running")+fmt.Sprintf("invalid IP %q: %s", tc.value, tc.why), running)
		wantPodReady(t, ctx, h, running)
	}
	plugin.behave(t, "running", "")
	status, network = verbosePodStatus(t, ctx, h, running)
	wantIPs(t, running, status, network, valid...)

	plugin.behave(t, "running", behaveReport("192.0.2.60", "127.0.0.1"))
	podStatusError(t, ctx, h, running)
	plugin.kill(t)
	waitLogLine(t, h, `connection to plugin \"`+plugin.nriName()+`\" closed`)
	status, network = verbosePodStatus(t, ctx, h, running)
	wantIPs(t, running, status, network, lastKnownFrom(plugin, "192.0.2.60"), cniSourced(cniIP))
}

// Test 7: when the plugin dies, its last known IPs are still reported; when it is back, they
// are live again. A plugin that owned the pod's primary IP and now answers with no IP would
// change the primary IP of the running pod: that fails the status, naming the pod and both IPs
// with their sources, the pod stays READY, and the answer is not remembered. A plugin that
// fails a request, or exits in the middle of one, gives no answer: its last known IPs stand in,
// and a plugin that fails stays connected.
func TestPodStatusPluginDiesAndComesBack(t *testing.T) {
	t.Parallel()
	h, ctx := startHarness(t, stack.Options{})
	plugin := startTestPlugin(t, ctx, h, "10", "netip")
	id := runPod(t, ctx, h, annotatedPodConfig(h, "plugin-dies", map[string]string{annotationIP: "192.0.2.70"}))
	cniIP := cniIPOf(t, h, id)
	status, network := verbosePodStatus(t, ctx, h, id)
	wantIPs(t, id, status, network, liveFrom(plugin, "192.0.2.70"), cniSourced(cniIP))

	plugin.kill(t)
	status, network = verbosePodStatus(t, ctx, h, id)
	wantIPs(t, id, status, network, lastKnownFrom(plugin, "192.0.2.70"), cniSourced(cniIP))

	plugin.start(t, ctx)
	before := plugin.calls(t, id)
	status, network = verbosePodStatus(t, ctx, h, id)
	wantIPs(t, id, status, network, liveFrom(plugin, "192.0.2.70"), cniSourced(cniIP))
	if calls := plugin.calls(t, id); calls != before+1 {
		t.Errorf("restarted NRI plugin got %d requests for one status query, want 1", calls-before)
	}

	// A plugin that answers with no IP gives up the primary IP it reported: the running pod's
	// primary IP would become its CNI IP.
	plugin.behave(t, "plugin-dies", behaveEmpty)
	wantErrorNaming(t, podStatusError(t, ctx, h, id), fmt.Sprintf("pod sandbox %q (%s/plugin-dies)", id, stack.PodNamespace),
		"the primary IP 192.0.2.70 (nri:"+plugin.nriName()+")", "would now make it "+cniIP+" (cni)",
		"the primary IP of a running pod never changes")
	wantPodReady(t, ctx, h, id)

	// A plugin that fails the request gives no answer, but stays connected; its last known
	// answer, not the refused empty one, stands in.
	plugin.behave(t, "plugin-dies", behaveError)
	status, network = verbosePodStatus(t, ctx, h, id)
	wantIPs(t, id, status, network, lastKnownFrom(plugin, "192.0.2.70"), cniSourced(cniIP))
	if len(network.NRINoAnswer) != 1 || !strings.Contains(network.NRINoAnswer[0].Error, "fails on purpose") {
		t.Errorf("pod %s shows plugins without answer %+v, want %s failing on purpose", id, network.NRINoAnswer, plugin.nriName())
	}
	if exited, err := plugin.process.Exited(); exited {
		t.Fatalf("NRI plugin %s exited (%v) after failing a request", plugin.nriName(), err)
	}
	plugin.behave(t, "plugin-dies", "")
	status, network = verbosePodStatus(t, ctx, h, id)
	wantIPs(t, id, status, network, liveFrom(plugin, "192.0.2.70"), cniSourced(cniIP))

	plugin.behave(t, "plugin-dies", behaveExit)
	status, network = verbosePodStatus(t, ctx, h, id)
	wantIPs(t, id, status, network, lastKnownFrom(plugin, "192.0.2.70"), cniSourced(cniIP))
	if err := plugin.waitExit(t, 10*time.Second); err == nil || !strings.Contains(err.Error(), "exit status 3") {
		t.Errorf("NRI plugin %s ended with %v, want its exit status 3", plugin.nriName(), err)
	}
	if len(network.NRINoAnswer) != 1 || network.NRINoAnswer[0].Plugin != plugin.nriName() {
		t.Errorf("pod %s shows plugins without answer %+v, want %s", id, network.NRINoAnswer, plugin.nriName())
	}
}

// Test 8: after a restart of containerd while the plugin is down, the last known IPs come from
// disk.
func TestPodStatusLastKnownSurvivesRestart(t *testing.T) {
	t.Parallel()
	h, ctx := startHarness(t, stack.Options{})
	plugin := startTestPlugin(t, ctx, h, "10", "netip")
	id := runPod(t, ctx, h, annotatedPodConfig(h, "restart-nri", map[string]string{
		annotationIP: "192.0.2.80", annotationAdditionalIPs: "2001:db8::80",
	}))
	cniIP := cniIPOf(t, h, id)
	status, network := verbosePodStatus(t, ctx, h, id)
	wantIPs(t, id, status, network, liveFrom(plugin, "192.0.2.80"), liveFrom(plugin, "2001:db8::80"), cniSourced(cniIP))

	plugin.kill(t)
	if err := h.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	status, network = verbosePodStatus(t, ctx, h, id)
	wantIPs(t, id, status, network, lastKnownFrom(plugin, "192.0.2.80"), lastKnownFrom(plugin, "2001:db8::80"), cniSourced(cniIP))
	if status.GetState() != criruntime.PodSandboxState_SANDBOX_READY {
		t.Errorf("pod %s is %s after the restart, want READY", id, status.GetState())
	}

	plugin.start(t, ctx)
	status, network = verbosePodStatus(t, ctx, h, id)
	wantIPs(t, id, status, network, liveFrom(plugin, "192.0.2.80"), liveFrom(plugin, "2001:db8::80"), cniSourced(cniIP))
}

// errBackingOff is how NRI reports a plugin it did not ask because its backoff after a status
// query that timed out has not expired (S4).
const errBackingOff = "not asked: backing off after a status query timed out"

// timedVerboseStatus returns pod id's verbose CRI status, its podNetwork info, and how long the
// query took.
func timedVerboseStatus(t *testing.T, ctx context.Context, h *stack.Stack, id string) (*criruntime.PodSandboxStatus, podNetworkInfo, time.Duration) {
	t.Helper()
	start := time.Now()
	resp, err := h.Runtime.PodSandboxStatus(ctx, &criruntime.PodSandboxStatusRequest{PodSandboxId: id, Verbose: true})
	elapsed := time.Since(start)
	if err != nil {
		t.Fatalf("verbose status of pod %s: %v", id, err)
	}
	return resp.Status, parsePodNetworkInfo(t, id, resp.Info), elapsed
}

// wantNoAnswer checks that the only plugin without a live answer is plugin, with an error that
// contains why.
func wantNoAnswer(t *testing.T, id string, network podNetworkInfo, plugin, why string) {
	t.Helper()
	if len(network.NRINoAnswer) != 1 || network.NRINoAnswer[0].Plugin != plugin || !strings.Contains(network.NRINoAnswer[0].Error, why) {
		t.Errorf("pod %s shows plugins without answer %+v, want only %s with %q", id, network.NRINoAnswer, plugin, why)
	}
}

// waitLiveAgain queries pod id until plugin answers live again (its backoff expired and it
// answered in time), and returns that status.
func waitLiveAgain(t *testing.T, ctx context.Context, h *stack.Stack, id, plugin string) (*criruntime.PodSandboxStatus, podNetworkInfo) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		status, network := verbosePodStatus(t, ctx, h, id)
		if !slices.ContainsFunc(network.NRINoAnswer, func(n nriNoAnswer) bool { return n.Plugin == plugin }) {
			return status, network
		}
		if time.Now().After(deadline) {
			t.Fatalf("NRI plugin %s still gives no answer for pod %s after a minute: %+v", plugin, id, network.NRINoAnswer)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// wantStillConnected checks that the plugin's process runs, that NRI neither closed it nor saw
// its connection close, and that it was not synchronized again since NRI synchronized it
// connections times.
func wantStillConnected(t *testing.T, h *stack.Stack, plugin string, process *stack.Process, connections int) {
	t.Helper()
	if connections == 0 {
		t.Fatalf("NRI plugin %s was never synchronized: checking that it still is proves nothing", plugin)
	}
	if process != nil {
		if exited, err := process.Exited(); exited {
			t.Errorf("NRI plugin %s exited: %v", plugin, err)
		}
	}
	for _, line := range []string{"closing plugin " + plugin, `connection to plugin \"` + plugin + `\" closed`} {
		if n := logCount(t, h, line); n != 0 {
			t.Errorf("containerd logged %q %d times: NRI lost plugin %s", line, n, plugin)
		}
	}
	if now := nriConnections(t, h, plugin); now != connections {
		t.Errorf("NRI plugin %s was synchronized %d times, want still %d: it reconnected", plugin, now, connections)
	}
}

// Test 9: a hanging plugin costs one status query plugin_request_timeout, after which its last
// known answer is reported; meanwhile another pod starts and is queried without waiting. The
// plugin stays connected; while it backs off it is not asked and queries answer at once from
// its last known answers; once it answers again it is live again.
func TestPodStatusHangingPlugin(t *testing.T) {
	t.Parallel()
	// Long enough that the other pod's RunPodSandbox finishing first proves it did not wait.
	const requestTimeout = 10 * time.Second
	h, ctx := startHarness(t, stack.Options{NRIRequestTimeout: requestTimeout})
	plugin := startTestPlugin(t, ctx, h, "10", "netip")
	connections := plugin.connections(t)
	id := runPod(t, ctx, h, annotatedPodConfig(h, "hangs", map[string]string{annotationIP: "192.0.2.90"}))
	cniIP := cniIPOf(t, h, id)
	status, network := verbosePodStatus(t, ctx, h, id)
	wantIPs(t, id, status, network, liveFrom(plugin, "192.0.2.90"), cniSourced(cniIP))

	plugin.behave(t, "hangs", behaveHang)
	type result struct {
		resp    *criruntime.PodSandboxStatusResponse
		err     error
		elapsed time.Duration
	}
	hung := make(chan result, 1)
	callsBefore := plugin.calls(t, id)
	go func() {
		start := time.Now()
		resp, err := h.Runtime.PodSandboxStatus(ctx, &criruntime.PodSandboxStatusRequest{PodSandboxId: id, Verbose: true})
		hung <- result{resp, err, time.Since(start)}
	}()
	plugin.waitCalls(t, id, callsBefore+1)

	otherConfig := annotatedPodConfig(h, "meanwhile", map[string]string{annotationIP: "192.0.2.91"})
	other := runPod(t, ctx, h, otherConfig)
	otherStatus, otherNetwork := verbosePodStatus(t, ctx, h, other)
	select {
	case r := <-hung:
		t.Fatalf("the status query of the hanging pod returned (after %s, err %v) before another pod was run and queried", r.elapsed, r.err)
	default:
	}
	wantIPs(t, other, otherStatus, otherNetwork, liveFrom(plugin, "192.0.2.91"), cniSourced(cniIPOf(t, h, other)))

	r := <-hung
	// The backoff after the timeout lasts 1 s: query both pods right away, check afterwards.
	calls := plugin.calls(t, "")
	backoffStatus, backoffNetwork, backoffElapsed := timedVerboseStatus(t, ctx, h, id)
	otherStatus, otherNetwork, otherElapsed := timedVerboseStatus(t, ctx, h, other)

	if r.err != nil {
		t.Fatalf("status of pod %s with a hanging plugin: %v", id, r.err)
	}
	const margin = 5 * time.Second
	t.Logf("status of pod %s with a hanging plugin took %s (plugin_request_timeout %s)", id, r.elapsed, requestTimeout)
	if r.elapsed < requestTimeout-time.Second || r.elapsed > requestTimeout+margin {
		t.Errorf("status of pod %s with a hanging plugin took %s, want plugin_request_timeout %s (+ at most %s)", id, r.elapsed, requestTimeout, margin)
	}
	network = parsePodNetworkInfo(t, id, r.resp.Info)
	wantIPs(t, id, r.resp.Status, network, lastKnownFrom(plugin, "192.0.2.90"), cniSourced(cniIP))
	wantNoAnswer(t, id, network, plugin.nriName(), "deadline exceeded")

	// Backing off: the plugin is not asked, for any pod, and its last known answers stand in.
	t.Logf("while NRI plugin %s backs off, status queries took %s (pod %s) and %s (pod %s)", plugin.nriName(), backoffElapsed, id, otherElapsed, other)
	for _, q := range []struct {
		id      string
		status  *criruntime.PodSandboxStatus
		network podNetworkInfo
		elapsed time.Duration
		want    []reportedIP
	}{
		{id, backoffStatus, backoffNetwork, backoffElapsed, []reportedIP{lastKnownFrom(plugin, "192.0.2.90"), cniSourced(cniIP)}},
		{other, otherStatus, otherNetwork, otherElapsed, []reportedIP{lastKnownFrom(plugin, "192.0.2.91"), cniSourced(cniIPOf(t, h, other))}},
	} {
		wantIPs(t, q.id, q.status, q.network, q.want...)
		wantNoAnswer(t, q.id, q.network, plugin.nriName(), errBackingOff)
		if q.elapsed > requestTimeout/2 {
			t.Errorf("status of pod %s took %s while NRI plugin %s backs off: it waited for the plugin", q.id, q.elapsed, plugin.nriName())
		}
	}
	if asked := plugin.calls(t, "") - calls; asked != 0 {
		t.Errorf("NRI plugin %s was asked %d times while it backs off, want never", plugin.nriName(), asked)
	}
	wantStillConnected(t, h, plugin.nriName(), plugin.process, connections)

	// The plugin answers again: the first query after the backoff asks it, and it is live again.
	plugin.behave(t, "hangs", "")
	status, network = waitLiveAgain(t, ctx, h, id, plugin.nriName())
	wantIPs(t, id, status, network, liveFrom(plugin, "192.0.2.90"), cniSourced(cniIP))
	status, network = verbosePodStatus(t, ctx, h, other)
	wantIPs(t, other, status, network, liveFrom(plugin, "192.0.2.91"), cniSourced(cniIPOf(t, h, other)))
	wantStillConnected(t, h, plugin.nriName(), plugin.process, connections)
	for _, line := range []string{
		"plugin " + plugin.nriName() + " did not answer PodSandboxStatus within " + requestTimeout.String(),
		"plugin " + plugin.nriName() + " answers PodSandboxStatus again",
	} {
		if n := logCount(t, h, line); n != 1 {
			t.Errorf("containerd logged %q %d times, want once", line, n)
		}
	}
}

// Test 10: pods that upstream containerd created on the same root keep working under knext, and
// upstream still reads them after knext recorded an NRI answer for them.
func TestPodStatusUpstreamPodsUnderKnext(t *testing.T) {
	t.Parallel()
	upstream := upstreamContainerd(t)
	h, ctx := startHarness(t, stack.Options{})
	if err := h.RestartBinary(ctx, upstream); err != nil {
		t.Fatal(err)
	}
	wantUpstream(t, ctx, h, true)
	// Upstream ignores the annotation; under knext the plugin reports it.
	config := annotatedPodConfig(h, "from-upstream", map[string]string{annotationAdditionalIPs: "192.0.2.100"})
	id := runPod(t, ctx, h, config)
	container := runContainer(t, ctx, h, id, config, "sleeper")
	upstreamStatus := podStatus(t, ctx, h, id)
	cniIP := cniIPOf(t, h, id)
	if got := statusIPs(upstreamStatus); !slices.Equal(got, []string{cniIP}) {
		t.Fatalf("upstream reports IPs %v for pod %s, want its CNI IP %s", got, id, cniIP)
	}

	if err := h.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	wantUpstream(t, ctx, h, false)
	plugin := startTestPlugin(t, ctx, h, "10", "secondary")
	status, network := verbosePodStatus(t, ctx, h, id)
	wantIPs(t, id, status, network, cniSourced(cniIP), liveFrom(plugin, "192.0.2.100"))
	exec, err := h.Runtime.ExecSync(ctx, &criruntime.ExecSyncRequest{ContainerId: container, Cmd: []string{"ip", "-4", "-o", "addr", "show", "eth0"}, Timeout: 30})
	if err != nil || !strings.Contains(string(exec.GetStdout()), " "+cniIP+"/") {
		t.Errorf("exec in upstream's container %s under knext: %v, output %q, want eth0 with %s", container, err, exec.GetStdout(), cniIP)
	}

	// Upstream reads the metadata in which knext recorded the answer, and answers as before.
	plugin.kill(t)
	if err := h.RestartBinary(ctx, upstream); err != nil {
		t.Fatal(err)
	}
	if again := podStatus(t, ctx, h, id); !proto.Equal(again, upstreamStatus) {
		t.Errorf("upstream after knext reports %v for pod %s, before it reported %v", again, id, upstreamStatus)
	}

	if err := h.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	status, network = verbosePodStatus(t, ctx, h, id)
	wantIPs(t, id, status, network, cniSourced(cniIP), lastKnownFrom(plugin, "192.0.2.100"))
	if err := h.RemovePod(ctx, id); err != nil {
		t.Fatalf("knext stops and removes upstream's pod: %v", err)
	}
	if _, err := os.Stat(allocationFile(h, cniIP)); !os.IsNotExist(err) {
		t.Errorf("removed pod %s: allocation of %s still there (err %v)", id, cniIP, err)
	}
}

// C7: container events reuse the last answer instead of asking the plugin, and a burst of
// concurrent status queries for one pod makes one plugin call.
func TestPodStatusPluginCalls(t *testing.T) {
	t.Parallel()
	h, ctx := startHarness(t, stack.Options{})
	plugin := startTestPlugin(t, ctx, h, "10", "netip")
	// The delay keeps the first query of the burst in the plugin while the others arrive; it is
	// below the default plugin_request_timeout of the harness (2 s).
	config := annotatedPodConfig(h, "calls", map[string]string{annotationIP: "192.0.2.110", annotationDelay: "1s"})
	id := runPod(t, ctx, h, config)
	if got := statusIPs(podStatus(t, ctx, h, id)); len(got) == 0 || got[0] != "192.0.2.110" {
		t.Fatalf("pod %s reports IPs %v, want 192.0.2.110 first", id, got)
	}
	asked := plugin.calls(t, id)

	container := runContainer(t, ctx, h, id, config, "sleeper")
	if _, err := h.Runtime.StopContainer(ctx, &criruntime.StopContainerRequest{ContainerId: container, Timeout: 1}); err != nil {
		t.Fatal(err)
	}
	// containerd 2.4.2 can return from StopContainer while the container's exit is still being
	// handled (its task is gone, its state still RUNNING), and then refuses to remove it: wait
	// for the exit, as the kubelet's retries do.
	waitContainerExited(t, ctx, h, container)
	if _, err := h.Runtime.RemoveContainer(ctx, &criruntime.RemoveContainerRequest{ContainerId: container}); err != nil {
		t.Fatal(err)
	}
	if calls := plugin.calls(t, id); calls != asked {
		t.Errorf("the create, start, stop and remove events of a container asked the plugin %d times, want never", calls-asked)
	}

	const burst = 16
	var wg sync.WaitGroup
	errs := make(chan error, burst)
	query := func() {
		defer wg.Done()
		resp, err := h.Runtime.PodSandboxStatus(ctx, &criruntime.PodSandboxStatusRequest{PodSandboxId: id})
		if err == nil && resp.Status.GetNetwork().GetIp() != "192.0.2.110" {
			err = fmt.Errorf("reports IP %q", resp.Status.GetNetwork().GetIp())
		}
		errs <- err
	}
	wg.Add(burst)
	go query()
	plugin.waitCalls(t, id, asked+1)
	for range burst - 1 {
		go query()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Errorf("status of pod %s in a burst: %v", id, err)
		}
	}
	if calls := plugin.calls(t, id); calls != asked+1 {
		t.Errorf("%d concurrent status queries for pod %s asked the plugin %d times, want once", burst, id, calls-asked)
	}
}

// kubeletPodIPs is the kubelet's pick of a pod's IPs from a CRI status's [ip, additional...]
// (sortPodIPs, kubernetes pkg/kubelet/kubelet_pods.go): the first IP of the node's family, then
// the first IP of the other family. Every other IP is dropped.
func kubeletPodIPs(ips []string, nodeIPv6 bool) []string {
	var picked []string
	for _, family6 := range []bool{nodeIPv6, !nodeIPv6} {
		if i := slices.IndexFunc(ips, func(ip string) bool { return netip.MustParseAddr(ip).Is6() == family6 }); i >= 0 {
			picked = append(picked, ips[i])
		}
	}
	return picked
}

// S6, C3: CNI gives the pod an IPv4 and an IPv6 address, and an NRI plugin adds the pod's
// addresses on a secondary network: the kubelet's pick takes CNI's addresses, the network of the
// primary IP, in both families, whatever the node's family.
func TestPodStatusKubeletPicksThePrimaryNetwork(t *testing.T) {
	t.Parallel()
	h, ctx := startHarness(t, stack.Options{CNIDualStack: true})
	plugin := startTestPlugin(t, ctx, h, "10", "secondary")
	id := runPod(t, ctx, h, annotatedPodConfig(h, "dual", map[string]string{annotationAdditionalIPs: "fd99::7,192.0.2.7"}))
	cni := cniIPsOf(t, h, id)
	if len(cni) != 2 {
		t.Fatalf("host-local allocated %v to pod %s, want an IPv4 and an IPv6 address", cni, id)
	}
	cni4, cni6 := cni[0], cni[1]
	inSubnet(t, cni4, h.Subnet.String())
	inSubnet(t, cni6, h.Subnet6.String())

	status, network := verbosePodStatus(t, ctx, h, id)
	wantIPs(t, id, status, network, cniSourced(cni4), cniSourced(cni6), liveFrom(plugin, "fd99::7"), liveFrom(plugin, "192.0.2.7"))
	for _, node := range []struct {
		ipv6 bool
		want []string
	}{{false, []string{cni4, cni6}}, {true, []string{cni6, cni4}}} {
		if got := kubeletPodIPs(statusIPs(status), node.ipv6); !slices.Equal(got, node.want) {
			t.Errorf("pod %s reports %v: on a node of IPv6 %v the kubelet picks %v, want CNI's %v", id, statusIPs(status), node.ipv6, got, node.want)
		}
	}
}

// waitContainerExited waits until CRI reports container exited.
func waitContainerExited(t *testing.T, ctx context.Context, h *stack.Stack, container string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := h.Runtime.ContainerStatus(ctx, &criruntime.ContainerStatusRequest{ContainerId: container})
		if err != nil {
			t.Fatalf("status of container %s: %v", container, err)
		}
		state := resp.GetStatus().GetState()
		if state == criruntime.ContainerState_CONTAINER_EXITED {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("container %s is still %s 30 s after it was stopped", container, state)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
