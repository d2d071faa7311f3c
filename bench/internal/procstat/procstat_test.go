package procstat

import (
	"os"
	"strings"
	"testing"
	"time"
)

func TestParsePPID(t *testing.T) {
	tests := []struct {
		name string
		stat string
		want int
	}{
		{name: "plain", stat: "42 (nginx) S 7 42 42 0 -1", want: 7},
		{name: "spaces and parens in comm", stat: "42 (a (b) c) R 1234 42 42 0", want: 1234},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parsePPID([]byte(tc.stat))
			if err != nil || got != tc.want {
				t.Fatalf("parsePPID(%q) = %d, %v; want %d", tc.stat, got, err, tc.want)
			}
		})
	}
	if _, err := parsePPID([]byte("garbage")); err == nil {
		t.Fatal("parsePPID(garbage) succeeded")
	}
}

func TestParseKB(t *testing.T) {
	tests := []struct {
		name, text, key string
		want            int64
	}{
		{"status", "Name:\tsocat\nVmPeak:\t  9000 kB\nVmRSS:\t    2048 kB\nThreads:\t1\n", "VmRSS:", 2048 << 10},
		{"kernel thread", "Name:\tkthreadd\n", "VmRSS:", 0},
		{"smaps_rollup", "55d0-7ffd ---p 00000000 00:00 0 [rollup]\nRss:  3000 kB\nPss:  1234 kB\nPss_Dirty: 1 kB\n", "Pss:", 1234 << 10},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseKB(strings.NewReader(tc.text), tc.key)
			if err != nil || got != tc.want {
				t.Fatalf("parseKB(%s) = %d, %v; want %d", tc.key, got, err, tc.want)
			}
		})
	}
	if _, err := parseKB(strings.NewReader("VmRSS: lots\n"), "VmRSS:"); err == nil {
		t.Fatal("parseKB accepted a malformed line")
	}
}

func TestTreeSelf(t *testing.T) {
	u, err := Tree(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if u.Procs < 1 || u.RSSBytes <= 0 || u.PSSBytes <= 0 || u.FDs < 3 {
		t.Fatalf("Tree(self) = %+v; want at least one process with memory and stdio", u)
	}
}

func TestParseCPU(t *testing.T) {
	// pid (comm) state ppid pgrp session tty tpgid flags minflt cminflt
	// majflt cmajflt utime stime cutime cstime ...
	stat := "42 (a (b) c) S 1 42 42 0 -1 4194560 100 0 0 0 250 50 7 3 20 0 1 0"
	got, err := parseCPU([]byte(stat))
	if want := 3100 * time.Millisecond; err != nil || got != want {
		t.Fatalf("parseCPU = %v, %v; want %v", got, err, want)
	}
	for _, bad := range []string{"garbage", "42 (x) S 1 2 3", "42 (x) S 1 42 42 0 -1 0 0 0 0 0 x 0 0 0 20"} {
		if _, err := parseCPU([]byte(bad)); err == nil {
			t.Errorf("parseCPU(%q) succeeded", bad)
		}
	}
}

func TestTreeCPUGrows(t *testing.T) {
	before, err := Tree(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	// Spin for 100 ms of wall time (bounded), which is at least a few ticks
	// of CPU on any machine running the test.
	x := 0
	for end := time.Now().Add(100 * time.Millisecond); time.Now().Before(end); {
		x++
	}
	after, err := Tree(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if after.CPU <= before.CPU {
		t.Fatalf("CPU did not grow over 100 ms of spinning (%d loops): %v then %v", x, before.CPU, after.CPU)
	}
}

func TestParseSystem(t *testing.T) {
	// user nice system idle iowait irq softirq steal guest guest_nice
	stat := "cpu  100 5 50 800 20 3 7 15 40 0\ncpu0 50 2 25 400 10 1 3 7 20 0\nintr 1 2 3\n"
	got, err := parseSystem([]byte(stat))
	want := Machine{Busy: 1800 * time.Millisecond, Total: 10000 * time.Millisecond}
	if err != nil || got != want {
		t.Fatalf("parseSystem = %+v, %v; want %+v", got, err, want)
	}
	for _, bad := range []string{"", "garbage", "cpu0 1 2 3 4 5", "cpu 1 2 x 4 5", "cpu 1 2"} {
		if _, err := parseSystem([]byte(bad)); err == nil {
			t.Errorf("parseSystem(%q) succeeded", bad)
		}
	}
}

func TestUtilization(t *testing.T) {
	a := Machine{Busy: time.Second, Total: 4 * time.Second}
	b := Machine{Busy: 4 * time.Second, Total: 8 * time.Second}
	if got := a.Utilization(b); got != 0.75 {
		t.Fatalf("Utilization = %v; want 0.75", got)
	}
	if got := a.Utilization(a); got != 0 {
		t.Fatalf("Utilization over no time = %v; want 0", got)
	}
}

func TestSystemMovesWithWork(t *testing.T) {
	before, err := System()
	if err != nil {
		t.Fatal(err)
	}
	x := 0
	for end := time.Now().Add(100 * time.Millisecond); time.Now().Before(end); {
		x++
	}
	after, err := System()
	if err != nil {
		t.Fatal(err)
	}
	if after.Busy <= before.Busy || after.Total <= before.Total {
		t.Fatalf("machine CPU did not grow over 100 ms of spinning (%d loops): %+v then %+v", x, before, after)
	}
}
