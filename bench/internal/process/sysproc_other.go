//go:build !linux

package process

import (
	"syscall"
	"time"
)

// The benchmark measures through Linux /proc; elsewhere children are only
// started and killed, without process groups.
func sysProcAttr() *syscall.SysProcAttr { return nil }

func (p *Process) killGroup(syscall.Signal) { p.cmd.Process.Kill() }

func (p *Process) waitGroupGone(time.Duration) {}
