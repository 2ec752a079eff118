package plugin

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	nri "github.com/containerd/nri/pkg/adaptation"
	"github.com/containerd/nri/pkg/api"

	"github.com/knext-dev/knext/internal/nribridge/config"
)

// The fake runtime is this test binary re-executed: a process that embeds NRI's adaptation as a
// runtime does, so that stopping it closes the plugin's connection as a runtime restart does.
// The fake runtime starts the plugins found in $NRI_BRIDGE_TEST_PLUGIN_DIR (with their
// configuration from there too): this test binary again, which then runs as the plugin.
const (
	fakeRuntimeEnv = "NRI_BRIDGE_TEST_FAKE_RUNTIME"
	pluginDirEnv   = "NRI_BRIDGE_TEST_PLUGIN_DIR"
)

func TestMain(m *testing.M) {
	if socket := os.Getenv(fakeRuntimeEnv); socket != "" {
		if err := fakeRuntimeMain(socket, os.Getenv(pluginDirEnv), os.Args[len(os.Args)-1]); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	if launchedByRuntime() {
		if err := Run(context.Background(), Options{Flags: &config.Flags{}}); err != nil {
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// testPodIn is testPod(id) in the network namespace netnsPath, when given.
func testPodIn(id, netnsPath string) *api.PodSandbox {
	pod := testPod(id)
	if netnsPath != "" {
		pod.Linux.Namespaces[1].Path = netnsPath
	}
	return pod
}

// fakeRuntimeMain prints "started" once it runs. It reports the pods "<id>[=<netns>]" listed
// in pods (comma separated) at synchronization and prints "synced" for each external plugin
// synchronized. It reads "run|stop <id> [<netns>]" lines from stdin, relays them to the plugins
// and answers "ok" or the error; it exits at the end of stdin.
func fakeRuntimeMain(socket, pluginDir, podList string) error {
	var pods []*api.PodSandbox
	for pod := range strings.SplitSeq(podList, ",") {
		if id, netnsPath, _ := strings.Cut(pod, "="); id != "" {
			pods = append(pods, testPodIn(id, netnsPath))
		}
	}
	var started atomic.Bool
	syncFn := func(ctx context.Context, cb nri.SyncCB) error {
		_, err := cb(ctx, pods, nil)
		if started.Load() { // Start synchronizes the pre-installed plugins (none here) first
			fmt.Println("synced")
		}
		return err
	}
	updateFn := func(context.Context, []*nri.ContainerUpdate) ([]*nri.ContainerUpdate, error) { return nil, nil }
	if pluginDir == "" {
		dir, err := os.MkdirTemp("", "nri-bridge-fake-runtime")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		pluginDir = dir
	}
	r, err := nri.New("fake-runtime", "v0", syncFn, updateFn, nri.WithSocketPath(socket),
		nri.WithPluginPath(pluginDir), nri.WithPluginConfigPath(pluginDir))
	if err != nil {
		return err
	}
	if err := r.Start(); err != nil {
		return err
	}
	started.Store(true)
	fmt.Println("started")
	defer r.Stop()
	lines := bufio.NewScanner(os.Stdin)
	for lines.Scan() {
		args := strings.Fields(lines.Text())
		pod := testPodIn(args[len(args)-1], "")
		if len(args) == 3 {
			pod = testPodIn(args[1], args[2])
		}
		reply := "ok"
		if command, known := fakeRuntimeCommands[args[0]]; !known {
			err = fmt.Errorf("unknown command %q", lines.Text())
		} else {
			// As containerd does: wait for a plugin being synchronized to join.
			block := r.BlockPluginSync()
			reply, err = command(r, pod)
			block.Unblock()
		}
		if err != nil {
			reply = "error: " + err.Error()
		}
		fmt.Println(reply)
	}
	return nil
}

// fakeRuntimeCommands relay a request for a pod to the plugins and return the reply line.
var fakeRuntimeCommands = map[string]func(*nri.Adaptation, *api.PodSandbox) (string, error){
	"run": func(r *nri.Adaptation, pod *api.PodSandbox) (string, error) {
		_, err := r.RunPodSandbox(context.Background(), &nri.RunPodSandboxRequest{Pod: pod})
		return "ok", err
	},
	// "runips" is "run" printing the IPs the plugins reported, with each IP's owner.
	"runips": func(r *nri.Adaptation, pod *api.PodSandbox) (string, error) {
		answers, err := r.RunPodSandbox(context.Background(), &nri.RunPodSandboxRequest{Pod: pod})
		if err != nil || answers == nil {
			return fmt.Sprintf("result %v", answers), err
		}
		return describeAnswers(answers), nil
	},
	"stop": func(r *nri.Adaptation, pod *api.PodSandbox) (string, error) {
		return "ok", r.StopPodSandbox(context.Background(), &nri.StopPodSandboxRequest{Pod: pod})
	},
	// "status" prints the plugins' answers with each IP's owner.
	"status": func(r *nri.Adaptation, pod *api.PodSandbox) (string, error) {
		answers, err := r.PodSandboxStatus(context.Background(), &nri.PodSandboxStatusRequest{Pod: pod})
		if err != nil || answers == nil {
			return fmt.Sprintf("result %v", answers), err
		}
		return describeAnswers(answers), nil
	},
}

// describeAnswers renders the plugins' answers as one IP set: the first primary IP, the other
// IPs in order, and each IP's owner.
func describeAnswers(answers []*nri.PodNetworkAnswer) string {
	var primary string
	additional, owners := []string{}, []string{}
	for _, a := range answers {
		for i, ip := range append([]string{a.IP}, a.AdditionalIPs...) {
			switch {
			case ip == "":
				continue
			case i == 0 && primary == "":
				primary = ip
			default:
				additional = append(additional, ip)
			}
			owners = append(owners, ip+"@"+a.Plugin)
		}
	}
	return fmt.Sprintf("ip=%s additional=%v owners=%v", primary, additional, owners)
}

type fakeRuntime struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	stdout *bufio.Scanner
	stderr bytes.Buffer
	// pending is the line a read that timed out is still waiting for.
	pending chan string
}

// startFakeRuntime starts a runtime that reports pods ("<id>[=<netns>]") at synchronization.
func startFakeRuntime(t *testing.T, socket, pluginDir string, pods ...string) *fakeRuntime {
	t.Helper()
	rt := &fakeRuntime{cmd: exec.Command(os.Args[0], "-test.run=^$", strings.Join(pods, ","))}
	rt.cmd.Env = append(os.Environ(), fakeRuntimeEnv+"="+socket, pluginDirEnv+"="+pluginDir)
	rt.cmd.Stderr = &rt.stderr
	var err error
	if rt.stdin, err = rt.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	stdout, err := rt.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	rt.stdout = bufio.NewScanner(stdout)
	if err := rt.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		rt.stop()
		if t.Failed() {
			t.Logf("fake runtime log:\n%s", rt.stderr.String())
		}
	})
	rt.expect(t, "started")
	return rt
}

// expect waits for the runtime's next output line.
func (rt *fakeRuntime) expect(t *testing.T, want string) {
	t.Helper()
	if line := rt.reply(t); line != want {
		t.Fatalf("fake runtime said %q, want %q", line, want)
	}
}

// reply returns the fake runtime's next line.
func (rt *fakeRuntime) reply(t *testing.T) string {
	t.Helper()
	select {
	case line := <-rt.nextLine():
		rt.pending = nil
		return line
	case <-time.After(10 * time.Second):
		t.Fatal("fake runtime said nothing within 10s")
		return ""
	}
}

// nextLine returns a channel that gets the runtime's next line: the one a read that timed out
// still waits for, if any (one reader at a time).
func (rt *fakeRuntime) nextLine() chan string {
	if rt.pending == nil {
		rt.pending = make(chan string, 1)
		go func(got chan string) {
			rt.stdout.Scan()
			got <- rt.stdout.Text()
		}(rt.pending)
	}
	return rt.pending
}

func (rt *fakeRuntime) do(t *testing.T, command string) {
	t.Helper()
	rt.ask(t, command, "ok")
}

func (rt *fakeRuntime) ask(t *testing.T, command, wantReply string) {
	t.Helper()
	fmt.Fprintln(rt.stdin, command)
	rt.expect(t, wantReply)
}

func (rt *fakeRuntime) stop() {
	if rt.stdin != nil {
		rt.stdin.Close()
		rt.stdin = nil
		rt.cmd.Wait()
	}
}

func TestStandaloneReconnectsAndReconciles(t *testing.T) {
	socket := filepath.Join(t.TempDir(), "nri.sock")
	p, fake := newTestPlugin(t, testPodDoc(t, `ipv4: {subnet: 10.5.0.0/24}`))

	// The plugin starts before the runtime and keeps trying.
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- runStandalone(ctx, p, socket, "bridge", "10") }()
	time.Sleep(2 * reconnectInterval)

	rt := startFakeRuntime(t, socket, "")
	rt.expect(t, "synced")
	rt.do(t, "run keep")
	rt.do(t, "run drop")
	if !fake.isWired("keep") || !fake.isWired("drop") {
		t.Fatalf("pods not wired through NRI: %v", fake.wired)
	}
	keepIPs := podIPsOK(t, p, testPod("keep"))

	// The runtime restarts; only "keep" survived meanwhile.
	rt.stop()
	rt = startFakeRuntime(t, socket, "", "keep")
	rt.expect(t, "synced")
	if got := podIPsOK(t, p, testPod("keep")); got != keepIPs || !fake.isWired("keep") {
		t.Errorf("kept pod: IPs %q (before %q), wired %v", got, keepIPs, fake.isWired("keep"))
	}
	if podIPsOK(t, p, testPod("drop")) != "" || fake.isWired("drop") {
		t.Error("pod gone during the restart was not released")
	}
	rt.do(t, "stop keep")
	p.waitReleases()
	if podIPsOK(t, p, testPod("keep")) != "" || fake.isWired("keep") {
		t.Error("stopped pod not released")
	}

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("runStandalone returned %v on cancellation", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("runStandalone did not return after cancellation")
	}
}
