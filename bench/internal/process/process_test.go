package process

import (
	"bufio"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestStopKillsTheGroup(t *testing.T) {
	// The shell forks a grandchild that would outlive a plain kill of the
	// shell; it reports its pid on stdout.
	p, err := Start(Config{Pipes: true, Argv: []string{"sh", "-c", "sleep 30 & echo $!; wait"}})
	if err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(p.Stdout).ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	p.Stop()
	if exited, _ := p.Exited(); !exited {
		t.Fatal("child still running after Stop")
	}
	if d := time.Since(start); d > termGrace {
		t.Fatalf("Stop took %v; SIGTERM should have been enough", d)
	}
	grandchild := strings.TrimSpace(line)
	// Reaped by init, or a zombie at worst, once killed.
	deadline := time.Now().Add(2 * time.Second)
	for time.Now().Before(deadline) {
		stat, err := os.ReadFile(filepath.Join("/proc", grandchild, "stat"))
		if err != nil || strings.Contains(string(stat), ") Z ") {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("grandchild %s survived Stop", grandchild)
}

func TestLogTail(t *testing.T) {
	log := filepath.Join(t.TempDir(), "child.log")
	p, err := Start(Config{Log: log, Argv: []string{"sh", "-c", "echo one; echo two >&2; exit 3"}})
	if err != nil {
		t.Fatal(err)
	}
	<-p.Done()
	exited, err := p.Exited()
	if !exited || err == nil {
		t.Fatalf("Exited = %v, %v; want exited with an error", exited, err)
	}
	if got := p.LogTail(); got != "one | two" {
		t.Fatalf("LogTail = %q, want %q", got, "one | two")
	}
	p.Stop() // after exit: must not hang or signal anyone else
}

func TestStartMissingProgram(t *testing.T) {
	if _, err := Start(Config{Argv: []string{"/nonexistent/program"}}); err == nil {
		t.Fatal("Start of a missing program succeeded")
	}
}
