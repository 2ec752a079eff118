package integration

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/knext-dev/knext/internal/stack"
)

// builtBinaries is the directory of the binaries the tests build, shared by the tests of one
// run and removed by TestMain.
var builtBinaries struct {
	once sync.Once
	dir  string
	err  error
}

func builtBinariesDir() (string, error) {
	builtBinaries.once.Do(func() {
		builtBinaries.dir, builtBinaries.err = os.MkdirTemp("", "knext-integration-bin-")
	})
	return builtBinaries.dir, builtBinaries.err
}

// removeBuiltBinaries removes what the tests built; TestMain calls it after the tests.
func removeBuiltBinaries() {
	if builtBinaries.dir != "" {
		os.RemoveAll(builtBinaries.dir)
	}
}

// onceBuild builds something at most once per test binary and remembers the outcome.
type onceBuild struct {
	once sync.Once
	path string
	err  error
}

func (b *onceBuild) get(t *testing.T, build func(dir string) (string, error)) string {
	t.Helper()
	b.once.Do(func() {
		dir, err := builtBinariesDir()
		if err != nil {
			b.err = err
			return
		}
		b.path, b.err = build(dir)
	})
	if b.err != nil {
		t.Fatal(b.err)
	}
	return b.path
}

// goCommand runs the go tool with env added to the test's environment (which carries GOWORK).
func goCommand(env []string, args ...string) ([]byte, error) {
	var stdout, stderr bytes.Buffer
	cmd := exec.Command("go", args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("go %s: %w\n%s", strings.Join(args, " "), err, stderr.Bytes())
	}
	return stdout.Bytes(), nil
}

var testPluginBinary onceBuild

// testPluginPath builds ./testplugin against the workspace of the test run.
func testPluginPath(t *testing.T) string {
	return testPluginBinary.get(t, func(dir string) (string, error) {
		path := filepath.Join(dir, "testplugin")
		_, err := goCommand(nil, "build", "-o", path, "github.com/knext-dev/knext/test/plugins/testplugin")
		return path, err
	})
}

// upstreamContainerd returns the pristine containerd of the version knext's go.mod pins, with its
// runc shim next to it, as `make upstream` builds it into $KNEXT_UPSTREAM_BIN_DIR.
func upstreamContainerd(t *testing.T) string {
	t.Helper()
	dir := os.Getenv("KNEXT_UPSTREAM_BIN_DIR")
	if dir == "" {
		t.Fatal("KNEXT_UPSTREAM_BIN_DIR is not set: run the tests through make (make upstream builds pristine containerd)")
	}
	path := filepath.Join(dir, "containerd")
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("no upstream containerd: %v (make upstream builds it)", err)
	}
	return path
}

// Annotations the test plugin answers from (see testplugin/main.go).
const (
	annotationIP            = "knext.test/ip"
	annotationAdditionalIPs = "knext.test/additional-ips"
	annotationDelay         = "knext.test/delay"
)

// pluginAnnotation is the annotation key that only the plugin named name reads.
func pluginAnnotation(name, key string) string {
	return "knext.test/" + name + "." + key
}

// Behaviours of the test plugin.
const (
	behaveEmpty = "empty"
	behaveError = "error"
	behaveHang  = "hang"
	behaveExit  = "exit"
)

// behaveSlow is the behaviour of a plugin that answers after d, whatever the request's deadline.
func behaveSlow(d time.Duration) string { return "slow " + d.String() }

// testPlugin is one test plugin connected to a harness's NRI socket, as a separate process.
type testPlugin struct {
	h       *stack.Stack
	name    string // as the plugin calls itself
	idx     string
	dir     string // control files and request log
	policy  string // the failure policy it declares, "" for none
	process *stack.Process
}

// nriName is the plugin's name as NRI reports it.
func (p *testPlugin) nriName() string { return p.idx + "-" + p.name }

// startTestPlugin starts a test plugin and waits until NRI has synchronized it.
func startTestPlugin(t *testing.T, ctx context.Context, h *stack.Stack, idx, name string) *testPlugin {
	t.Helper()
	return startTestPluginWithPolicy(t, ctx, h, idx, name, "")
}

// startTestPluginWithPolicy starts a test plugin that declares the given failure policy
// (testplugin's -failure-policy) and waits until NRI has synchronized it.
func startTestPluginWithPolicy(t *testing.T, ctx context.Context, h *stack.Stack, idx, name, policy string) *testPlugin {
	t.Helper()
	p := &testPlugin{h: h, name: name, idx: idx, policy: policy, dir: filepath.Join(h.Root, "plugin-"+idx+"-"+name)}
	if err := os.MkdirAll(p.dir, 0o755); err != nil {
		t.Fatal(err)
	}
	p.start(t, ctx)
	return p
}

// start runs the plugin's process (again) and waits until NRI has synchronized it.
func (p *testPlugin) start(t *testing.T, ctx context.Context) {
	t.Helper()
	p.process = startSynchronizedPlugin(t, ctx, p.h, p.idx, p.name, testPluginPath(t), "-dir", p.dir, "-failure-policy", p.policy)
}

// startSynchronizedPlugin runs the plugin binary as NRI plugin idx-name on h's NRI socket, with
// args after its -socket, -name and -idx, and waits until NRI has synchronized it.
func startSynchronizedPlugin(t *testing.T, ctx context.Context, h *stack.Stack, idx, name, binary string, args ...string) *stack.Process {
	t.Helper()
	nriName := idx + "-" + name
	connected := nriConnections(t, h, nriName)
	process, err := h.StartProcess("plugin-"+nriName, binary,
		append([]string{"-socket", h.NRISocket, "-name", name, "-idx", idx}, args...)...)
	if err != nil {
		t.Fatal(err)
	}
	waitSynchronized(t, ctx, h, process, nriName, connected)
	return process
}

// connections counts the lines in which containerd logs that NRI synchronized the plugin.
func (p *testPlugin) connections(t *testing.T) int {
	t.Helper()
	return nriConnections(t, p.h, p.nriName())
}

// nriConnections counts the lines in which containerd logs that NRI synchronized the plugin
// named nriName ("<idx>-<name>"), connected to the socket or pre-installed.
func nriConnections(t *testing.T, h *stack.Stack, nriName string) int {
	t.Helper()
	quoted := `\"` + nriName + `\"`
	return logCount(t, h, "plugin "+quoted+" connected and synchronized") +
		logCount(t, h, "pre-installed NRI plugin "+quoted+" synchronization success")
}

// logCount counts the lines of the daemon log that contain every one of parts.
func logCount(t *testing.T, h *stack.Stack, parts ...string) int {
	t.Helper()
	return len(logLines(t, h.LogPath, parts...))
}

// waitSynchronized waits up to 30 s until NRI has synchronized the plugin nriName, which process
// runs, more often than the connected times it had before.
func waitSynchronized(t *testing.T, ctx context.Context, h *stack.Stack, process *stack.Process, nriName string, connected int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for nriConnections(t, h, nriName) == connected {
		if exited, err := process.Exited(); exited {
			t.Fatalf("NRI plugin %s exited before it was synchronized (%v): %s", nriName, err, processLog(process))
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			t.Fatalf("NRI plugin %s not synchronized after 30s: %s\n%s", nriName, processLog(process), h.LogTail(20))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// kill SIGKILLs the plugin's process, as a crash would.
func (p *testPlugin) kill(t *testing.T) {
	t.Helper()
	if err := p.process.Kill(); err != nil {
		t.Fatal(err)
	}
}

// waitExit waits until the plugin's process has exited and returns its exit status.
func (p *testPlugin) waitExit(t *testing.T, timeout time.Duration) error {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		if exited, err := p.process.Exited(); exited {
			return err
		}
		if time.Now().After(deadline) {
			t.Fatalf("NRI plugin %s still runs after %s", p.nriName(), timeout)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// behave sets the plugin's behaviour for the pod named pod, or for every pod if pod is "";
// behaviour "" removes the setting.
func (p *testPlugin) behave(t *testing.T, pod, behaviour string) {
	t.Helper()
	file := filepath.Join(p.dir, "behavior")
	if pod != "" {
		file += "." + pod
	}
	var err error
	if behaviour == "" {
		err = os.Remove(file)
	} else {
		err = os.WriteFile(file, []byte(behaviour), 0o644)
	}
	if err != nil {
		t.Fatal(err)
	}
}

// slowDown makes the plugin wait d before every answer (the control file wins over the delay
// annotation); d 0 removes the setting.
func (p *testPlugin) slowDown(t *testing.T, d time.Duration) {
	t.Helper()
	file := filepath.Join(p.dir, "delay")
	var err error
	if d == 0 {
		err = os.Remove(file)
	} else {
		err = os.WriteFile(file, []byte(d.String()), 0o644)
	}
	if err != nil {
		t.Fatal(err)
	}
}

// calls counts the plugin's PodSandboxStatus requests for pod sandbox podID, across restarts
// of the plugin; podID "" counts every request.
func (p *testPlugin) calls(t *testing.T, podID string) int {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(p.dir, "calls"))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	n := 0
	for line := range strings.SplitSeq(string(data), "\n") {
		if line != "" && (podID == "" || strings.HasPrefix(line, podID+" ")) {
			n++
		}
	}
	return n
}

// waitCalls waits until the plugin has received at least n requests for podID.
func (p *testPlugin) waitCalls(t *testing.T, podID string, n int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for p.calls(t, podID) < n {
		if time.Now().After(deadline) {
			t.Fatalf("NRI plugin %s got %d requests for pod %s after 30s, want %d", p.nriName(), p.calls(t, podID), podID, n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitLogLine waits up to 30 s for a line of the daemon log that contains every one of parts.
func waitLogLine(t *testing.T, h *stack.Stack, parts ...string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for logCount(t, h, parts...) == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("containerd logged no line with %q after 30s", parts)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// podEvents returns the pod lifecycle events (RunPodSandbox, StopPodSandbox, RemovePodSandbox)
// the plugin received for pod sandbox podID, in order, across restarts of the plugin.
func (p *testPlugin) podEvents(t *testing.T, podID string) []string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(p.dir, "events"))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	var events []string
	for line := range strings.SplitSeq(string(data), "\n") {
		if fields := strings.Fields(line); len(fields) >= 2 && fields[1] == podID {
			events = append(events, fields[0])
		}
	}
	return events
}

// processLog returns the output of a helper process, headed by its name.
func processLog(process *stack.Process) string {
	data, err := os.ReadFile(process.LogPath)
	if err != nil {
		return fmt.Sprintf("(no log of %s: %v)", process.Name, err)
	}
	return "log of " + process.Name + ":\n" + string(data)
}
