//go:build integration && linux

package integration

import (
	"os/exec"
	"syscall"
)

// killWithParent makes the kernel send cmd SIGKILL when the thread that
// started it exits, so a test binary that dies (a panic, a timeout) leaves
// no etcd or kube-apiserver behind.
func killWithParent(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
