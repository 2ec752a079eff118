// Command podipobserver is an NRI plugin for knext's integration tests that records, for every
// pod event it gets, the IPs NRI shows it for the pod and the global addresses found in the pod's
// network namespace at that moment, one JSON object per line appended to -out:
//
//	{"event":"StopPodSandbox","pod":"<sandbox id>","ips":["10.88.0.2"],"netns":"/run/...","netnsIPs":["10.88.0.2"]}
//
// netnsIPs is absent when the pod has no network namespace (any more).
//
// It also reports a new pod's IPs in its RunPodSandbox answer (the stub's
// RunPodAdjustmentInterface), without being subscribed to PodSandboxStatus: the comma-separated
// IPs of the annotation knext.test/<name>.run-ips of the pod's CRI config ("<name>" is the
// plugin's -name); without it the plugin reports none. The process exits when the runtime closes
// its connection.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"os"
	"strings"
	"sync"

	"github.com/containerd/nri/pkg/api"
	"github.com/containerd/nri/pkg/stub"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// record is one line of the output.
type record struct {
	Event    string   `json:"event"`
	Pod      string   `json:"pod"`
	IPs      []string `json:"ips"`
	NetNS    string   `json:"netns,omitempty"`
	NetNSIPs []string `json:"netnsIPs,omitempty"`
	Error    string   `json:"error,omitempty"`
}

type observer struct {
	name string
	mu   sync.Mutex
	out  *os.File
}

var _ stub.RunPodAdjustmentInterface = (*observer)(nil)

func (o *observer) observe(event string, pod *api.PodSandbox) {
	r := record{Event: event, Pod: pod.GetId(), IPs: pod.GetIps(), NetNS: networkNamespace(pod)}
	if r.NetNS != "" {
		ips, err := globalAddresses(r.NetNS)
		if err != nil {
			r.Error = err.Error()
		}
		r.NetNSIPs = ips
	}
	line, err := json.Marshal(r)
	if err != nil {
		log.Fatal(err)
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if _, err := o.out.Write(append(line, '\n')); err != nil {
		log.Fatal(err)
	}
}

func networkNamespace(pod *api.PodSandbox) string {
	for _, ns := range pod.GetLinux().GetNamespaces() {
		if ns.GetType() == "network" {
			return ns.GetPath()
		}
	}
	return ""
}

// globalAddresses returns the global unicast addresses in the network namespace at path.
func globalAddresses(path string) ([]string, error) {
	handle, err := netns.GetFromPath(path)
	if err != nil {
		return nil, fmt.Errorf("open netns %s: %w", path, err)
	}
	defer handle.Close()
	nl, err := netlink.NewHandleAt(handle)
	if err != nil {
		return nil, fmt.Errorf("netlink in netns %s: %w", path, err)
	}
	defer nl.Close()
	addrs, err := nl.AddrList(nil, netlink.FAMILY_ALL)
	if err != nil {
		return nil, fmt.Errorf("addresses in netns %s: %w", path, err)
	}
	var ips []string
	for _, a := range addrs {
		if a.IP.IsGlobalUnicast() {
			ips = append(ips, a.IP.String())
		}
	}
	return ips, nil
}

func (o *observer) Synchronize(_ context.Context, pods []*api.PodSandbox, _ []*api.Container) ([]*api.ContainerUpdate, error) {
	for _, pod := range pods {
		o.observe("Synchronize", pod)
	}
	return nil, nil
}

// RunPodSandbox reports the IPs of the pod's annotation.
func (o *observer) RunPodSandbox(_ context.Context, pod *api.PodSandbox) (*api.PodSandboxAdjustment, error) {
	o.observe("RunPodSandbox", pod)
	value := pod.GetAnnotations()["knext.test/"+o.name+".run-ips"]
	if value == "" {
		return nil, nil
	}
	return &api.PodSandboxAdjustment{Network: &api.PodSandboxNetwork{Ips: strings.Split(value, ",")}}, nil
}

func (o *observer) UpdatePodSandbox(_ context.Context, pod *api.PodSandbox, _, _ *api.LinuxResources) error {
	o.observe("UpdatePodSandbox", pod)
	return nil
}

func (o *observer) CreateContainer(_ context.Context, pod *api.PodSandbox, _ *api.Container) (*api.ContainerAdjustment, []*api.ContainerUpdate, error) {
	o.observe("CreateContainer", pod)
	return nil, nil, nil
}

func (o *observer) StartContainer(_ context.Context, pod *api.PodSandbox, _ *api.Container) error {
	o.observe("StartContainer", pod)
	return nil
}

func (o *observer) StopContainer(_ context.Context, pod *api.PodSandbox, _ *api.Container) ([]*api.ContainerUpdate, error) {
	o.observe("StopContainer", pod)
	return nil, nil
}

func (o *observer) RemoveContainer(_ context.Context, pod *api.PodSandbox, _ *api.Container) error {
	o.observe("RemoveContainer", pod)
	return nil
}

func (o *observer) StopPodSandbox(_ context.Context, pod *api.PodSandbox) error {
	o.observe("StopPodSandbox", pod)
	return nil
}

func (o *observer) RemovePodSandbox(_ context.Context, pod *api.PodSandbox) error {
	o.observe("RemovePodSandbox", pod)
	return nil
}

func main() {
	socket := flag.String("socket", api.DefaultSocketPath, "NRI socket")
	idx := flag.String("idx", "90", "plugin index")
	name := flag.String("name", "observer", "plugin name")
	outPath := flag.String("out", "", "file the records are appended to")
	flag.Parse()

	out, err := os.OpenFile(*outPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		log.Fatal(err)
	}
	o := &observer{name: *name, out: out}
	s, err := stub.New(o, stub.WithSocketPath(*socket), stub.WithPluginIdx(*idx), stub.WithPluginName(*name))
	if err != nil {
		log.Fatal(err)
	}
	if err := s.Run(context.Background()); err != nil {
		log.Printf("runtime connection: %v", err)
	}
}
