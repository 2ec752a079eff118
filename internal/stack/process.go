package stack

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"
)

// Process is a helper process of the instance, e.g. an external NRI plugin on NRISocket.
type Process struct {
	Name    string
	LogPath string // the process's output, appended across runs of the same name
	d       *daemon
}

// StartProcess starts binary with args next to the daemon. Its output is appended to
// Root/<name>.log, it is SIGKILLed if the caller dies, and Close stops it (after removing the pods,
// before stopping the daemon) unless Stop already did.
func (h *Stack) StartProcess(name, binary string, args ...string) (*Process, error) {
	// Held until the cleanup is registered, so that a concurrent Close cannot miss the process.
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return nil, errors.New("harness is closed")
	}
	p := &Process{Name: name, LogPath: filepath.Join(h.Root, name+".log")}
	log, err := os.OpenFile(p.LogPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer log.Close() // the child has its own descriptor
	if p.d, err = startDaemon(binary, args, os.Environ(), log); err != nil {
		return nil, fmt.Errorf("helper %s: %w", name, err)
	}
	h.cleanups = append(h.cleanups, p.Stop)
	return p, nil
}

// Stop sends SIGTERM, SIGKILL after 10 s, and waits for the exit. Stopping a process that has
// already exited does nothing.
func (p *Process) Stop() error {
	return p.d.stop(10 * time.Second)
}

// Exited reports whether the process has exited, and then its exit status.
func (p *Process) Exited() (bool, error) {
	if !p.d.exited() {
		return false, nil
	}
	return true, p.d.err
}

// PID returns the process ID.
func (p *Process) PID() int {
	return p.d.pid
}

// Kill sends SIGKILL, as a crash would, and waits for the exit. Killing a process that has
// already exited does nothing.
func (p *Process) Kill() error {
	return p.d.kill()
}
