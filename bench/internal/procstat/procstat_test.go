package procstat

import (
	"os"
	"strings"
	"testing"
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
