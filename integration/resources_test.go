//go:build integration && linux

package integration

import (
	"bufio"
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestShedsWhenOutOfFileDescriptors runs the real binary with a tiny
// RLIMIT_NOFILE, opens more connections than it can hold, and checks that
// it sheds the excess with resets, logs it, stays up, and serves again once
// connections close (the legacy proxier panicked on EMFILE).
func TestShedsWhenOutOfFileDescriptors(t *testing.T) {
	requireTool(t, "bash")
	echo := echoBackend(t)
	np := freePort(t)
	file := filepath.Join(t.TempDir(), "services.yaml")
	writeFile(t, file, manifest(np, "None", []int{echo}, nil))

	// bash sets the limit, then execs the proxy in its place.
	args := append([]string{"-c", `ulimit -n 48 && exec "$0" "$@"`, proxyBin}, proxyArgs(file)...)
	p := startCommand(t, "bash", args...)
	p.waitLog(0, `"Serving".*via="node-port"`, 1, 20*time.Second)
	addr := fmt.Sprintf("127.0.0.1:%d", np)

	var held []net.Conn
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()
	failed := 0
	for i := range 60 {
		c, err := net.DialTimeout("tcp", addr, 2*time.Second)
		if err != nil {
			failed++
			continue
		}
		if err := echoOnce(c, fmt.Sprintf("hello %d", i)); err != nil {
			c.Close()
			failed++
			continue
		}
		held = append(held, c)
	}
	if failed == 0 {
		t.Fatalf("all 60 connections were proxied under a 48-fd limit; the test did not exhaust fds")
	}
	if len(held) == 0 {
		t.Fatal("no connection was proxied at all")
	}
	p.waitLog(0, `Out of file descriptors`, 1, 5*time.Second)
	select {
	case <-p.done:
		t.Fatalf("the proxy died when it ran out of fds: %v", p.err)
	default:
	}
	// The held connections still work.
	for i, c := range held {
		if err := echoOnce(c, "still"); err != nil {
			t.Fatalf("held connection %d broke: %v", i, err)
		}
	}
	// Free them: new connections are served again.
	for _, c := range held {
		c.Close()
	}
	held = nil
	var lastErr error
	for range 50 { // the proxy notices the closes asynchronously
		c, err := net.DialTimeout("tcp", addr, 2*time.Second)
		if err == nil {
			lastErr = echoOnce(c, "again")
			c.Close()
			if lastErr == nil {
				return
			}
		} else {
			lastErr = err
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("no connection served after fds were freed: %v", lastErr)
}

func echoOnce(c net.Conn, msg string) error {
	c.SetDeadline(time.Now().Add(3 * time.Second))
	if _, err := fmt.Fprintln(c, msg); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	if strings.TrimSpace(line) != msg {
		return fmt.Errorf("echo %q, want %q", line, msg)
	}
	return nil
}

// serveEcho echoes each line of every connection ln accepts, until ln is
// closed.
func serveEcho(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			r := bufio.NewReader(c)
			for {
				line, err := r.ReadString('\n')
				if err != nil {
					return
				}
				if _, err := c.Write([]byte(line)); err != nil {
					return
				}
			}
		}()
	}
}

// echoBackend echoes lines back.
func echoBackend(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go serveEcho(ln)
	t.Cleanup(func() { ln.Close() })
	return ln.Addr().(*net.TCPAddr).Port
}
