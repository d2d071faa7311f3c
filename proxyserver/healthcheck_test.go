package proxyserver

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
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
