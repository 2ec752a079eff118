// Command runreporter is an NRI plugin for knext's integration tests that reports a new pod's IPs
// in its RunPodSandbox answer (the stub's RunPodAdjustmentInterface) and is not subscribed to
// PodSandboxStatus. The IPs are the comma-separated annotation knext.test/<name>.run-ips of the
// pod's CRI config ("<name>" is the plugin's -name); without it the plugin reports none.
//
// Every event it gets is recorded with the pod IPs NRI shows it, one JSON object per line
// appended to -out:
//
//	{"event":"RunPodSandbox","pod":"<sandbox id>","name":"<pod name>","ips":["10.99.0.7"]}
//
// The process exits when the runtime closes its connection.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"log"
	"os"
	"strings"
	"sync"

	"github.com/containerd/nri/pkg/api"
	"github.com/containerd/nri/pkg/stub"
)

type record struct {
	Event string   `json:"event"`
	Pod   string   `json:"pod"`
	Name  string   `json:"name"`
	IPs   []string `json:"ips"`
}

type reporter struct {
	name string
	mu   sync.Mutex
	out  *os.File
}

var _ stub.RunPodAdjustmentInterface = (*reporter)(nil)

func (r *reporter) observe(event string, pod *api.PodSandbox) {
	line, err := json.Marshal(record{Event: event, Pod: pod.GetId(), Name: pod.GetName(), IPs: pod.GetIps()})
	if err != nil {
		log.Fatal(err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, err := r.out.Write(append(line, '\n')); err != nil {
		log.Fatal(err)
	}
}

// RunPodSandbox reports the IPs of the pod's annotation.
func (r *reporter) RunPodSandbox(_ context.Context, pod *api.PodSandbox) (*api.PodSandboxAdjustment, error) {
	r.observe("RunPodSandbox", pod)
	value := pod.GetAnnotations()["knext.test/"+r.name+".run-ips"]
	if value == "" {
		return nil, nil
	}
	return &api.PodSandboxAdjustment{Network: &api.PodSandboxNetwork{Ips: strings.Split(value, ",")}}, nil
}

func (r *reporter) Synchronize(_ context.Context, pods []*api.PodSandbox, _ []*api.Container) ([]*api.ContainerUpdate, error) {
	for _, pod := range pods {
		r.observe("Synchronize", pod)
	}
	return nil, nil
}

func (r *reporter) CreateContainer(_ context.Context, pod *api.PodSandbox, _ *api.Container) (*api.ContainerAdjustment, []*api.ContainerUpdate, error) {
	r.observe("CreateContainer", pod)
	return nil, nil, nil
}

func (r *reporter) StartContainer(_ context.Context, pod *api.PodSandbox, _ *api.Container) error {
	r.observe("StartContainer", pod)
	return nil
}

func (r *reporter) StopContainer(_ context.Context, pod *api.PodSandbox, _ *api.Container) ([]*api.ContainerUpdate, error) {
	r.observe("StopContainer", pod)
	return nil, nil
}

func (r *reporter) RemoveContainer(_ context.Context, pod *api.PodSandbox, _ *api.Container) error {
	r.observe("RemoveContainer", pod)
	return nil
}

func (r *reporter) UpdatePodSandbox(_ context.Context, pod *api.PodSandbox, _, _ *api.LinuxResources) error {
	r.observe("UpdatePodSandbox", pod)
	return nil
}

func (r *reporter) StopPodSandbox(_ context.Context, pod *api.PodSandbox) error {
	r.observe("StopPodSandbox", pod)
	return nil
}

func (r *reporter) RemovePodSandbox(_ context.Context, pod *api.PodSandbox) error {
	r.observe("RemovePodSandbox", pod)
	return nil
}

func main() {
	socket := flag.String("socket", api.DefaultSocketPath, "NRI socket")
	idx := flag.String("idx", "10", "plugin index")
	name := flag.String("name", "reporter", "plugin name")
	outPath := flag.String("out", "", "file the records are appended to")
	flag.Parse()

	out, err := os.OpenFile(*outPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		log.Fatal(err)
	}
	r := &reporter{name: *name, out: out}
	s, err := stub.New(r, stub.WithSocketPath(*socket), stub.WithPluginIdx(*idx), stub.WithPluginName(*name))
	if err != nil {
		log.Fatal(err)
	}
	if err := s.Run(context.Background()); err != nil {
		log.Printf("runtime connection: %v", err)
	}
}
