package proxyserver

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/state"
)

// TestHealthCheckAnswersByFamily: a dual-stack Service's health-check port
// answers a check with the local endpoints of the IP family the check came
// to, as kube-proxy's proxier of that family does: this node has an IPv4
// endpoint (and an IPv6 one that is not ready), the IPv6 one that is ready
// runs elsewhere, so an IPv4 check gets 200 and 1, an IPv6 check 503 and
// 0, both on the wildcard (one dual-stack socket, where an IPv4 check
// arrives IPv4-mapped) and on addresses of each family.
func TestHealthCheckAnswersByFamily(t *testing.T) {
	if len(hostFamilies()) < 2 {
		t.Skip("this host has IPv6 off")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := uint16(ln.Addr().(*net.TCPAddr).Port)
	ln.Close()
	ep := func(addr string, local, ready bool) state.Endpoint {
		return state.Endpoint{Addr: netip.MustParseAddrPort(addr), Local: local, Ready: ready}
	}
	local4, remote6, unready6 := ep("198.18.2.2:8080", true, true), ep("[fd5e:b1b5:2::2]:8080", false, true), ep("[fd5e:b1b5:2::3]:8080", true, false)
	snap := state.NewSnapshot([]state.ServicePort{{
		Name:                state.ServicePortName{Namespace: "ns", Name: "lb", Port: "http", Protocol: state.TCP},
		ClusterIPs:          []netip.Addr{netip.MustParseAddr("198.18.0.10"), netip.MustParseAddr("fd5e:b1b5::10")},
		ExternalLocal:       true,
		HealthCheckNodePort: port,
		ClusterEndpoints:    []state.Endpoint{local4, remote6},
		LocalEndpoints:      []state.Endpoint{local4, unready6},
	}})
	loopback := func() ([]netip.Addr, error) {
		return []netip.Addr{netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("::1")}, nil
	}
	for _, tc := range []struct {
		name string
		h    *healthChecks
	}{
		{"wildcard", &healthChecks{}},
		{"addresses", &healthChecks{nodePortAddresses: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("::1/128")}, localAddrs: loopback}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.h.sync(snap); err != nil {
				t.Fatal(err)
			}
			defer tc.h.closeAll()
			client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
			for _, c := range []struct {
				host   string
				code   int
				weight string
				body   string
			}{
				{"127.0.0.1", 200, "1", `{"service":{"namespace":"ns","name":"lb"},"localEndpoints":1,"serviceProxyHealthy":true}`},
				{"[::1]", 503, "0", `{"service":{"namespace":"ns","name":"lb"},"localEndpoints":0,"serviceProxyHealthy":true}`},
			} {
				resp, err := client.Get(fmt.Sprintf("http://%s:%d/", c.host, port))
				if err != nil {
					t.Fatalf("check over %s: %v", c.host, err)
				}
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != c.code || string(body) != c.body || resp.Header.Get("X-Load-Balancing-Endpoint-Weight") != c.weight ||
					resp.Header.Get("Content-Type") != "application/json" || resp.Header.Get("X-Content-Type-Options") != "nosniff" {
					t.Errorf("check over %s: %d %v %s; want %d, weight %s, %s", c.host, resp.StatusCode, resp.Header, body, c.code, c.weight, c.body)
				}
			}
		})
	}
}

// TestHealthCheckPortsAreCountedListeners: health-check node ports are
// counted with the data plane's listening sockets: one refused is
// reported (and not served), served at a later sync once there is room,
// and closing it gives its place back. They took descriptors past every
// ceiling.
func TestHealthCheckPortsAreCountedListeners(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := uint16(ln.Addr().(*net.TCPAddr).Port)
	ln.Close()
	room, held := 0, 0
	refused := errors.New("too many listening sockets")
	h := &healthChecks{
		nodePortAddresses: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")},
		localAddrs:        func() ([]netip.Addr, error) { return []netip.Addr{netip.MustParseAddr("127.0.0.1")}, nil },
		countListener: func(ln net.Listener) (net.Listener, error) {
			if held >= room {
				ln.Close()
				return nil, refused
			}
			held++
			return countedForTest{ln, &held}, nil
		},
	}
	defer h.closeAll()
	snap := state.NewSnapshot([]state.ServicePort{{
		Name:                state.ServicePortName{Namespace: "ns", Name: "lb", Port: "http", Protocol: state.TCP},
		ExternalLocal:       true,
		HealthCheckNodePort: port,
		LocalEndpoints:      []state.Endpoint{{Addr: netip.MustParseAddrPort("127.0.0.1:8080"), Local: true, Ready: true}},
	}})
	url := fmt.Sprintf("http://127.0.0.1:%d/", port)
	if err := h.sync(snap); !errors.Is(err, refused) {
		t.Fatalf("sync with no room: %v, want %v", err, refused)
	}
	if _, err := http.Get(url); err == nil {
		t.Fatal("a refused health-check port answers")
	}
	room = 10 // 127.0.0.1, and the IPv6 wildcard where the host has IPv6
	if err := h.sync(snap); err != nil {
		t.Fatal(err)
	}
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || held == 0 {
		t.Fatalf("%s, %d counted", resp.Status, held)
	}
	if err := h.sync(state.NewSnapshot(nil)); err != nil {
		t.Fatal(err)
	}
	if held != 0 {
		t.Fatalf("%d counted once the port is closed", held)
	}
}

type countedForTest struct {
	net.Listener
	held *int
}

func (l countedForTest) Close() error { *l.held--; return l.Listener.Close() }

// emfileListener fails its first n accepts with EMFILE.
type emfileListener struct {
	net.Listener
	n atomic.Int32
}

func (l *emfileListener) Accept() (net.Conn, error) {
	if l.n.Add(-1) >= 0 {
		return nil, &net.OpError{Op: "accept", Net: "tcp", Err: os.NewSyscallError("accept4", syscall.EMFILE)}
	}
	return l.Listener.Accept()
}

// TestHealthCheckAcceptQuietAtEMFILE: a health-check port out of
// descriptors waits and accepts again without handing the error to its
// HTTP server (which logged it every second, for every port), and a close
// ends the wait.
func TestHealthCheckAcceptQuietAtEMFILE(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	el := &emfileListener{Listener: ln}
	el.n.Store(3)
	q := newQuietListener(el, "test", nil)
	defer q.Close()
	go func() {
		if c, err := net.Dial("tcp", ln.Addr().String()); err == nil {
			defer c.Close()
			time.Sleep(2 * time.Second)
		}
	}()
	c, err := q.Accept()
	if err != nil {
		t.Fatalf("Accept after EMFILE: %v", err)
	}
	c.Close()

	el.n.Store(1 << 30)
	done := make(chan error, 1)
	go func() { _, err := q.Accept(); done <- err }()
	time.Sleep(3 * emfileRetry)
	q.Close()
	select {
	case err := <-done:
		if !errors.Is(err, net.ErrClosed) {
			t.Fatalf("Accept after Close: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Close does not end an Accept waiting out EMFILE")
	}
}
