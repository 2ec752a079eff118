// Command testplugin is an NRI plugin for knext's integration tests. It answers PodSandboxStatus
// from the pod's annotations, and the test can make it misbehave.
//
// Answer (annotations of the pod's CRI config; "<name>" is the plugin's -name, and a key with
// it wins over the key without, so that two plugins can disagree about one pod):
//
//	knext.test/ip, knext.test/<name>.ip                          primary IP, taken verbatim
//	knext.test/additional-ips, knext.test/<name>.additional-ips  comma-separated, verbatim
//	knext.test/delay                                             Go duration to wait first
//
// The file <dir>/delay, a Go duration, wins over the annotation knext.test/delay.
//
// Behaviour, first found of: the file <dir>/behavior.<pod name>, the file <dir>/behavior, the
// annotation knext.test/<name>.behavior, the annotation knext.test/behavior:
//
//	answer  reply from the annotations (the default)
//	report IPS  answer with the comma-separated IPS, the first as the primary IP
//	flood N     answer with N distinct IPv4 addresses from 198.18.0.0/15, the first as the primary
//	empty   answer with no IP: the plugin owns nothing of the pod
//	error   fail the request
//	hang    never answer (until the process ends)
//	slow D  answer after waiting the Go duration D, whatever the request's deadline: like a
//	        plugin that is starved or paused, not one that gives up in time
//	exit    end the process with status 3 in the middle of the request
//
// Values are not validated: invalid IPs reach the runtime as written.
//
// RunPodSandbox and StopPodSandbox of the pod named <name> wait while the file
// <dir>/hold-run.<name>, respectively <dir>/hold-stop.<name>, exists, whatever the request's
// deadline: the test lets them go by removing the file.
//
// Every request is recorded, when it arrives, as a line "<pod id> <pod name>" appended to
// <dir>/calls, so the test can count them across restarts of the plugin. The pod lifecycle
// events RunPodSandbox, StopPodSandbox and RemovePodSandbox are recorded as lines
// "<event> <pod id> <pod name>" in <dir>/events. The process exits when the runtime closes its
// connection.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/containerd/nri/pkg/api"
	"github.com/containerd/nri/pkg/stub"
)

const annotationPrefix = "knext.test/"

// Behaviours.
const (
	answer = "answer"
	report = "report"
	flood  = "flood"
	empty  = "empty"
	fail   = "error"
	hang   = "hang"
	slow   = "slow"
	exit   = "exit"
)

// The request log, the pod event log and the prefix of the hold files in the plugin's directory.
const (
	callsFile    = "calls"
	eventsFile   = "events"
	holdRunFile  = "hold-run."
	holdStopFile = "hold-stop."
)

type plugin struct {
	name string
	dir  string

	logMu  sync.Mutex
	calls  *os.File
	events *os.File
}

func main() {
	socket := flag.String("socket", "", "NRI socket of the runtime")
	name := flag.String("name", "test", "plugin name")
	idx := flag.String("idx", "50", "plugin index (two digits)")
	dir := flag.String("dir", "", "directory of the control files and the request log")
	policyName := flag.String("failure-policy", "", "failure policy the plugin declares: fail_request, keep_connected, both, or none (the default)")
	flag.Parse()
	if *socket == "" || *dir == "" {
		log.Fatal("testplugin: -socket and -dir are required")
	}
	policy, err := failurePolicy(*policyName)
	if err != nil {
		log.Fatalf("testplugin %s: %v", *name, err)
	}

	p := &plugin{name: *name, dir: *dir}
	for file, f := range map[string]**os.File{callsFile: &p.calls, eventsFile: &p.events} {
		var err error
		if *f, err = os.OpenFile(filepath.Join(*dir, file), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644); err != nil {
			log.Fatalf("testplugin %s: %v", *name, err)
		}
	}
	s, err := stub.New(p, stub.WithSocketPath(*socket), stub.WithPluginName(*name), stub.WithPluginIdx(*idx),
		stub.WithFailurePolicy(policy))
	if err != nil {
		log.Fatalf("testplugin %s: %v", *name, err)
	}
	err = s.Run(context.Background())
	log.Printf("testplugin %s: stopped: %v", *name, err)
	os.Exit(1)
}

// failurePolicy is the policy a -failure-policy value names.
func failurePolicy(name string) (*api.FailurePolicy, error) {
	switch name {
	case "", "none":
		return &api.FailurePolicy{}, nil
	case "fail_request":
		return &api.FailurePolicy{FailRequest: true}, nil
	case "keep_connected":
		return &api.FailurePolicy{KeepConnected: true}, nil
	case "both":
		return &api.FailurePolicy{FailRequest: true, KeepConnected: true}, nil
	}
	return nil, fmt.Errorf("-failure-policy %q: want fail_request, keep_connected, both or none", name)
}

// PodSandboxStatus implements stub.PodSandboxStatusInterface, which subscribes the plugin.
func (p *plugin) PodSandboxStatus(_ context.Context, pod *api.PodSandbox) (*api.PodSandboxStatusResponse, error) {
	if err := p.record(p.calls, pod.GetId(), pod.GetName()); err != nil {
		return nil, err
	}
	annotations := pod.GetAnnotations()
	delay, err := p.delay(pod)
	if err != nil {
		return nil, err
	}
	time.Sleep(delay)

	behaviour, argument, _ := strings.Cut(p.behaviour(pod), " ")
	switch behaviour {
	case answer:
		return p.answer(annotations), nil
	case report:
		ips := strings.Split(argument, ",")
		return &api.PodSandboxStatusResponse{Ip: ips[0], AdditionalIps: ips[1:]}, nil
	case flood:
		n, err := strconv.Atoi(argument)
		if err != nil || n < 1 || n > 1<<17 {
			return nil, fmt.Errorf("testplugin %s: pod %s: behaviour %q: want 1 to %d IPs", p.name, pod.GetName(), flood+" "+argument, 1<<17)
		}
		return floodAnswer(n), nil
	case slow:
		d, err := time.ParseDuration(argument)
		if err != nil {
			return nil, fmt.Errorf("testplugin %s: pod %s: behaviour %q: %w", p.name, pod.GetName(), slow+" "+argument, err)
		}
		time.Sleep(d)
		return p.answer(annotations), nil
	case empty:
		return &api.PodSandboxStatusResponse{}, nil
	case fail:
		return nil, fmt.Errorf("testplugin %s fails on purpose for pod %s", p.name, pod.GetName())
	case hang:
		// Not even the request's deadline ends it: like a plugin that is stuck, not one that
		// gives up in time.
		select {}
	case exit:
		log.Printf("testplugin %s: exiting on purpose during the request for pod %s", p.name, pod.GetName())
		os.Exit(3)
		return nil, nil
	default:
		return nil, fmt.Errorf("testplugin %s: unknown behaviour %q for pod %s", p.name, behaviour, pod.GetName())
	}
}

// answer is the answer the pod's annotations describe.
func (p *plugin) answer(annotations map[string]string) *api.PodSandboxStatusResponse {
	resp := &api.PodSandboxStatusResponse{Ip: p.annotation(annotations, "ip")}
	if list := p.annotation(annotations, "additional-ips"); list != "" {
		resp.AdditionalIps = strings.Split(list, ",")
	}
	return resp
}

// floodAnswer is an answer with n distinct IPs of 198.18.0.0/15, far more than a pod has.
func floodAnswer(n int) *api.PodSandboxStatusResponse {
	ips := make([]string, 0, n)
	for addr := netip.MustParseAddr("198.18.0.0"); len(ips) < n; {
		addr = addr.Next()
		ips = append(ips, addr.String())
	}
	return &api.PodSandboxStatusResponse{Ip: ips[0], AdditionalIps: ips[1:]}
}

// RunPodSandbox implements stub.RunPodInterface: it records the event, then waits while the pod's
// hold file exists.
func (p *plugin) RunPodSandbox(_ context.Context, pod *api.PodSandbox) error {
	if err := p.record(p.events, "RunPodSandbox", pod.GetId(), pod.GetName()); err != nil {
		return err
	}
	p.waitWhileHeld(holdRunFile, pod)
	return nil
}

// StopPodSandbox implements stub.StopPodInterface: it records the event, then waits while the
// pod's hold file exists.
func (p *plugin) StopPodSandbox(_ context.Context, pod *api.PodSandbox) error {
	if err := p.record(p.events, "StopPodSandbox", pod.GetId(), pod.GetName()); err != nil {
		return err
	}
	p.waitWhileHeld(holdStopFile, pod)
	return nil
}

// waitWhileHeld waits while the pod's hold file of the given prefix exists.
func (p *plugin) waitWhileHeld(prefix string, pod *api.PodSandbox) {
	hold := filepath.Join(p.dir, prefix+pod.GetName())
	for {
		if _, err := os.Stat(hold); errors.Is(err, os.ErrNotExist) {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// RemovePodSandbox implements stub.RemovePodInterface: it records the event.
func (p *plugin) RemovePodSandbox(_ context.Context, pod *api.PodSandbox) error {
	return p.record(p.events, "RemovePodSandbox", pod.GetId(), pod.GetName())
}

// record appends a line of fields to a log.
func (p *plugin) record(to *os.File, fields ...string) error {
	p.logMu.Lock()
	defer p.logMu.Unlock()
	if _, err := fmt.Fprintln(to, strings.Join(fields, " ")); err != nil {
		return fmt.Errorf("testplugin %s: record %v: %w", p.name, fields, err)
	}
	return nil
}

// delay returns how long to wait before answering for pod: the control file wins over the
// annotation.
func (p *plugin) delay(pod *api.PodSandbox) (time.Duration, error) {
	source, value := "annotation "+annotationPrefix+"delay", pod.GetAnnotations()[annotationPrefix+"delay"]
	data, err := os.ReadFile(filepath.Join(p.dir, "delay"))
	switch {
	case err == nil:
		source, value = filepath.Join(p.dir, "delay"), strings.TrimSpace(string(data))
	case !errors.Is(err, os.ErrNotExist):
		log.Printf("testplugin %s: %v", p.name, err)
	}
	if value == "" {
		return 0, nil
	}
	d, err := time.ParseDuration(value)
	if err != nil {
		return 0, fmt.Errorf("testplugin %s: pod %s: %s: %w", p.name, pod.GetName(), source, err)
	}
	return d, nil
}

// behaviour returns what to do for pod: the control files win over the annotations.
func (p *plugin) behaviour(pod *api.PodSandbox) string {
	for _, file := range []string{"behavior." + pod.GetName(), "behavior"} {
		data, err := os.ReadFile(filepath.Join(p.dir, file))
		if err == nil {
			return strings.TrimSpace(string(data))
		}
		if !errors.Is(err, os.ErrNotExist) {
			log.Printf("testplugin %s: %v", p.name, err)
		}
	}
	if b := p.annotation(pod.GetAnnotations(), "behavior"); b != "" {
		return b
	}
	return answer
}

// annotation returns knext.test/<name>.<key> if set, else knext.test/<key>.
func (p *plugin) annotation(annotations map[string]string, key string) string {
	if value, ok := annotations[annotationPrefix+p.name+"."+key]; ok {
		return value
	}
	return annotations[annotationPrefix+key]
}
