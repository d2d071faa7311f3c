package userspace

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"k8s.io/klog/v2"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/state"
)

// fakeClock is a Clock that tests move by hand.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func newFakeClock() *fakeClock { return &fakeClock{now: time.Unix(1_700_000_000, 0)} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Step(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// tcpBackend greets each connection with its name and a newline, then
// echoes everything until the client half-closes, then closes.
type tcpBackend struct {
	name string
	ln   net.Listener
	wg   sync.WaitGroup
}

func startTCPBackend(t testing.TB, name string) *tcpBackend {
	t.Helper()
	return startTCPBackendOn(t, name, "127.0.0.1:0")
}

// startTCPBackendOn starts the backend on addr (e.g. "[::1]:0").
func startTCPBackendOn(t testing.TB, name, addr string) *tcpBackend {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	b := &tcpBackend{name: name, ln: ln}
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			b.wg.Add(1)
			go func() {
				defer b.wg.Done()
				defer c.Close()
				fmt.Fprintf(c, "%s\n", name)
				io.Copy(c, c)
			}()
		}
	}()
	t.Cleanup(b.stop)
	return b
}

func (b *tcpBackend) stop() {
	b.ln.Close()
	b.wg.Wait()
}

func (b *tcpBackend) addr() netip.AddrPort {
	return b.ln.Addr().(*net.TCPAddr).AddrPort()
}

// udpBackend answers "who" with its name and echoes anything else.
type udpBackend struct {
	name string
	conn *net.UDPConn
	done chan struct{}
}

func startUDPBackend(t testing.TB, name string) *udpBackend {
	t.Helper()
	return startUDPBackendOn(t, name, "127.0.0.1:0")
}

func startUDPBackendOn(t testing.TB, name, addr string) *udpBackend {
	t.Helper()
	conn, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.MustParseAddrPort(addr)))
	if err != nil {
		t.Fatal(err)
	}
	b := &udpBackend{name: name, conn: conn, done: make(chan struct{})}
	go func() {
		defer close(b.done)
		buf := make([]byte, 70000)
		for {
			n, from, err := conn.ReadFromUDPAddrPort(buf)
			if err != nil {
				return
			}
			reply := buf[:n]
			if string(reply) == "who" {
				reply = []byte(name)
			}
			conn.WriteToUDPAddrPort(reply, from)
		}
	}()
	t.Cleanup(func() { conn.Close(); <-b.done })
	return b
}

func (b *udpBackend) addr() netip.AddrPort { return b.conn.LocalAddr().(*net.UDPAddr).AddrPort() }

func eps(addrs ...netip.AddrPort) []state.Endpoint {
	out := make([]state.Endpoint, len(addrs))
	for i, a := range addrs {
		out[i] = state.Endpoint{Addr: a, Ready: true, Serving: true}
	}
	return out
}

func spn(name, port string, proto state.Protocol) state.ServicePortName {
	return state.ServicePortName{Namespace: "test", Name: name, Port: port, Protocol: proto}
}

// newTestProxier returns a proxier on loopback, closed at the end of the
// test.
func newTestProxier(t testing.TB, cfg Config) *Proxier {
	t.Helper()
	if !cfg.BindAddress.IsValid() {
		cfg.BindAddress = netip.MustParseAddr("127.0.0.1")
	}
	p := New(cfg)
	t.Cleanup(func() { p.Close() })
	return p
}

func mustApply(t testing.TB, p *Proxier, ports ...state.ServicePort) {
	t.Helper()
	if err := p.Apply(state.NewSnapshot(ports)); err != nil {
		t.Fatalf("Apply: %v", err)
	}
}

func proxyAddr(t testing.TB, p *Proxier, name state.ServicePortName) string {
	t.Helper()
	port := p.ProxyPort(name)
	if port == 0 {
		t.Fatalf("no proxy port for %s", name)
	}
	return fmt.Sprintf("127.0.0.1:%d", port)
}

// tcpWho connects, reads the backend's name, checks an echo, and closes.
func tcpWho(t testing.TB, addr string) string {
	t.Helper()
	name, err := tcpWhoErr(addr)
	if err != nil {
		t.Fatal(err)
	}
	return name
}

func tcpWhoErr(addr string) (string, error) {
	return tcpWhoDial(func() (net.Conn, error) { return net.DialTimeout("tcp", addr, 5*time.Second) }, addr)
}

// tcpWhoDial is tcpWhoErr with a connection from dial.
func tcpWhoDial(dial func() (net.Conn, error), addr string) (string, error) {
	c, err := dial()
	if err != nil {
		return "", err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	r := bufio.NewReader(c)
	name, err := r.ReadString('\n')
	if err != nil {
		return "", fmt.Errorf("read greeting via %s: %w", addr, err)
	}
	if _, err := c.Write([]byte("ping\n")); err != nil {
		return "", err
	}
	echo, err := r.ReadString('\n')
	if err != nil || echo != "ping\n" {
		return "", fmt.Errorf("echo via %s: got %q, %v", addr, echo, err)
	}
	return strings.TrimSpace(name), nil
}

// udpExchange sends payload from a fresh socket and returns the reply.
func udpExchange(t testing.TB, conn *net.UDPConn, payload []byte) ([]byte, error) {
	t.Helper()
	if _, err := conn.Write(payload); err != nil {
		return nil, err
	}
	conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 70000)
	n, err := conn.Read(buf)
	if err != nil {
		return nil, err
	}
	return buf[:n], nil
}

func dialUDP(t testing.TB, addr string) *net.UDPConn {
	t.Helper()
	ua, err := net.ResolveUDPAddr("udp", addr)
	if err != nil {
		t.Fatal(err)
	}
	c, err := net.DialUDP("udp", nil, ua)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// expectClosedTCP checks that nothing accepts on addr any more.
func expectClosedTCP(t testing.TB, addr string) {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err == nil {
		c.Close()
		t.Fatalf("%s still accepts connections", addr)
	}
}

// openFDs counts this process's open file descriptors.
func openFDs(t testing.TB) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		skipOrFail(t, "cannot count fds: %v", err)
	}
	return len(ents)
}

// needIPv6Loopback skips a test where ::1 cannot be listened on.
func needIPv6Loopback(t testing.TB) {
	t.Helper()
	c, err := net.Listen("tcp6", "[::1]:0")
	if err != nil {
		skipOrFail(t, "no IPv6 loopback: %v", err)
	}
	c.Close()
}

// skipOrFail skips for a missing prerequisite, except under CI (CI=true),
// where every test must run: there it fails.
func skipOrFail(t testing.TB, format string, args ...any) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatalf(format, args...)
	}
	t.Skipf(format, args...)
}

// settle waits, bounded, until check passes; used for counts the runtime
// offers no event for (goroutines, fds).
func settle(t testing.TB, what string, check func() error) {
	t.Helper()
	settleWithin(t, 10*time.Second, what, check)
}

// settleWithin is settle with a bound of its own, for a check that must
// come true sooner than something else would make it.
func settleWithin(t testing.TB, bound time.Duration, what string, check func() error) {
	t.Helper()
	deadline := time.Now().Add(bound)
	for {
		err := check()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			n := runtime.Stack(buf, true)
			t.Fatalf("%s: %v\n%s", what, err, buf[:n])
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func isReset(err error) bool {
	return err != nil && (errors.Is(err, errReset) || strings.Contains(err.Error(), "connection reset"))
}

var errReset = errors.New("connection reset by peer")

func errorf(format string, args ...any) error { return fmt.Errorf(format, args...) }

// logBuffer collects klog's output for a test.
type logBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// lineWith returns the first line logged that contains s, or "".
func (l *logBuffer) lineWith(s string) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	for line := range strings.Lines(l.b.String()) {
		if strings.Contains(line, s) {
			return strings.TrimSpace(line)
		}
	}
	return ""
}

// captureLog sends klog's output, at verbosity v, to a buffer until the
// test ends. klog is global: tests that use it must not run in parallel.
func captureLog(t *testing.T, v string) *logBuffer {
	t.Helper()
	logs := &logBuffer{}
	var level klog.Level
	if err := level.Set(v); err != nil {
		t.Fatal(err)
	}
	klog.LogToStderr(false)
	klog.SetOutput(logs)
	t.Cleanup(func() {
		klog.Flush()
		_ = level.Set("0")
		klog.SetOutput(os.Stderr)
		klog.LogToStderr(true)
	})
	return logs
}

// withoutAcceptLoop readies ln, a listening socket a test made, to stand
// as a socket of service port name whose accept loop never ran: it counts
// it among p's listeners (close uncounts it), and returns the service
// port and an already closed done for the socket.
func withoutAcceptLoop(t *testing.T, p *Proxier, name state.ServicePortName, ln interface {
	syscall.Conn
	io.Closer
}) (*servicePort, chan struct{}) {
	t.Helper()
	if err := p.keepListenerConn(ln, func() { ln.Close() }); err != nil {
		t.Fatal(err)
	}
	p.mu.Lock()
	sp := p.services[name]
	p.mu.Unlock()
	done := make(chan struct{})
	close(done)
	return sp, done
}
