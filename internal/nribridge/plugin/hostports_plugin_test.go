package plugin

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/containerd/nri/pkg/api"

	"github.com/knext-dev/knext/internal/nribridge/firewall"
	"github.com/knext-dev/knext/internal/nribridge/hostport"
	"github.com/knext-dev/knext/internal/nribridge/store"
)

// fakeFirewall records what the plugin asks of the host's packet filter.
type fakeFirewall struct {
	mu       sync.Mutex
	applied  *firewall.Ruleset // the last ruleset applied
	applies  int               // how many rulesets were applied
	applyErr error
}

func (f *fakeFirewall) Apply(rs *firewall.Ruleset) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.applyErr != nil {
		return f.applyErr
	}
	f.applied = rs
	f.applies++
	return nil
}

func firewallOf(t *testing.T, p *plugin) *fakeFirewall {
	t.Helper()
	a, err := p.current()
	if err != nil {
		t.Fatal(err)
	}
	return a.firewall.(*fakeFirewall)
}

// appliedRules is the last ruleset applied, "" for none.
func (f *fakeFirewall) appliedRules() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.applied == nil {
		return ""
	}
	return f.applied.String()
}

func portPod(id string, ports ...*api.PortMapping) *api.PodSandbox {
	pod := testPod(id)
	pod.PortMappings = ports
	return pod
}

func TestPortMappingsOfReadsNRI(t *testing.T) {
	pod := portPod("a",
		&api.PortMapping{Protocol: api.Protocol_TCP, ContainerPort: 80, HostPort: 8080, HostIp: "10.0.0.1"},
		&api.PortMapping{Protocol: api.Protocol_UDP, ContainerPort: 53, HostPort: 53},
		&api.PortMapping{Protocol: api.Protocol_SCTP, ContainerPort: 3868, HostPort: 3868, HostIp: "::"},
		&api.PortMapping{Protocol: api.Protocol(7), ContainerPort: 1, HostPort: 1})
	want := []hostport.Mapping{
		{Protocol: hostport.TCP, ContainerPort: 80, HostPort: 8080, HostIP: "10.0.0.1"},
		{Protocol: hostport.UDP, ContainerPort: 53, HostPort: 53},
		{Protocol: hostport.SCTP, ContainerPort: 3868, HostPort: 3868, HostIP: "::"},
		{Protocol: "7", ContainerPort: 1, HostPort: 1},
	}
	got := portMappingsOf(pod)
	if len(got) != len(want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("mapping %d: got %+v, want %+v", i, got[i], want[i])
		}
	}
	if _, err := hostport.Published(got, true, true); err == nil || !strings.Contains(err.Error(), `protocol "7" is not supported`) {
		t.Errorf("an unknown protocol: got %v", err)
	}
}

func TestRunPodSandboxPublishesHostPorts(t *testing.T) {
	p, fake := newTestPlugin(t, testPodDoc(t, `ipv4: {subnet: 10.5.0.0/24}, ipv6: {subnet: "fd00:5::/64"}`))
	fw := firewallOf(t, p)

	// A pod without host ports costs the firewall nothing.
	if _, err := p.RunPodSandbox(ctx, portPod("plain", &api.PortMapping{Protocol: api.Protocol_TCP, ContainerPort: 80})); err != nil {
		t.Fatal(err)
	}
	if got := fw.appliedRules(); got != "" {
		t.Errorf("a pod without hostPorts changed the firewall: %q", got)
	}

	web := portPod("web", &api.PortMapping{Protocol: api.Protocol_TCP, ContainerPort: 80, HostPort: 8080})
	if _, err := p.RunPodSandbox(ctx, web); err != nil {
		t.Fatal(err)
	}
	rules := fw.appliedRules()
	for _, want := range []string{
		`meta nfproto ipv4 tcp dport 8080 dnat ip to 10.5.0.3:80 comment "ns/name-web web"`,
		`meta nfproto ipv6 tcp dport 8080 dnat ip6 to [fd00:5::3]:80 comment "ns/name-web web"`,
	} {
		if !strings.Contains(rules, want) {
			t.Errorf("applied rules lack %s:\n%s", want, rules)
		}
	}

	taken := portPod("taken", &api.PortMapping{Protocol: api.Protocol_TCP, ContainerPort: 81, HostPort: 8080, HostIp: "0.0.0.0"})
	_, err := p.RunPodSandbox(ctx, taken)
	want := "nri-bridge: pod ns/name-taken (sandbox taken): hostPort 8080/TCP on every IPv4 address (container port 81) is taken: " +
		"pod ns/name-web (sandbox web) holds hostPort 8080/TCP on every address (container port 80)"
	if err == nil || err.Error() != want {
		t.Fatalf("a taken port: got %v\nwant %s", err, want)
	}
	if fake.isWired("taken") || podIPsOK(t, p, taken) != "" || fw.appliedRules() != rules {
		t.Errorf("the refused pod left: wired %v, IPs %q, rules changed %v", fake.isWired("taken"), podIPsOK(t, p, taken), fw.appliedRules() != rules)
	}

	// Invalid mappings fail the pod before anything is allocated.
	bad := portPod("bad", &api.PortMapping{Protocol: api.Protocol_TCP, ContainerPort: 80, HostPort: 70000})
	if _, err := p.RunPodSandbox(ctx, bad); err == nil || err.Error() != "nri-bridge: pod ns/name-bad (sandbox bad): port mappings: hostPort 70000/TCP: not a port number (1-65535)" {
		t.Errorf("an invalid hostPort: got %v", err)
	}
	if fake.isWired("bad") {
		t.Error("the pod with an invalid hostPort was wired")
	}

	// Stop removes the rules (no table remains), and the port can be taken.
	if err := p.StopPodSandbox(ctx, web); err != nil {
		t.Fatal(err)
	}
	if got := fw.appliedRules(); got != "table inet nri-bridge-nribr0 {\n}\n" {
		t.Errorf("rules after the only pod with hostPorts stopped:\n%s", got)
	}
	if _, err := p.RunPodSandbox(ctx, taken); err != nil {
		t.Fatalf("taking a released port: %v", err)
	}
}

func TestHostPortsFirewallFailureLeaksNothing(t *testing.T) {
	p, fake := newTestPlugin(t, testPodDoc(t, `ipv4: {subnet: 10.5.0.0/24}`))
	fw := firewallOf(t, p)
	fw.applyErr = errors.New("netlink: operation not permitted")
	pod := portPod("a", &api.PortMapping{Protocol: api.Protocol_UDP, ContainerPort: 53, HostPort: 53})
	_, err := p.RunPodSandbox(ctx, pod)
	if err == nil || err.Error() != "nri-bridge: pod ns/name-a (sandbox a): netlink: operation not permitted" {
		t.Fatalf("got %v", err)
	}
	a, _ := p.current()
	if held, err := a.store.HostPortsOf("a"); err != nil || held != nil || fake.isWired("a") || podIPsOK(t, p, pod) != "" {
		t.Errorf("the failed pod left ports %v (%v), wired %v, IPs %q", held, err, fake.isWired("a"), podIPsOK(t, p, pod))
	}
	fw.applyErr = nil
	if _, err := p.RunPodSandbox(ctx, pod); err != nil {
		t.Fatal(err)
	}
	// A stop that cannot remove the rules keeps everything for the next try.
	fw.applyErr = errors.New("netlink: no buffer space available")
	if err := p.StopPodSandbox(ctx, pod); err == nil || !strings.Contains(err.Error(), "removing its hostPorts: netlink: no buffer space available") {
		t.Errorf("stop with a failing firewall: got %v", err)
	}
	if held, _ := a.store.HostPortsOf("a"); held == nil || podIPsOK(t, p, pod) == "" {
		t.Error("a failed stop released the pod's ports or addresses")
	}
	fw.applyErr = nil
	if err := p.StopPodSandbox(ctx, pod); err != nil {
		t.Fatal(err)
	}
	p.waitReleases()
	if held, _ := a.store.HostPortsOf("a"); held != nil || podIPsOK(t, p, pod) != "" {
		t.Error("the retried stop kept the pod's ports or addresses")
	}
}

func TestSynchronizeRebuildsHostPorts(t *testing.T) {
	p, fake := newTestPlugin(t, testPodDoc(t, `masquerade: true, ipv4: {subnet: 10.5.0.0/24}`))
	fw := firewallOf(t, p)
	a, _ := p.current()
	web := portPod("web", &api.PortMapping{Protocol: api.Protocol_TCP, ContainerPort: 80, HostPort: 8080})
	old := portPod("old", &api.PortMapping{Protocol: api.Protocol_TCP, ContainerPort: 80, HostPort: 9090})
	for _, pod := range []*api.PodSandbox{web, old} {
		if _, err := p.RunPodSandbox(ctx, pod); err != nil {
			t.Fatal(err)
		}
	}
	// old was started by an nri-bridge without hostPort support; a claim lost its pod.
	if err := a.store.ReleaseHostPorts("old"); err != nil {
		t.Fatal(err)
	}
	if _, err := a.store.ClaimHostPorts(store.PodRef{ID: "orphan"}, []hostport.Mapping{{Protocol: hostport.TCP, HostPort: 7070, ContainerPort: 80}}); err != nil {
		t.Fatal(err)
	}
	fw.applied = nil

	if _, err := p.Synchronize(ctx, []*api.PodSandbox{web, old}, nil); err != nil {
		t.Fatal(err)
	}
	rules := fw.appliedRules()
	for _, want := range []string{"tcp dport 8080 dnat ip to", "tcp dport 9090 dnat ip to", `masquerade comment "pods to outside the cluster's pod CIDRs"`} {
		if !strings.Contains(rules, want) {
			t.Errorf("rules after Synchronize lack %q:\n%s", want, rules)
		}
	}
	if held, _ := a.store.HostPortsOf("orphan"); held != nil || strings.Contains(rules, "7070") {
		t.Errorf("the claim of a pod without allocation survived Synchronize:\n%s", rules)
	}
	if !fake.hasHairpin("old") || !fake.hasHairpin("web") {
		t.Error("Synchronize did not put the bridge ports of the pods it kept in hairpin mode")
	}

	// Pods that are gone take their rules with them, in one rebuild of the table (each rebuild
	// costs time in proportion to the rules, and Synchronize has plugin_request_timeout).
	for i := range 5 {
		pod := portPod(fmt.Sprint("gone-", i), &api.PortMapping{Protocol: api.Protocol_UDP, ContainerPort: 53, HostPort: int32(5300 + i)})
		if _, err := p.RunPodSandbox(ctx, pod); err != nil {
			t.Fatal(err)
		}
	}
	fw.applies = 0
	if _, err := p.Synchronize(ctx, []*api.PodSandbox{web}, nil); err != nil {
		t.Fatal(err)
	}
	if rules := fw.appliedRules(); strings.Contains(rules, "9090") || strings.Contains(rules, "udp") || !strings.Contains(rules, "8080") {
		t.Errorf("rules after pods old and gone-* went:\n%s", rules)
	}
	if fw.applies > 2 {
		t.Errorf("Synchronize applied %d rulesets for 6 pods that are gone, want the removal in one (and the rebuild)", fw.applies)
	}
}

// On a secondary interface the pod's hostPorts are the pod network's (CNI's portmap): nri-bridge
// publishes none, at RunPodSandbox nor at Synchronize.
func TestSecondaryInterfacePublishesNoHostPorts(t *testing.T) {
	p, fake := newTestPlugin(t, testPodDoc(t, `interface: net1, ipv4: {subnet: 10.5.0.0/24}`))
	fw := firewallOf(t, p)
	web := portPod("web", &api.PortMapping{Protocol: api.Protocol_TCP, ContainerPort: 80, HostPort: 8080})
	if _, err := p.RunPodSandbox(ctx, web); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Synchronize(ctx, []*api.PodSandbox{web}, nil); err != nil {
		t.Fatal(err)
	}
	a, _ := p.current()
	held, err := a.store.HostPortsOf("web")
	if err != nil || held != nil || strings.Contains(fw.appliedRules(), "8080") {
		t.Errorf("a pod on a secondary interface: ports held %v (%v), rules:\n%s", held, err, fw.appliedRules())
	}
	if !fake.isWired("web") || podIPsOK(t, p, web) != "10.5.0.2" {
		t.Errorf("the pod is not wired with its address: wired %v, IPs %q", fake.isWired("web"), podIPsOK(t, p, web))
	}
}
