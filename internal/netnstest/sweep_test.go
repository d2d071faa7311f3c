//go:build linux

package netnstest

import (
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

func TestOwnerPID(t *testing.T) {
	for _, tc := range []struct {
		name string
		pid  int
		ok   bool
	}{
		{"kupt123-4-client", 123, true},
		{"kupt123-", 123, true},
		{"kupt123", 0, false},
		{"kupt-4-client", 0, false},
		{"kupt0-1", 0, false},
		{"kupt12a-1", 0, false},
		{"other123-1", 0, false},
	} {
		if pid, ok := ownerPID(tc.name, "kupt"); pid != tc.pid || ok != tc.ok {
			t.Errorf("ownerPID(%q) = %d, %v; want %d, %v", tc.name, pid, ok, tc.pid, tc.ok)
		}
	}
}

// TestSweepStale: of namespaces named for a dead process, a live one (this
// test's) and with another prefix, only the first is deleted.
func TestSweepStale(t *testing.T) {
	if os.Geteuid() != 0 {
		if os.Getenv("CI") == "true" {
			t.Fatal("needs root to create network namespaces")
		}
		t.Skip("needs root to create network namespaces")
	}
	dead := deadPID(t)
	prefix := fmt.Sprintf("kupsweep%d-", os.Getpid()) // no other run's names
	stale := fmt.Sprintf("%s%d-1", prefix, dead)
	live := fmt.Sprintf("%s%d-1", prefix, os.Getpid())
	other := fmt.Sprintf("kupsweepother%d-%d-1", os.Getpid(), dead)
	for _, name := range []string{stale, live, other} {
		if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
			t.Fatalf("ip netns add %s: %v: %s", name, err, out)
		}
		t.Cleanup(func() { exec.Command("ip", "netns", "del", name).Run() })
	}
	SweepStale(prefix)
	out, err := exec.Command("ip", "netns", "list").Output()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, line := range strings.Split(string(out), "\n") {
		name, _, _ := strings.Cut(strings.TrimSpace(line), " ")
		names = append(names, name)
	}
	for name, want := range map[string]bool{stale: false, live: true, other: true} {
		if got := slices.Contains(names, name); got != want {
			t.Errorf("%s still there: %v, want %v", name, got, want)
		}
	}
}

// deadPID returns the process ID of a child that has ended and been
// reaped, so that no process has it (until the kernel hands it out again,
// which takes a whole round of process IDs).
func deadPID(t *testing.T) int {
	t.Helper()
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	return cmd.Process.Pid
}
