//go:build integration && linux

package integration

import (
	"bufio"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// proxyBin is the binary under test, built once by TestMain, or named by
// $KUP_PROXY_BIN (make integration names the binary make build made, the one
// users run: version, commit and its date stamped).
var proxyBin string

func TestMain(m *testing.M) {
	// In the SCTP test VM (`make test-sctp`) there is no Go toolchain: the
	// harness packs a static build and names it here.
	if bin := os.Getenv("KUP_PROXY_BIN"); bin != "" {
		proxyBin = bin
		code := m.Run()
		stopAPIServer()
		os.Exit(code)
	}
	dir, err := os.MkdirTemp("", "kup-integration-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	proxyBin = filepath.Join(dir, "kube-userspace-proxy")
	build := exec.Command("go", "build", "-o", proxyBin, "../cmd/kube-userspace-proxy")
	build.Stdout, build.Stderr = os.Stdout, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "build the proxy:", err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	stopAPIServer() // started by the first test that needed it
	os.RemoveAll(dir)
	os.Exit(code)
}

// bothBuilds returns the binary under test and its goroutine build
// (-tags goroutines), built for this test, by name, for tests whose subject
// the two builds do differently.
func bothBuilds(t *testing.T) []struct{ name, bin string } {
	t.Helper()
	goroutines := filepath.Join(t.TempDir(), "kube-userspace-proxy-goroutines")
	build := exec.Command("go", "build", "-tags", "goroutines", "-o", goroutines, "../cmd/kube-userspace-proxy")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build the goroutine build: %v\n%s", err, out)
	}
	return []struct{ name, bin string }{{"event loops", proxyBin}, {"goroutines", goroutines}}
}

// requireTool skips when a client program is missing, except under CI,
// where the test fails: `make test` installs it there.
func requireTool(t *testing.T, name string) string {
	t.Helper()
	path, err := exec.LookPath(name)
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s is not installed (hack/deps.sh installs it as root)", name)
		}
		t.Skipf("%s is not installed; run `make deps` as root", name)
	}
	return path
}

// proxyProc is a running proxy whose log lines can be waited for.
type proxyProc struct {
	t    *testing.T
	cmd  *exec.Cmd
	done chan struct{} // closed when the process has exited
	err  error         // its exit status, once done

	mu     sync.Mutex // guards the fields below
	lines  []string
	notify chan struct{} // closed and replaced on every new line
}

// noNodePortCIDRs are --nodeport-addresses that match no address of this
// host, of either family, so a proxy given them serves no node port.
// Proxies in the host's namespace that follow the shared API server take
// them (noNodePorts): they would otherwise all listen on the node ports of
// the NodePort Services that tests running beside them create, on the same
// addresses, and the later ones' syncs fail with "address already in use".
var noNodePortCIDRs = []string{"127.0.0.7/32", "::7/128"}

// noNodePorts is the flag for noNodePortCIDRs.
var noNodePorts = "--nodeport-addresses=" + strings.Join(noNodePortCIDRs, ",")

func startProxy(t *testing.T, args ...string) *proxyProc {
	t.Helper()
	// Proxies of tests running side by side in the host's namespace would
	// all want /healthz on port 10256 and /metrics on 10249: only tests
	// that ask have them.
	for _, flag := range []string{"--healthz-bind-address", "--metrics-bind-address"} {
		if !slices.ContainsFunc(args, func(a string) bool { return strings.HasPrefix(a, flag) }) {
			args = append(args, flag+"=")
		}
	}
	return startCommand(t, proxyBin, args...)
}

// startCommand runs a program that ends up as the proxy (e.g. a shell that
// sets limits and execs it).
func startCommand(t *testing.T, name string, args ...string) *proxyProc {
	t.Helper()
	cmd := exec.Command(name, args...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout = io.Discard
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &proxyProc{t: t, cmd: cmd, done: make(chan struct{}), notify: make(chan struct{})}
	go p.read(stderr)
	t.Cleanup(func() {
		if _, ok := p.terminate(10 * time.Second); !ok {
			p.cmd.Process.Kill()
			<-p.done
		}
		if t.Failed() {
			t.Logf("proxy log:\n%s", p.log())
		}
	})
	return p
}

// terminate sends SIGTERM and waits up to within for the process to exit.
// It reports how long the exit took, or false when it had not exited.
func (p *proxyProc) terminate(within time.Duration) (time.Duration, bool) {
	return p.stop(syscall.SIGTERM, within)
}

// stop is terminate with another signal.
func (p *proxyProc) stop(sig syscall.Signal, within time.Duration) (time.Duration, bool) {
	start := time.Now()
	_ = p.cmd.Process.Signal(sig)
	select {
	case <-p.done:
		return time.Since(start), true
	case <-time.After(within):
		return time.Since(start), false
	}
}

func (p *proxyProc) read(r io.Reader) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		p.mu.Lock()
		p.lines = append(p.lines, sc.Text())
		close(p.notify)
		p.notify = make(chan struct{})
		p.mu.Unlock()
	}
	p.err = p.cmd.Wait()
	close(p.done)
}

func (p *proxyProc) log() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return strings.Join(p.lines, "\n")
}

// waitLog waits until count log lines from line index `from` on match re,
// and returns the index after the last match.
func (p *proxyProc) waitLog(from int, re string, count int, timeout time.Duration) int {
	p.t.Helper()
	rx := regexp.MustCompile(re)
	deadline := time.After(timeout)
	for {
		p.mu.Lock()
		seen, after := 0, from
		for i := from; i < len(p.lines); i++ {
			if rx.MatchString(p.lines[i]) {
				seen++
				after = i + 1
			}
		}
		ch := p.notify
		p.mu.Unlock()
		if seen >= count {
			return after
		}
		select {
		case <-ch:
		case <-p.done:
			p.t.Fatalf("proxy exited (%v) before logging %q", p.err, re)
		case <-deadline:
			p.t.Fatalf("no log line matching %q within %v", re, timeout)
		}
	}
}

func (p *proxyProc) lineCount() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.lines)
}

// httpBackend answers every request with its name.
func httpBackend(t *testing.T, name string) int {
	t.Helper()
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, name)
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return ln.Addr().(*net.TCPAddr).Port
}

// udpBackend replies "name:payload".
func udpBackend(t *testing.T, name string) int {
	t.Helper()
	c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		buf := make([]byte, 65535)
		for {
			n, from, err := c.ReadFromUDPAddrPort(buf)
			if err != nil {
				return
			}
			c.WriteToUDPAddrPort(fmt.Appendf(nil, "%s:%s", name, buf[:n]), from)
		}
	}()
	t.Cleanup(func() { c.Close() })
	return c.LocalAddr().(*net.UDPAddr).Port
}

// freePort returns a port free for both TCP and UDP on 127.0.0.1.
func freePort(t *testing.T) int {
	t.Helper()
	// Below the kernel's ephemeral range (32768 and up), so a port the
	// proxy or a client binds to 0 can never take it in the meantime: the
	// range node ports come from in a cluster, too.
	for range 200 {
		port := 20000 + rand.IntN(12000)
		ln, err := net.Listen("tcp4", fmt.Sprintf("127.0.0.1:%d", port))
		if err != nil {
			continue
		}
		ln.Close()
		// The same port must be free for UDP too.
		if u, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: port}); err == nil {
			u.Close()
			return int(port)
		}
	}
	t.Fatal("no free port")
	return 0
}

// curl fetches url with the real curl and returns the body.
func curl(t *testing.T, url string) (string, error) {
	t.Helper()
	out, err := exec.Command(requireTool(t, "curl"), "-fsS", "--max-time", "5", url).CombinedOutput()
	return strings.TrimSpace(string(out)), err
}

// ncUDP sends one datagram with the real nc and returns the reply.
func ncUDP(t *testing.T, host string, port int, payload string) (string, error) {
	t.Helper()
	cmd := exec.Command(requireTool(t, "nc"), "-u", "-w1", host, fmt.Sprint(port))
	cmd.Stdin = strings.NewReader(payload)
	out, err := cmd.CombinedOutput()
	return strings.TrimSpace(string(out)), err
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// replaceFile writes content the way many editors do: to a new file, then
// renamed over the old one.
func replaceFile(t *testing.T, path, content string) {
	t.Helper()
	tmp := path + ".tmp"
	writeFile(t, tmp, content)
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}
