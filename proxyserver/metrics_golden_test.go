package proxyserver

import (
	"fmt"
	"io"
	"net"
	"net/netip"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/state"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/userspace"
)

// registeredSeries gathers m's registry and returns each series the proxy
// registers as name{label="value",...}, labels sorted, leaving out the Go
// runtime's and the process's (go_, process_), which the client library
// owns; kubernetes_build_info's labels are named without their values,
// which are the build's, and so are the API client's (rest_client_),
// whose values are the requests' (the API server's address).
func registeredSeries(t *testing.T, m *metrics) []string {
	t.Helper()
	families, err := m.reg.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	var out []string
	for _, f := range families {
		name := f.GetName()
		if strings.HasPrefix(name, "go_") || strings.HasPrefix(name, "process_") {
			continue
		}
		for _, mt := range f.GetMetric() {
			var labels []string
			for _, l := range mt.GetLabel() {
				if name == "kubernetes_build_info" || strings.HasPrefix(name, "rest_client_") {
					labels = append(labels, l.GetName())
				} else {
					labels = append(labels, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
				}
			}
			slices.Sort(labels)
			if len(labels) > 0 {
				name += "{" + strings.Join(labels, ",") + "}"
			}
			out = append(out, name)
			name = f.GetName()
		}
	}
	slices.Sort(out)
	return out
}

// TestMetricsNamesAndLabels: the series the proxy registers, by name and
// labels, are those its dashboards and alerts know: kube-proxy's sync
// metrics under their names, per IP family, and the data plane's counters
// under kube_userspace_proxy_. A renamed counter, a label gone or a new
// series has to change this list too.
func TestMetricsNamesAndLabels(t *testing.T) {
	var stats userspace.Stats
	m := newMetrics(&stats, []string{"IPv4", "IPv6"})
	// The health answers have series once there is an answer.
	m.answered(true, 200)
	m.answered(false, 503)
	want := []string{
		"kube_userspace_proxy_accept_errors_total",
		"kube_userspace_proxy_bytes_total{direction=\"to_client\",protocol=\"sctp\"}",
		"kube_userspace_proxy_bytes_total{direction=\"to_client\",protocol=\"tcp\"}",
		"kube_userspace_proxy_bytes_total{direction=\"to_client\",protocol=\"udp\"}",
		"kube_userspace_proxy_bytes_total{direction=\"to_endpoint\",protocol=\"sctp\"}",
		"kube_userspace_proxy_bytes_total{direction=\"to_endpoint\",protocol=\"tcp\"}",
		"kube_userspace_proxy_bytes_total{direction=\"to_endpoint\",protocol=\"udp\"}",
		"kube_userspace_proxy_sctp_associations_accepted_total",
		"kube_userspace_proxy_sctp_associations_active",
		"kube_userspace_proxy_sctp_dial_failures_total",
		"kube_userspace_proxy_sctp_dial_give_ups_total",
		"kube_userspace_proxy_sctp_no_endpoints_total",
		"kube_userspace_proxy_shed_total",
		"kube_userspace_proxy_source_refused_total",
		"kube_userspace_proxy_sync_failures_total{cause=\"portal\"}",
		"kube_userspace_proxy_sync_failures_total{cause=\"services\"}",
		"kube_userspace_proxy_tcp_connections_accepted_total",
		"kube_userspace_proxy_tcp_connections_active",
		"kube_userspace_proxy_tcp_dial_failures_total",
		"kube_userspace_proxy_tcp_dial_give_ups_total",
		"kube_userspace_proxy_tcp_half_close_timeouts_total",
		"kube_userspace_proxy_tcp_no_endpoints_total",
		"kube_userspace_proxy_udp_datagrams_total{direction=\"to_client\"}",
		"kube_userspace_proxy_udp_datagrams_total{direction=\"to_endpoint\"}",
		"kube_userspace_proxy_udp_dropped_total",
		"kube_userspace_proxy_udp_no_endpoints_total",
		"kube_userspace_proxy_udp_refused_total",
		"kube_userspace_proxy_udp_sessions_active",
		"kube_userspace_proxy_udp_sessions_opened_total",
		"kube_userspace_proxy_udp_sessions_rejected_total",
		"kubeproxy_network_programming_duration_seconds{ip_family=\"IPv4\"}",
		"kubeproxy_network_programming_duration_seconds{ip_family=\"IPv6\"}",
		"kubeproxy_proxy_healthz_total{code=\"200\"}",
		"kubeproxy_proxy_livez_total{code=\"503\"}",
		"kubeproxy_sync_proxy_rules_duration_seconds{ip_family=\"IPv4\"}",
		"kubeproxy_sync_proxy_rules_duration_seconds{ip_family=\"IPv6\"}",
		"kubeproxy_sync_proxy_rules_endpoint_changes_pending",
		"kubeproxy_sync_proxy_rules_endpoint_changes_total",
		"kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds{ip_family=\"IPv4\"}",
		"kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds{ip_family=\"IPv6\"}",
		"kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family=\"IPv4\"}",
		"kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family=\"IPv6\"}",
		"kubeproxy_sync_proxy_rules_no_local_endpoints_total{ip_family=\"IPv4\",traffic_policy=\"external\"}",
		"kubeproxy_sync_proxy_rules_no_local_endpoints_total{ip_family=\"IPv4\",traffic_policy=\"internal\"}",
		"kubeproxy_sync_proxy_rules_no_local_endpoints_total{ip_family=\"IPv6\",traffic_policy=\"external\"}",
		"kubeproxy_sync_proxy_rules_no_local_endpoints_total{ip_family=\"IPv6\",traffic_policy=\"internal\"}",
		"kubeproxy_sync_proxy_rules_service_changes_pending",
		"kubeproxy_sync_proxy_rules_service_changes_total",
		"kubernetes_build_info{build_date,compiler,git_commit,git_tree_state,git_version,go_version,major,minor,platform}",
	}
	// The API client's series are the process's, shared by every
	// registry: they are there once a request has been made (in this
	// package's tests or not), with these labels.
	apiClient := []string{
		"rest_client_rate_limiter_duration_seconds{host,verb}",
		"rest_client_request_duration_seconds{host,verb}",
		"rest_client_request_retries_total{code,host,verb}",
		"rest_client_requests_total{code,host,method}",
	}
	got := registeredSeries(t, m)
	for _, s := range got {
		if !slices.Contains(want, s) && !slices.Contains(apiClient, s) {
			t.Errorf("registered, not in the list: %s", s)
		}
	}
	for _, s := range want {
		if !slices.Contains(got, s) {
			t.Errorf("in the list, not registered: %s", s)
		}
	}
}

// TestMetricsReadTheirCounters: each data-plane series reads its own
// counter of userspace.Stats, the directions of bytes_total and
// udp_datagrams_total included: every counter is given a value of its
// own, and each series must show it.
func TestMetricsReadTheirCounters(t *testing.T) {
	var stats userspace.Stats
	want := map[string]string{}
	v := reflect.ValueOf(&stats).Elem()
	for i := range v.NumField() {
		n := uint64(1000 + i)
		switch c := v.Field(i).Addr().Interface().(type) {
		case *atomic.Uint64:
			c.Store(n)
		case *atomic.Int64:
			c.Store(int64(n))
		default:
			continue
		}
		want[v.Type().Field(i).Name] = strconv.FormatUint(n, 10)
	}
	m := newMetrics(&stats, []string{"IPv4"})
	got := scrapeMetrics(t, m)
	const p = "kube_userspace_proxy_"
	for series, field := range map[string]string{
		p + "tcp_connections_accepted_total":                       "TCPAccepted",
		p + "tcp_connections_active":                               "TCPActive",
		p + "tcp_no_endpoints_total":                               "TCPNoEndpoints",
		p + "tcp_dial_failures_total":                              "TCPDialFailures",
		p + "tcp_dial_give_ups_total":                              "TCPDialGiveUps",
		p + "tcp_half_close_timeouts_total":                        "HalfCloseTimeouts",
		p + `bytes_total{direction="to_endpoint",protocol="tcp"}`:  "BytesToBackend",
		p + `bytes_total{direction="to_client",protocol="tcp"}`:    "BytesToClient",
		p + `bytes_total{direction="to_endpoint",protocol="udp"}`:  "UDPBytesIn",
		p + `bytes_total{direction="to_client",protocol="udp"}`:    "UDPBytesOut",
		p + `bytes_total{direction="to_endpoint",protocol="sctp"}`: "SCTPBytesIn",
		p + `bytes_total{direction="to_client",protocol="sctp"}`:   "SCTPBytesOut",
		p + "sctp_associations_accepted_total":                     "SCTPAccepted",
		p + "sctp_associations_active":                             "SCTPActive",
		p + "sctp_no_endpoints_total":                              "SCTPNoEndpoints",
		p + "sctp_dial_failures_total":                             "SCTPDialFailures",
		p + "sctp_dial_give_ups_total":                             "SCTPDialGiveUps",
		p + "udp_sessions_opened_total":                            "UDPSessionsOpened",
		p + "udp_sessions_active":                                  "UDPSessionsActive",
		p + "udp_sessions_rejected_total":                          "UDPSessionsRejected",
		p + "udp_no_endpoints_total":                               "UDPNoEndpoints",
		p + `udp_datagrams_total{direction="to_endpoint"}`:         "UDPDatagramsIn",
		p + `udp_datagrams_total{direction="to_client"}`:           "UDPDatagramsOut",
		p + "udp_dropped_total":                                    "UDPDropped",
		p + "udp_refused_total":                                    "UDPRefused",
		p + "shed_total":                                           "Shed",
		p + "accept_errors_total":                                  "AcceptErrors",
		p + "source_refused_total":                                 "SourceRefused",
	} {
		w, ok := want[field]
		if !ok {
			t.Fatalf("userspace.Stats has no counter %s", field)
		}
		delete(want, field)
		if got[series] != w {
			t.Errorf("%s = %q, want %s, the value of Stats.%s", series, got[series], w, field)
		}
	}
	for field := range want {
		t.Errorf("Stats.%s is in no series this test knows", field)
	}
}

// TestTCPBytesByDirection: a proxied TCP connection that carries 3,000
// bytes to its endpoint and 70,000 back counts exactly those in
// bytes_total's to_endpoint and to_client series.
func TestTCPBytesByDirection(t *testing.T) {
	const up, down = 3000, 70000
	backend, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer backend.Close()
	served := make(chan error, 1)
	go func() {
		c, err := backend.Accept()
		if err != nil {
			served <- err
			return
		}
		defer c.Close()
		n, err := io.Copy(io.Discard, c) // until the client's half-close
		if err == nil && n != up {
			err = fmt.Errorf("the endpoint read %d bytes, want %d", n, up)
		}
		if err == nil {
			_, err = c.Write(make([]byte, down))
		}
		served <- err
	}()

	p := userspace.New(userspace.Config{BindAddress: netip.MustParseAddr("127.0.0.1")})
	defer p.Close()
	ep := state.Endpoint{Addr: netip.MustParseAddrPort(backend.Addr().String()), Ready: true, Serving: true}
	name := state.ServicePortName{Namespace: "ns", Name: "bytes", Port: "p", Protocol: state.TCP}
	if err := p.Apply(state.NewSnapshot([]state.ServicePort{{Name: name, Port: 80, ClusterEndpoints: []state.Endpoint{ep}}})); err != nil {
		t.Fatal(err)
	}
	m := newMetrics(p.Stats(), []string{"IPv4"})

	c, err := net.DialTimeout("tcp4", fmt.Sprintf("127.0.0.1:%d", p.ProxyPort(name)), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Write(make([]byte, up)); err != nil {
		t.Fatal(err)
	}
	if err := c.(*net.TCPConn).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	n, err := io.Copy(io.Discard, c)
	if err != nil || n != down {
		t.Fatalf("the client read %d bytes (%v), want %d", n, err, down)
	}
	select {
	case err := <-served:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the endpoint did not finish within 10s")
	}
	c.Close()

	// The proxy counts what it sent as it sends it: the connection has
	// ended once tcp_connections_active is 0.
	const (
		toEndpoint = `kube_userspace_proxy_bytes_total{direction="to_endpoint",protocol="tcp"}`
		toClient   = `kube_userspace_proxy_bytes_total{direction="to_client",protocol="tcp"}`
	)
	var got map[string]string
	for deadline := time.After(10 * time.Second); ; {
		got = scrapeMetrics(t, m)
		if got["kube_userspace_proxy_tcp_connections_active"] == "0" {
			break
		}
		select {
		case <-deadline:
			t.Fatalf("the proxied connection had not ended 10s after both sides closed: %s active", got["kube_userspace_proxy_tcp_connections_active"])
		case <-time.After(5 * time.Millisecond):
		}
	}
	if got[toEndpoint] != strconv.Itoa(up) || got[toClient] != strconv.Itoa(down) {
		t.Errorf("%s = %s and %s = %s, want %d and %d", toEndpoint, got[toEndpoint], toClient, got[toClient], up, down)
	}
}
