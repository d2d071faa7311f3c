package proxyserver

import (
	"context"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/state"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/userspace"
)

// metrics are what /metrics serves: kube-proxy's core sync metrics, under
// their names, so its dashboards and alerts apply, and the data plane's
// counters under kube_userspace_proxy_.
type metrics struct {
	reg   *prometheus.Registry
	debug http.Handler // /debug/services; may be nil

	syncDuration  prometheus.Histogram
	lastSynced    prometheus.Gauge
	lastQueued    prometheus.Gauge
	healthzAnswer *prometheus.CounterVec
	livezAnswer   *prometheus.CounterVec
	noLocal       *prometheus.GaugeVec
	syncFailures  *prometheus.CounterVec
	programming   prometheus.Histogram
}

// The causes of kube_userspace_proxy_sync_failures_total.
const (
	// failedPortal: the portal could not be written (iptables-restore,
	// the bind portal's addresses); the proxy is unhealthy while it lasts.
	failedPortal = "portal"
	// failedServices: some Service could not be served (a node port
	// another program holds, no free proxy port); the others are.
	failedServices = "services"
)

func newMetrics(stats *userspace.Stats) *metrics {
	m := &metrics{
		reg: prometheus.NewRegistry(),
		syncDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: "kubeproxy", Subsystem: "sync_proxy_rules", Name: "duration_seconds",
			Help:    "How long a sync took: listeners, portal rules and health-check ports.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 15),
		}),
		lastSynced: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "kubeproxy", Subsystem: "sync_proxy_rules", Name: "last_timestamp_seconds",
			Help: "When the last sync that applied every change offered ended (Unix time).",
		}),
		lastQueued: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "kubeproxy", Subsystem: "sync_proxy_rules", Name: "last_queued_timestamp_seconds",
			Help: "When the last change was offered to the sync loop (Unix time); far past last_timestamp_seconds means the proxy is not keeping up.",
		}),
		healthzAnswer: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "kubeproxy", Subsystem: "proxy", Name: "healthz_total",
			Help: "/healthz answers, by HTTP status.",
		}, []string{"code"}),
		livezAnswer: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "kubeproxy", Subsystem: "proxy", Name: "livez_total",
			Help: "/livez answers, by HTTP status.",
		}, []string{"code"}),
		noLocal: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "kubeproxy", Subsystem: "sync_proxy_rules", Name: "no_local_endpoints_total",
			Help: "Service ports whose traffic policy (internal or external) is Local and that have endpoints on other nodes but none on this one, at the last sync.",
		}, []string{"traffic_policy"}),
		programming: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: "kubeproxy", Name: "network_programming_duration_seconds",
			Help: "From an EndpointSlice change (its endpoints.kubernetes.io/last-change-trigger-time) to the end of the sync that applied it.",
			// kube-proxy's buckets: 0.25 s to 5 min.
			Buckets: slices.Concat(prometheus.LinearBuckets(0.25, 0.25, 2), prometheus.LinearBuckets(1, 1, 59),
				prometheus.LinearBuckets(60, 5, 12), prometheus.LinearBuckets(120, 30, 7)),
		}),
		syncFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "kube_userspace_proxy", Name: "sync_failures_total",
			Help: "Syncs that failed and are retried, by cause: portal (the kernel's rules or addresses; the proxy turns unhealthy) or services (some Service could not be served).",
		}, []string{"cause"}),
	}
	for _, c := range []string{failedPortal, failedServices} {
		m.syncFailures.WithLabelValues(c)
	}
	for _, p := range []string{"internal", "external"} {
		m.noLocal.WithLabelValues(p)
	}
	m.reg.MustRegister(m.syncDuration, m.lastSynced, m.lastQueued, m.healthzAnswer, m.livezAnswer, m.noLocal, m.syncFailures, m.programming,
		statsCollector{stats},
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// synced records a sync of snap that took took; failed is the cause of
// its failure, or "" when it succeeded; applied says whether it applied
// everything health counts (see syncLoop.run).
func (m *metrics) synced(snap state.Snapshot, took time.Duration, applied bool, failed string) {
	m.syncDuration.Observe(took.Seconds())
	if applied {
		m.lastSynced.SetToCurrentTime()
	}
	if failed != "" {
		m.syncFailures.WithLabelValues(failed).Inc()
	}
	// As kube-proxy counts them: a Local policy without a local endpoint
	// while other nodes have endpoints. A Service with none anywhere (scaled
	// to zero) is refused, and counts in neither.
	var internal, external int
	for sp := range snap.All {
		if len(sp.LocalEndpoints) == 0 && sp.HasEndpoints() {
			if sp.InternalLocal {
				internal++
			}
			if sp.ExternalLocal {
				external++
			}
		}
	}
	m.noLocal.WithLabelValues("internal").Set(float64(internal))
	m.noLocal.WithLabelValues("external").Set(float64(external))
}

// programmed records, at now, the network programming latency of changes
// triggered at triggers, which a sync has just applied. A trigger time
// after now (a controller whose clock runs ahead of this node's) is left
// out: a negative latency would drag every average down.
func (m *metrics) programmed(triggers []time.Time, now time.Time) {
	for _, t := range triggers {
		if d := now.Sub(t); d >= 0 {
			m.programming.Observe(d.Seconds())
		}
	}
}

// queued records a change offered to the sync loop.
func (m *metrics) queued() { m.lastQueued.SetToCurrentTime() }

// answered counts a /healthz (withNode) or /livez answer.
func (m *metrics) answered(withNode bool, code int) {
	v := m.livezAnswer
	if withNode {
		v = m.healthzAnswer
	}
	v.WithLabelValues(strconv.Itoa(code)).Inc()
}

// handler serves /metrics, and, as kube-proxy's metrics server does, a
// plain /healthz and /proxyMode; and /debug/services.
func (m *metrics) handler() http.Handler {
	mux := http.NewServeMux()
	if m.debug != nil {
		mux.Handle("/debug/services", m.debug)
	}
	mux.Handle("/metrics", promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) })
	mux.HandleFunc("/proxyMode", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("userspace")) })
	return mux
}

// serveMetrics serves m on addr until ctx is done, as serveHealth does.
func serveMetrics(ctx context.Context, addr string, m *metrics, retry time.Duration) {
	serveHTTP(ctx, "/metrics", "--metrics-bind-address", addr, m.handler(), retry)
}

// statsCollector reads the data plane's counters at each scrape.
type statsCollector struct{ stats *userspace.Stats }

type snap = userspace.StatsSnapshot

// statDesc is one series of the data plane's counters.
type statDesc struct {
	desc  *prometheus.Desc
	kind  prometheus.ValueType
	value func(s *snap) float64
}

// counter describes kube_userspace_proxy_<name>; label, if given, is a
// label name and its value ("direction", "to_client"), for series that
// share a name.
func counter(name, help string, value func(s *snap) uint64, label ...string) statDesc {
	var labels prometheus.Labels
	if len(label) == 2 {
		labels = prometheus.Labels{label[0]: label[1]}
	}
	return statDesc{prometheus.NewDesc("kube_userspace_proxy_"+name, help, nil, labels), prometheus.CounterValue,
		func(s *snap) float64 { return float64(value(s)) }}
}

// gauge describes kube_userspace_proxy_<name>.
func gauge(name, help string, value func(s *snap) int64) statDesc {
	return statDesc{prometheus.NewDesc("kube_userspace_proxy_"+name, help, nil, nil), prometheus.GaugeValue,
		func(s *snap) float64 { return float64(value(s)) }}
}

var statDescs = []statDesc{
	counter("tcp_connections_accepted_total", "TCP client connections accepted.", func(s *snap) uint64 { return s.TCPAccepted }),
	gauge("tcp_connections_active", "Proxied TCP connections open now.", func(s *snap) int64 { return s.TCPActive }),
	counter("tcp_no_endpoints_total", "TCP connections reset because the service port had no endpoints.", func(s *snap) uint64 { return s.TCPNoEndpoints }),
	counter("tcp_dial_failures_total", "Failed dials to TCP endpoints (each attempt).", func(s *snap) uint64 { return s.TCPDialFailures }),
	counter("tcp_dial_give_ups_total", "TCP connections reset after every dial attempt failed.", func(s *snap) uint64 { return s.TCPDialGiveUps }),
	counter("tcp_half_close_timeouts_total", "TCP connections ended because a half-closed side stayed silent too long.", func(s *snap) uint64 { return s.HalfCloseTimeouts }),
	counter("bytes_total", "Bytes proxied over TCP, by direction.", func(s *snap) uint64 { return s.BytesToBackend }, "direction", "to_endpoint"),
	counter("bytes_total", "Bytes proxied over TCP, by direction.", func(s *snap) uint64 { return s.BytesToClient }, "direction", "to_client"),
	counter("sctp_associations_accepted_total", "SCTP client associations accepted.", func(s *snap) uint64 { return s.SCTPAccepted }),
	gauge("sctp_associations_active", "Proxied SCTP association pairs open now.", func(s *snap) int64 { return s.SCTPActive }),
	counter("sctp_no_endpoints_total", "SCTP associations aborted because the service port had no endpoints.", func(s *snap) uint64 { return s.SCTPNoEndpoints }),
	counter("sctp_dial_failures_total", "Failed associations to SCTP endpoints (each attempt).", func(s *snap) uint64 { return s.SCTPDialFailures }),
	counter("sctp_dial_give_ups_total", "SCTP associations aborted after every attempt failed.", func(s *snap) uint64 { return s.SCTPDialGiveUps }),
	counter("udp_sessions_opened_total", "UDP sessions opened.", func(s *snap) uint64 { return s.UDPSessionsOpened }),
	gauge("udp_sessions_active", "UDP sessions open now.", func(s *snap) int64 { return s.UDPSessionsActive }),
	counter("udp_sessions_rejected_total", "UDP datagrams dropped because the service port was at --udp-max-sessions.", func(s *snap) uint64 { return s.UDPSessionsRejected }),
	counter("udp_no_endpoints_total", "UDP datagrams dropped because the service port had no endpoints.", func(s *snap) uint64 { return s.UDPNoEndpoints }),
	counter("udp_datagrams_total", "UDP datagrams proxied, by direction.", func(s *snap) uint64 { return s.UDPDatagramsIn }, "direction", "to_endpoint"),
	counter("udp_datagrams_total", "UDP datagrams proxied, by direction.", func(s *snap) uint64 { return s.UDPDatagramsOut }, "direction", "to_client"),
	counter("udp_dropped_total", "UDP datagrams dropped on a full socket buffer or a send error.", func(s *snap) uint64 { return s.UDPDropped }),
	counter("udp_refused_total", "UDP sessions ended because the endpoint refused (ICMP port unreachable).", func(s *snap) uint64 { return s.UDPRefused }),
	counter("shed_total", "Connections and sessions refused for lack of file descriptors or buffers.", func(s *snap) uint64 { return s.Shed }),
	counter("accept_errors_total", "Other accept errors.", func(s *snap) uint64 { return s.AcceptErrors }),
	counter("source_refused_total", "Connections reset and datagrams dropped by the proxy because their source is outside the Service's loadBalancerSourceRanges (bind portal, where no socket filter has the kernel drop them).", func(s *snap) uint64 { return s.SourceRefused }),
}

func (c statsCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range statDescs {
		ch <- d.desc
	}
}

func (c statsCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.stats.Snapshot()
	for _, d := range statDescs {
		ch <- prometheus.MustNewConstMetric(d.desc, d.kind, d.value(&s))
	}
}
