package cluster

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Process is one long-running process of the cluster (etcd, an API server, a node's containerd,
// kubelet or kube-proxy), recorded in the state so that another process (`knext-cluster down`, a
// restart) can find, stop and start it again. It outlives the runner that started it.
type Process struct {
	Name string   `json:"name"` // "kube-apiserver", "node-1/kubelet"
	Argv []string `json:"argv"` // the whole command, namespace entry included
	Env  []string `json:"env,omitempty"`
	Log  string   `json:"log"`
	PID  int      `json:"pid,omitempty"` // 0 while stopped
	// StartTime is the process's start in clock ticks since boot (/proc/<pid>/stat field 22): a
	// PID reused by another process after ours exited does not match it.
	StartTime uint64 `json:"startTime,omitempty"`
}

// inNamespaces returns argv run in the network namespace netns (a name of `ip netns`) and, unless
// mountNS is empty, the mount namespace bound at that file. nsenter execs argv without forking,
// so the process's PID is argv's.
func inNamespaces(netns, mountNS string, argv ...string) []string {
	cmd := []string{"nsenter", "--net=" + netnsPath(netns)}
	if mountNS != "" {
		cmd = append(cmd, "--mount="+mountNS)
	}
	return append(append(cmd, "--"), argv...)
}

// start starts p detached from the caller: its own session, output appended to p.Log, standard
// input from /dev/null, no signal when the caller exits. The caller reaps it if it exits while the
// caller runs.
func (p *Process) start() error {
	if p.running() {
		return fmt.Errorf("%s is already running (pid %d)", p.Name, p.PID)
	}
	if err := os.MkdirAll(filepath.Dir(p.Log), 0o755); err != nil {
		return err
	}
	log, err := os.OpenFile(p.Log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer log.Close() // the child has its own descriptor
	fmt.Fprintf(log, "=== %s: starting %s\n", time.Now().UTC().Format(time.RFC3339Nano), strings.Join(p.Argv, " "))
	cmd := exec.Command(p.Argv[0], p.Argv[1:]...)
	cmd.Env = append(os.Environ(), p.Env...)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", p.Name, err)
	}
	go cmd.Wait() //nolint:errcheck // reaps the child if it exits before the caller; its log says why
	p.PID = cmd.Process.Pid
	if p.StartTime, err = processStartTime(p.PID); err != nil {
		return fmt.Errorf("%s (pid %d) exited at once: see %s", p.Name, p.PID, p.Log)
	}
	return nil
}

// running reports whether the recorded process is still the one that was started and has not
// exited.
func (p *Process) running() bool {
	if p.PID == 0 {
		return false
	}
	start, err := processStartTime(p.PID)
	return err == nil && start == p.StartTime
}

// stop sends SIGTERM and waits up to grace for the exit, then SIGKILLs. A process that is not
// running is only marked stopped.
func (p *Process) stop(grace time.Duration) error {
	return p.signal(syscall.SIGTERM, grace)
}

// kill SIGKILLs the process, as a crash would, and waits for the exit.
func (p *Process) kill() error {
	return p.signal(syscall.SIGKILL, 0)
}

func (p *Process) signal(sig syscall.Signal, grace time.Duration) error {
	defer func() { p.PID, p.StartTime = 0, 0 }()
	if !p.running() {
		return nil
	}
	if err := syscall.Kill(p.PID, sig); err != nil && err != syscall.ESRCH {
		return fmt.Errorf("signal %s (pid %d): %w", p.Name, p.PID, err)
	}
	if waitGone(p.PID, p.StartTime, grace) {
		return nil
	}
	if err := syscall.Kill(p.PID, syscall.SIGKILL); err != nil && err != syscall.ESRCH {
		return fmt.Errorf("SIGKILL %s (pid %d): %w", p.Name, p.PID, err)
	}
	if !waitGone(p.PID, p.StartTime, 10*time.Second) {
		return fmt.Errorf("%s (pid %d) still alive 10s after SIGKILL", p.Name, p.PID)
	}
	if sig != syscall.SIGKILL {
		return fmt.Errorf("%s (pid %d) ignored SIGTERM for %s and was killed: %w", p.Name, p.PID, grace, errKilled)
	}
	return nil
}

// errKilled says that a process stop had to SIGKILL the process after its grace period.
var errKilled = errors.New("killed after its grace period")

// waitGone waits up to timeout until the process pid started at start is gone (or a zombie).
func waitGone(pid int, start uint64, timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for {
		if s, err := processStartTime(pid); err != nil || s != start {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// processStartTime returns the start time of a live process (not a zombie) from /proc.
func processStartTime(pid int) (uint64, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// "pid (comm) state ppid ...": comm may hold spaces and parentheses.
	i := bytes.LastIndexByte(data, ')')
	if i < 0 {
		return 0, fmt.Errorf("pid %d: unexpected /proc stat %q", pid, data)
	}
	fields := strings.Fields(string(data[i+1:]))
	// fields[0] is the state (field 3), so field 22 (starttime) is fields[19].
	if len(fields) < 20 {
		return 0, fmt.Errorf("pid %d: short /proc stat", pid)
	}
	if fields[0] == "Z" || fields[0] == "X" {
		return 0, errors.New("exited")
	}
	return strconv.ParseUint(fields[19], 10, 64)
}
