package process

import (
	"errors"
	"syscall"
	"time"
)

// sysProcAttr puts the child in a process group of its own and has the
// kernel kill it if the driver dies. Pdeathsig fires when the thread that
// started the child exits; Go keeps its threads, so in practice that is when
// the driver exits.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

// killGroup signals the process group led by the child. The group id is the
// child's pid, which stays reserved while any member of the group lives.
func (p *Process) killGroup(sig syscall.Signal) {
	syscall.Kill(-p.PID(), sig)
}

// waitGroupGone polls until no process of the child's group exists, not even
// as a zombie, or timeout passes.
func (p *Process) waitGroupGone(timeout time.Duration) {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if err := syscall.Kill(-p.PID(), 0); errors.Is(err, syscall.ESRCH) {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}
