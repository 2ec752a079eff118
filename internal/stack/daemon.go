package stack

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"syscall"
	"time"
)

// daemon is one run of a child process: containerd, or a helper started by StartProcess.
type daemon struct {
	binary string
	pid    int
	done   chan struct{} // closed when the process has exited and been reaped
	err    error         // exit status, valid once done is closed
}

// startDaemon starts binary with args, output appended to log. The process gets its own process
// group (a Ctrl-C meant for the caller does not reach it) and is SIGKILLed if the caller dies.
func startDaemon(binary string, args, env []string, log *os.File) (*daemon, error) {
	d := &daemon{binary: binary, done: make(chan struct{})}
	started := make(chan error, 1)
	go func() {
		// Pdeathsig fires when the thread that forked the child exits, not the process: keep this
		// goroutine on its thread until the child is gone. The thread ends with the goroutine.
		runtime.LockOSThread()
		cmd := exec.Command(binary, args...)
		cmd.Env = env
		cmd.Stdout = log
		cmd.Stderr = log
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		d.pid = cmd.Process.Pid
		started <- nil
		d.err = cmd.Wait()
		close(d.done)
	}()
	if err := <-started; err != nil {
		return nil, fmt.Errorf("start %s: %w", binary, err)
	}
	return d, nil
}

// exited reports whether the process has exited.
func (d *daemon) exited() bool {
	select {
	case <-d.done:
		return true
	default:
		return false
	}
}

// stop sends SIGTERM and waits for the exit; after grace it sends SIGKILL.
func (d *daemon) stop(grace time.Duration) error {
	if d.exited() {
		return nil
	}
	if err := syscall.Kill(d.pid, syscall.SIGTERM); err != nil && err != syscall.ESRCH {
		return fmt.Errorf("SIGTERM %s (pid %d): %w", d.binary, d.pid, err)
	}
	select {
	case <-d.done:
		return nil
	case <-time.After(grace):
	}
	if err := syscall.Kill(d.pid, syscall.SIGKILL); err != nil && err != syscall.ESRCH {
		return fmt.Errorf("SIGKILL %s (pid %d): %w", d.binary, d.pid, err)
	}
	<-d.done
	return fmt.Errorf("%s (pid %d) ignored SIGTERM for %s and was killed", d.binary, d.pid, grace)
}

// kill sends SIGKILL, as a crash would, and waits for the exit; it does nothing once the process
// has exited.
func (d *daemon) kill() error {
	if d.exited() {
		return nil
	}
	if err := syscall.Kill(d.pid, syscall.SIGKILL); err != nil && err != syscall.ESRCH {
		return fmt.Errorf("SIGKILL %s (pid %d): %w", d.binary, d.pid, err)
	}
	<-d.done
	return nil
}
