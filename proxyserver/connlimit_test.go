package proxyserver

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/state"
)

// kubeletProbeTimeout is a kubelet probe's default timeoutSeconds.
const kubeletProbeTimeout = time.Second

// waitFor polls cond until it holds, failing after within with what.
func waitFor(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("after %v: %s", within, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// startHealthz serves /healthz on a loopback port under its limits until
// the test ends; cc counts the connections the server holds.
func startHealthz(t *testing.T) (addr string, cc *connCounter) {
	t.Helper()
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cc = &connCounter{}
	addr = ln.Addr().String()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		serveHTTP(ctx, healthWhat, "--healthz-bind-address", addr, cc.wrap(ln), newProxyHealth(time.Minute), time.Hour)
	}()
	t.Cleanup(func() { cancel(); <-done })
	return addr, cc
}

// connCounter wraps listeners to count, on the server's side, the
// connections they accepted that are open, and the most open at once.
type connCounter struct {
	mu         sync.Mutex // guards the fields below
	open, peak int
}

func (cc *connCounter) wrap(ln net.Listener) net.Listener { return &countingListener{ln, cc} }

func (cc *connCounter) counts() (open, peak int) {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	return cc.open, cc.peak
}

type countingListener struct {
	net.Listener
	cc *connCounter
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	l.cc.mu.Lock()
	l.cc.open++
	l.cc.peak = max(l.cc.peak, l.cc.open)
	l.cc.mu.Unlock()
	return &countedConn{TCPConn: c.(*net.TCPConn), cc: l.cc}, nil
}

// countedConn is an accepted connection counted until it closes.
type countedConn struct {
	*net.TCPConn
	cc   *connCounter
	once sync.Once
}

func (c *countedConn) Close() error {
	c.once.Do(func() {
		c.cc.mu.Lock()
		c.cc.open--
		c.cc.mu.Unlock()
	})
	return c.TCPConn.Close()
}

// slowClients open n connections to addr from 127.0.0.1, each sending a
// request header that does not end, a line at a time (slowloris); with
// reopen, each one the server closes is opened again until the test ends.
type slowClients struct {
	addr   string
	path   string
	closed atomic.Int64 // connections the server closed
	wg     sync.WaitGroup
	stop   chan struct{}
}

func startSlowClients(t *testing.T, addr, path string, n int, reopen bool) *slowClients {
	t.Helper()
	s := &slowClients{addr: addr, path: path, stop: make(chan struct{})}
	t.Cleanup(func() {
		close(s.stop)
		s.wg.Wait()
	})
	for range n {
		c, err := s.dial()
		if err != nil {
			if !errors.Is(err, syscall.ECONNRESET) && !errors.Is(err, syscall.EPIPE) {
				t.Fatal(err)
			}
			// Closed at once, for another one's place: the server
			// accepts a port's connections as they come, and those of
			// two ports in either order.
			s.closed.Add(1)
		}
		s.wg.Go(func() {
			for {
				if c != nil {
					s.hold(c)
				}
				if !reopen {
					return
				}
				select {
				case <-s.stop:
					return
				default:
				}
				if c, err = s.dial(); err != nil {
					if !errors.Is(err, syscall.ECONNRESET) && !errors.Is(err, syscall.EPIPE) {
						return
					}
					s.closed.Add(1)
					c = nil
				}
			}
		})
	}
	return s
}

func (s *slowClients) dial() (net.Conn, error) {
	c, err := net.Dial("tcp", s.addr)
	if err != nil {
		return nil, err
	}
	if _, err := fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: x\r\n", s.path); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// hold keeps c until the server closes it (counted) or the test ends.
func (s *slowClients) hold(c net.Conn) {
	defer c.Close()
	held := make(chan struct{})
	defer close(held)
	go func() {
		select {
		case <-s.stop:
			c.Close()
		case <-held:
		}
	}()
	buf := make([]byte, 512)
	for {
		_ = c.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
		_, err := c.Read(buf)
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			if _, err := io.WriteString(c, "X-a: b\r\n"); err == nil {
				continue
			}
		}
		select {
		case <-s.stop:
		default:
			s.closed.Add(1)
		}
		return
	}
}

// probeClient is a kubelet's prober: a connection per probe, from the
// address from, giving up after the probe's timeout.
func probeClient(from string) *http.Client {
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}
	return &http.Client{Timeout: kubeletProbeTimeout, Transport: &http.Transport{DisableKeepAlives: true, DialContext: d.DialContext}}
}

// probe asks url as a kubelet would, and fails unless it is answered
// code within the probe's timeout.
func probe(t *testing.T, c *http.Client, url string, code int) {
	t.Helper()
	start := time.Now()
	resp, err := c.Get(url)
	if err != nil {
		t.Fatalf("probe %s: %v after %v", url, err, time.Since(start))
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != code {
		t.Fatalf("probe %s: %d, want %d", url, resp.StatusCode, code)
	}
}

// TestHealthzUnderSlowloris: /healthz holds at most healthLimits.maxConns
// connections (one more while it closes one), however many a client opens
// that send headers that never end, and answers a kubelet's probe within
// its 1 s timeout meanwhile: one from the slow client's own address after
// it opened its connections, and, while the slow client opens again every
// connection closed, ten from another address. What goes is the slow
// client's: a monitor at another address keeps its kept-alive connection,
// idle since before the slow client came. It held every connection
// until its ReadHeaderTimeout, which under RLIMIT_NOFILE took the data
// plane's descriptors (and made /healthz answer in 2 s).
func TestHealthzUnderSlowloris(t *testing.T) {
	addr, cc := startHealthz(t)

	// A monitor from another address keeps its connection alive.
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.2")}}
	monitor, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer monitor.Close()
	monitorAsks := func(when string) {
		t.Helper()
		_ = monitor.SetDeadline(time.Now().Add(kubeletProbeTimeout))
		if _, err := io.WriteString(monitor, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
			t.Fatalf("%s: kept-alive connection: %v", when, err)
		}
		resp, err := http.ReadResponse(bufio.NewReader(monitor), nil)
		if err != nil {
			t.Fatalf("%s: kept-alive connection: %v", when, err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: kept-alive connection: %d", when, resp.StatusCode)
		}
	}
	monitorAsks("before the slow client")

	limit := healthLimits.maxConns
	n := limit + 40
	slow := startSlowClients(t, addr, "/healthz", n, false)
	// Well before the 5 s ReadHeaderTimeout, which closed them all.
	waitFor(t, 3*time.Second, fmt.Sprintf("%d of %d slow connections closed, want %d (limit %d)", slow.closed.Load(), n, n-limit, limit),
		func() bool { return slow.closed.Load() >= int64(n-limit) })
	if open, peak := cc.counts(); open > limit || peak > limit+1 {
		t.Errorf("%d connections open, %d at most; want at most %d (and %d while one closes)", open, peak, limit, limit+1)
	}
	probe(t, probeClient("127.0.0.1"), "http://"+addr+"/healthz", http.StatusOK)
	// The slow client's own connections went, not the one the monitor
	// left idle longest ago.
	monitorAsks("after the slow client")

	// A slow client that opens again what is closed: a probe from
	// elsewhere closes one of its connections, never waits behind them.
	startSlowClients(t, addr, "/healthz", n, true)
	kubelet := probeClient("127.0.0.2")
	for range 10 {
		probe(t, kubelet, "http://"+addr+"/livez", http.StatusOK)
	}
	if _, peak := cc.counts(); peak > limit+1 {
		t.Errorf("%d connections open at most, want at most %d", peak, limit+1)
	}
}

// TestHealthzKeepsWellBehavedClients: under its limit, a kept-alive
// client of /healthz keeps its connection for request after request, as
// before the limit.
func TestHealthzKeepsWellBehavedClients(t *testing.T) {
	addr, cc := startHealthz(t)
	var clients []*http.Client
	for range healthLimits.maxConns {
		clients = append(clients, &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{}})
	}
	for round := range 3 {
		for _, c := range clients {
			probe(t, c, "http://"+addr+"/healthz", http.StatusOK)
		}
		if open, peak := cc.counts(); open != len(clients) || peak != len(clients) {
			t.Fatalf("round %d: %d connections open, %d at most; want each client's one, %d", round, open, peak, len(clients))
		}
	}
}

// TestMetricsServerWriteTimeout: a client that asks the metrics server
// for a large page (/debug/services runs to megabytes) and never reads it
// is cut off after the write timeout: the handler's writes fail, its
// goroutine ends, and the server closes the connection. They were held
// for ever.
func TestMetricsServerWriteTimeout(t *testing.T) {
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var cc connCounter
	addr := ln.Addr().String()
	const size = 32 << 20 // past the kernel's buffers (tcp_wmem's 4 MiB)
	var ended, whole atomic.Int64
	page := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		defer ended.Add(1)
		chunk := make([]byte, 64<<10)
		for n := 0; n < size; n += len(chunk) {
			if _, err := w.Write(chunk); err != nil {
				return
			}
		}
		whole.Add(1)
	})
	limits := metricsLimits
	limits.writeTimeout = 500 * time.Millisecond
	limits.maxConns = 8 // its bound at any RLIMIT_NOFILE from 256 up: room for the clients below
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		serveLimited(ctx, metricsWhat, "--metrics-bind-address", addr, cc.wrap(ln), page, time.Hour, limits)
	}()
	defer func() { cancel(); <-done }()

	const clients = 4
	for range clients {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		_ = c.(*net.TCPConn).SetReadBuffer(4096)
		if _, err := io.WriteString(c, "GET /debug/services HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, 10*time.Second, fmt.Sprintf("%d of %d answers to clients that do not read ended", ended.Load(), clients),
		func() bool { return ended.Load() == clients })
	if whole.Load() != 0 {
		t.Fatalf("%d clients that do not read were sent the whole page", whole.Load())
	}
	waitFor(t, 10*time.Second, "the server keeps the connections of clients that do not read",
		func() bool { open, _ := cc.counts(); return open == 0 })
}

// TestHealthCheckPortsBoundConnections: the health-check node ports hold
// at most healthCheckLimits.maxConns connections, every port's together
// (one more per port while it closes one),
// under a slowloris at each port, and answer a load balancer's check
// from another address at once meanwhile.
func TestHealthCheckPortsBoundConnections(t *testing.T) {
	var cc connCounter
	h := &healthChecks{
		nodePortAddresses: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")},
		localAddrs:        func() ([]netip.Addr, error) { return []netip.Addr{netip.MustParseAddr("127.0.0.1")}, nil },
		countListener:     func(ln net.Listener) (net.Listener, error) { return cc.wrap(ln), nil },
	}
	var ports []uint16
	var sps []state.ServicePort
	for i := range 2 {
		ln, err := net.Listen("tcp4", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port := uint16(ln.Addr().(*net.TCPAddr).Port)
		ln.Close()
		ports = append(ports, port)
		local := state.Endpoint{Addr: netip.AddrPortFrom(netip.AddrFrom4([4]byte{198, 18, 2, byte(i + 1)}), 8080), Local: true, Ready: true}
		sps = append(sps, state.ServicePort{
			Name:                state.ServicePortName{Namespace: "ns", Name: fmt.Sprintf("lb%d", i), Port: "http", Protocol: state.TCP},
			ClusterIPs:          []netip.Addr{netip.AddrFrom4([4]byte{198, 18, 0, byte(10 + i)})},
			ExternalLocal:       true,
			HealthCheckNodePort: port,
			ClusterEndpoints:    []state.Endpoint{local},
			LocalEndpoints:      []state.Endpoint{local},
		})
	}
	if err := h.sync(state.NewSnapshot(sps)); err != nil {
		t.Fatal(err)
	}
	defer h.closeAll()

	limit := healthCheckLimits.maxConns
	n := limit + 20
	var slow []*slowClients
	for _, port := range ports {
		slow = append(slow, startSlowClients(t, fmt.Sprintf("127.0.0.1:%d", port), "/", n, false))
	}
	closed := func() int64 { return slow[0].closed.Load() + slow[1].closed.Load() }
	waitFor(t, 3*time.Second, fmt.Sprintf("%d of %d slow connections closed, want %d (limit %d)", closed(), 2*n, 2*n-limit, limit),
		func() bool { return closed() >= int64(2*n-limit) })
	// Each port's server accepts its own: one more each while it closes
	// one.
	if open, peak := cc.counts(); open > limit || peak > limit+len(ports) {
		t.Errorf("%d connections open, %d at most; want at most %d (and %d while each port closes one)", open, peak, limit, limit+len(ports))
	}
	lb := probeClient("127.0.0.2")
	for _, port := range ports {
		probe(t, lb, fmt.Sprintf("http://127.0.0.1:%d/", port), http.StatusOK)
	}
}

// TestLimitsScaledToOpenFiles: under a RLIMIT_NOFILE below 256, where the
// data plane's reserve is a quarter of the limit, the servers' bounds
// shrink with it, all three together half the reserve, and never below
// minConns each; from 256 up (or with no limit known) they are as set.
// They were 12, 8 and 12 at any limit: 32, twice the reserve of 16 at 64.
func TestLimitsScaledToOpenFiles(t *testing.T) {
	for _, tc := range []struct {
		limit                    uint64
		health, metrics, hcPorts int
	}{
		{0, 12, 8, 12},
		{1 << 20, 12, 8, 12},
		{256, 12, 8, 12},
		{200, 9, 6, 9},
		{128, 6, 4, 6},
		{64, 3, 2, 3},
		{32, 2, 2, 2},
		{8, 2, 2, 2},
	} {
		t.Run(fmt.Sprint(tc.limit), func(t *testing.T) {
			base := func(n int) httpLimits { return httpLimits{maxConns: n, writeTimeout: time.Second} }
			h, m, hc := base(12).scaled(tc.limit), base(8).scaled(tc.limit), base(12).scaled(tc.limit)
			if h.maxConns != tc.health || m.maxConns != tc.metrics || hc.maxConns != tc.hcPorts {
				t.Errorf("bounds %d, %d, %d; want %d, %d, %d", h.maxConns, m.maxConns, hc.maxConns, tc.health, tc.metrics, tc.hcPorts)
			}
			if h.writeTimeout != time.Second {
				t.Errorf("the timeouts changed: %+v", h)
			}
			if reserve := min(dataPlaneReserve, int(tc.limit/4)); tc.limit != 0 && reserve/2 >= 3*minConns {
				if sum := h.maxConns + m.maxConns + hc.maxConns; sum > reserve/2 {
					t.Errorf("%d connections in all, over half the reserve of %d", sum, reserve)
				}
			}
		})
	}
	if got := (httpLimits{}).scaled(64); got.maxConns != 0 {
		t.Errorf("no bound became %d", got.maxConns)
	}
}

// TestRequestContextEndsAtTheWriteTimeout: a request's context ends when
// the server's write timeout does, while its client still waits: net/http
// ended it only when the client went away or the handler returned, so a
// handler that follows it worked on, for nobody.
func TestRequestContextEndsAtTheWriteTimeout(t *testing.T) {
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ended := make(chan time.Duration, 1)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		select {
		case <-r.Context().Done():
			ended <- time.Since(start)
		case <-time.After(10 * time.Second):
			ended <- -1
		}
	})
	limits := metricsLimits
	limits.writeTimeout = 300 * time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		serveLimited(ctx, metricsWhat, "--metrics-bind-address", ln.Addr().String(), ln, h, time.Hour, limits)
	}()
	defer func() { cancel(); <-done }()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := io.WriteString(c, "GET /debug/services HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	if d := <-ended; d < 0 || d > 5*time.Second {
		t.Fatalf("the request's context ended after %v (-1: not in 10 s), want at the write timeout, %v", d, limits.writeTimeout)
	}
}
