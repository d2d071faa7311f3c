//go:build linux

package netnstest

import (
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
)

// SweepStale deletes the network namespaces that earlier test processes
// created and could not delete because they died first (a timeout's
// panic, SIGKILL): those named prefix, a process ID, then "-" and
// anything, whose process is gone. A namespace of a live process, this
// one included, and every other name are left alone. Without root or ip
// it does nothing.
func SweepStale(prefix string) {
	out, err := exec.Command("ip", "netns", "list").Output()
	if err != nil {
		return
	}
	for _, line := range strings.Split(string(out), "\n") {
		name, _, _ := strings.Cut(strings.TrimSpace(line), " ")
		if pid, ok := ownerPID(name, prefix); ok && pid != os.Getpid() && syscall.Kill(pid, 0) == syscall.ESRCH {
			_ = exec.Command("ip", "netns", "del", name).Run()
		}
	}
}

// ownerPID returns the process ID in a namespace name of the form
// prefix<pid>-...
func ownerPID(name, prefix string) (int, bool) {
	rest, ok := strings.CutPrefix(name, prefix)
	if !ok {
		return 0, false
	}
	digits, _, ok := strings.Cut(rest, "-")
	if !ok {
		return 0, false
	}
	pid, err := strconv.Atoi(digits)
	return pid, err == nil && pid > 0
}
