package proxyserver

import (
	"context"
	"net"
	"net/http"
	"net/netip"
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
// their names and labels, so its dashboards and alerts apply, and the data
// plane's counters under kube_userspace_proxy_.
//
// kube-proxy runs a proxier per IP family, and since 1.33 its sync metrics
// have an ip_family label, a series per family. One sync serves every
// family here, so each family's series of the sync metrics has the same
// values; no_local_endpoints_total alone differs by family.
type metrics struct {
	reg   *prometheus.Registry
	debug http.Handler // /debug/services; may be nil
	// configz is /configz's answer (Config.configzBody); nil: no /configz.
	configz []byte
	// families are the IP families the sync metrics have series for:
	// those /healthz's status names (proxyHealth.families).
	families []string

	syncDuration  *prometheus.HistogramVec // by ip_family
	lastSynced    *prometheus.GaugeVec     // by ip_family
	lastQueued    *prometheus.GaugeVec     // by ip_family
	healthzAnswer *prometheus.CounterVec
	livezAnswer   *prometheus.CounterVec
	noLocal       *prometheus.GaugeVec // by ip_family and traffic_policy
	syncFailures  *prometheus.CounterVec
	programming   *prometheus.HistogramVec // by ip_family
	// The change counts have no ip_family, as kube-proxy's have none
	// (1.36): one series, whatever the families.
	serviceChanges  prometheus.Counter
	servicePending  prometheus.Gauge
	endpointChanges prometheus.Counter
	endpointPending prometheus.Gauge
}

// ipFamilyLabel is kube-proxy's label for the IP family of a series,
// "IPv4" or "IPv6".
const ipFamilyLabel = "ip_family"

// The causes of kube_userspace_proxy_sync_failures_total.
const (
	// failedPortal: the portal could not be written (iptables-restore,
	// the bind portal's addresses); the proxy is unhealthy while it lasts.
	failedPortal = "portal"
	// failedServices: some Service could not be served (a node port
	// another program holds, no free proxy port); the others are.
	failedServices = "services"
)

// newMetrics returns the metrics of a proxy that serves the IP families
// families ("IPv4", "IPv6"), with the data plane's counters read from
// stats.
func newMetrics(stats *userspace.Stats, families []string) *metrics {
	m := &metrics{
		reg:      prometheus.NewRegistry(),
		families: families,
		syncDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "kubeproxy", Subsystem: "sync_proxy_rules", Name: "duration_seconds",
			Help:    "How long a sync took: listeners, portal rules and health-check ports (a pass that leaves the portal rules to --iptables-min-sync-period is not one). One sync serves every IP family, and is observed in each.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 15),
		}, []string{ipFamilyLabel}),
		lastSynced: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "kubeproxy", Subsystem: "sync_proxy_rules", Name: "last_timestamp_seconds",
			Help: "When the last sync that applied every change offered ended (Unix time); the same in every IP family, which one sync serves.",
		}, []string{ipFamilyLabel}),
		lastQueued: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "kubeproxy", Subsystem: "sync_proxy_rules", Name: "last_queued_timestamp_seconds",
			Help: "When the last change was offered to the sync loop (Unix time), the same in every IP family; far past last_timestamp_seconds means the proxy is not keeping up.",
		}, []string{ipFamilyLabel}),
		// As kube-proxy's: one answer per request, by code alone. Its
		// /healthz answers for every family at once, so a series per
		// family would count each answer twice.
		healthzAnswer: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "kubeproxy", Subsystem: "proxy", Name: "healthz_total",
			Help: "/healthz answers, by HTTP status; one per request, for every IP family at once.",
		}, []string{"code"}),
		livezAnswer: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "kubeproxy", Subsystem: "proxy", Name: "livez_total",
			Help: "/livez answers, by HTTP status; one per request, for every IP family at once.",
		}, []string{"code"}),
		noLocal: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "kubeproxy", Subsystem: "sync_proxy_rules", Name: "no_local_endpoints_total",
			Help: "Service ports served in the IP family whose traffic policy (internal or external) is Local and that have endpoints of that family on other nodes but none on this one, at the last sync.",
		}, []string{ipFamilyLabel, "traffic_policy"}),
		programming: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "kubeproxy", Name: "network_programming_duration_seconds",
			Help: "From an EndpointSlice change (its endpoints.kubernetes.io/last-change-trigger-time) to the end of the sync that applied it. One sync serves every IP family, and each change is observed in each.",
			// kube-proxy's buckets: 0.25 s to 5 min.
			Buckets: slices.Concat(prometheus.LinearBuckets(0.25, 0.25, 2), prometheus.LinearBuckets(1, 1, 59),
				prometheus.LinearBuckets(60, 5, 12), prometheus.LinearBuckets(120, 30, 7)),
		}, []string{ipFamilyLabel}),
		serviceChanges: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "kubeproxy", Subsystem: "sync_proxy_rules", Name: "service_changes_total",
			Help: "Service changes: each Service whose Service changed what is served (its ports, frontends, node ports, affinity or traffic policies), counted once in each new desired state offered to the sync loop; every Service served counts at start.",
		}),
		servicePending: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "kubeproxy", Subsystem: "sync_proxy_rules", Name: "service_changes_pending",
			Help: "Services whose Service changed what is served and that no sync has applied yet.",
		}),
		endpointChanges: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "kubeproxy", Subsystem: "sync_proxy_rules", Name: "endpoint_changes_total",
			Help: "Endpoint changes: each Service whose endpoints (EndpointSlices) changed what is served, counted once in each new desired state offered to the sync loop; every Service with endpoints counts at start.",
		}),
		endpointPending: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "kubeproxy", Subsystem: "sync_proxy_rules", Name: "endpoint_changes_pending",
			Help: "Services whose endpoints changed what is served and that no sync has applied yet.",
		}),
		syncFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "kube_userspace_proxy", Name: "sync_failures_total",
			Help: "Syncs that failed and are retried, by cause: portal (the kernel's rules or addresses; the proxy turns unhealthy) or services (some Service could not be served).",
		}, []string{"cause"}),
	}
	for _, c := range []string{failedPortal, failedServices} {
		m.syncFailures.WithLabelValues(c)
	}
	// Every family's series exist from the start, as a plain metric's
	// would, at zero.
	for _, f := range families {
		m.syncDuration.WithLabelValues(f)
		m.lastSynced.WithLabelValues(f)
		m.lastQueued.WithLabelValues(f)
		m.programming.WithLabelValues(f)
		for _, p := range []string{"internal", "external"} {
			m.noLocal.WithLabelValues(f, p)
		}
	}
	m.reg.MustRegister(m.syncDuration, m.lastSynced, m.lastQueued, m.healthzAnswer, m.livezAnswer, m.noLocal, m.syncFailures, m.programming,
		m.serviceChanges, m.servicePending, m.endpointChanges, m.endpointPending,
		statsCollector{stats}, buildInfoCollector(),
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m.reg.MustRegister(clientCollectors()...)
	return m
}

// synced records a sync of snap that took took; failed is the cause of
// its failure, or "" when it succeeded; applied says whether it applied
// everything health counts (see syncLoop.run).
func (m *metrics) synced(snap state.Snapshot, took time.Duration, applied, whole bool, failed string) {
	now := unixSeconds(time.Now())
	for _, f := range m.families {
		if whole {
			m.syncDuration.WithLabelValues(f).Observe(took.Seconds())
		}
		if applied {
			m.lastSynced.WithLabelValues(f).Set(now)
		}
		internal, external := noLocalEndpoints(snap, state.IPFamily(f))
		m.noLocal.WithLabelValues(f, "internal").Set(float64(internal))
		m.noLocal.WithLabelValues(f, "external").Set(float64(external))
	}
	if failed != "" {
		m.syncFailures.WithLabelValues(failed).Inc()
	}
}

// noLocalEndpoints counts the service ports of snap served in family fam
// whose internal (external) traffic policy is Local and that have no local
// endpoint of fam while other nodes have some, as kube-proxy's proxier of
// fam counts them: it sees only fam's endpoints, as fam's clients here do
// (a dual-stack Service's IPv4 clients go to its IPv4 endpoints). A port
// with no endpoint of fam anywhere (scaled to zero) refuses fam's clients,
// and counts in neither.
func noLocalEndpoints(snap state.Snapshot, fam state.IPFamily) (internal, external int) {
	for sp := range snap.All {
		if has4, has6 := sp.Families(); !(fam == state.IPv4 && has4 || fam == state.IPv6 && has6) {
			continue
		}
		if slices.ContainsFunc(sp.LocalEndpoints, func(ep state.Endpoint) bool { return familyOf(ep.Addr.Addr()) == fam }) ||
			!slices.ContainsFunc(sp.ClusterEndpoints, func(ep state.Endpoint) bool { return familyOf(ep.Addr.Addr()) == fam }) {
			continue
		}
		if sp.InternalLocal {
			internal++
		}
		if sp.ExternalLocal {
			external++
		}
	}
	return internal, external
}

// familyOf is a's IP family; an IPv4-mapped IPv6 address is IPv4.
func familyOf(a netip.Addr) state.IPFamily {
	if a.Unmap().Is4() {
		return state.IPv4
	}
	return state.IPv6
}

// unixSeconds is t as the Unix time in seconds that timestamp gauges hold.
func unixSeconds(t time.Time) float64 { return float64(t.UnixNano()) / 1e9 }

// programmed records, at now, the network programming latency of the
// changes triggers, which a sync has just applied, each in its own IP
// family, as kube-proxy's proxier of that family does; a family the proxy
// does not serve has no proxier to observe it. A trigger time after now (a
// controller whose clock runs ahead of this node's) is left out: a
// negative latency would drag every average down.
func (m *metrics) programmed(triggers []state.ChangeTrigger, now time.Time) {
	for _, t := range triggers {
		f := string(t.Family)
		if d := now.Sub(t.At); d >= 0 && slices.Contains(m.families, f) {
			m.programming.WithLabelValues(f).Observe(d.Seconds())
		}
	}
}

// queued records a new desired state offered to the sync loop, which
// brings the changes c.
func (m *metrics) queued(c state.Changes) {
	now := unixSeconds(time.Now())
	for _, f := range m.families {
		m.lastQueued.WithLabelValues(f).Set(now)
	}
	m.serviceChanges.Add(float64(len(c.Services)))
	m.endpointChanges.Add(float64(len(c.Endpoints)))
}

// pending records how many Services have a Service change (services) and
// an endpoint change (endpoints) that no sync has applied yet.
func (m *metrics) pending(services, endpoints int) {
	m.servicePending.Set(float64(services))
	m.endpointPending.Set(float64(endpoints))
}

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
	if m.configz != nil {
		mux.HandleFunc("/configz", func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write(m.configz)
		})
	}
	mux.HandleFunc("/proxyMode", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("userspace")) })
	return mux
}

// serveMetrics serves m on addr until ctx is done, as serveHealth does.
func serveMetrics(ctx context.Context, where, addr string, ln net.Listener, m *metrics, retry time.Duration) {
	serveHTTP(ctx, metricsWhat, where, addr, ln, m.handler(), retry)
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

// counter describes kube_userspace_proxy_<name>; labels, if given, are
// label names each followed by its value ("direction", "to_client"), for
// series that share a name.
func counter(name, help string, value func(s *snap) uint64, labels ...string) statDesc {
	var constLabels prometheus.Labels
	for i := 0; i+1 < len(labels); i += 2 {
		if constLabels == nil {
			constLabels = prometheus.Labels{}
		}
		constLabels[labels[i]] = labels[i+1]
	}
	return statDesc{prometheus.NewDesc("kube_userspace_proxy_"+name, help, nil, constLabels), prometheus.CounterValue,
		func(s *snap) float64 { return float64(value(s)) }}
}

// noEndpointsNote ends the help of the no_endpoints counters.
const noEndpointsNote = " by the proxy because the service port had no endpoints for them (the iptables portal refuses or drops most such traffic before it reaches the proxy; that is not counted here)."

// bytesHelp is the help of kube_userspace_proxy_bytes_total.
const bytesHelp = "Bytes proxied, by protocol and direction: TCP stream bytes, UDP datagram payloads, SCTP message payloads. UDP to_endpoint counts what was sent to endpoints: a datagram sent again to another endpoint after a refusal counts again."

// udpDatagramsHelp is the help of kube_userspace_proxy_udp_datagrams_total.
const udpDatagramsHelp = "UDP datagrams proxied, by direction. to_endpoint counts what was sent to endpoints: a datagram sent again to another endpoint after a refusal (udp_refused_total) counts again."

// gauge describes kube_userspace_proxy_<name>.
func gauge(name, help string, value func(s *snap) int64) statDesc {
	return statDesc{prometheus.NewDesc("kube_userspace_proxy_"+name, help, nil, nil), prometheus.GaugeValue,
		func(s *snap) float64 { return float64(value(s)) }}
}

var statDescs = []statDesc{
	counter("tcp_connections_accepted_total", "TCP client connections taken from listening sockets, including those then reset: shed for want of descriptors (also in shed_total) or refused.", func(s *snap) uint64 { return s.TCPAccepted }),
	gauge("tcp_connections_active", "Proxied TCP connections open now.", func(s *snap) int64 { return s.TCPActive }),
	counter("tcp_no_endpoints_total", "TCP connections reset"+noEndpointsNote, func(s *snap) uint64 { return s.TCPNoEndpoints }),
	counter("tcp_dial_failures_total", "Failed dials to TCP endpoints (each attempt).", func(s *snap) uint64 { return s.TCPDialFailures }),
	counter("tcp_dial_give_ups_total", "TCP connections reset after every dial attempt failed.", func(s *snap) uint64 { return s.TCPDialGiveUps }),
	counter("tcp_half_close_timeouts_total", "TCP connections ended because a half-closed side stayed silent too long (--tcp-half-close-timeout), or because, after one side failed past its FIN, the other took nothing for 5 minutes.", func(s *snap) uint64 { return s.HalfCloseTimeouts }),
	counter("bytes_total", bytesHelp, func(s *snap) uint64 { return s.BytesToBackend }, "protocol", "tcp", "direction", "to_endpoint"),
	counter("bytes_total", bytesHelp, func(s *snap) uint64 { return s.BytesToClient }, "protocol", "tcp", "direction", "to_client"),
	counter("bytes_total", bytesHelp, func(s *snap) uint64 { return s.UDPBytesIn }, "protocol", "udp", "direction", "to_endpoint"),
	counter("bytes_total", bytesHelp, func(s *snap) uint64 { return s.UDPBytesOut }, "protocol", "udp", "direction", "to_client"),
	counter("bytes_total", bytesHelp, func(s *snap) uint64 { return s.SCTPBytesIn }, "protocol", "sctp", "direction", "to_endpoint"),
	counter("bytes_total", bytesHelp, func(s *snap) uint64 { return s.SCTPBytesOut }, "protocol", "sctp", "direction", "to_client"),
	counter("sctp_associations_accepted_total", "SCTP client associations taken from listening sockets, including those then aborted: shed for want of descriptors (also in shed_total) or refused.", func(s *snap) uint64 { return s.SCTPAccepted }),
	gauge("sctp_associations_active", "Proxied SCTP association pairs open now.", func(s *snap) int64 { return s.SCTPActive }),
	counter("sctp_no_endpoints_total", "SCTP associations aborted"+noEndpointsNote, func(s *snap) uint64 { return s.SCTPNoEndpoints }),
	counter("sctp_dial_failures_total", "Failed associations to SCTP endpoints (each attempt).", func(s *snap) uint64 { return s.SCTPDialFailures }),
	counter("sctp_dial_give_ups_total", "SCTP associations aborted after every attempt failed.", func(s *snap) uint64 { return s.SCTPDialGiveUps }),
	counter("udp_sessions_opened_total", "UDP sessions opened.", func(s *snap) uint64 { return s.UDPSessionsOpened }),
	gauge("udp_sessions_active", "UDP sessions open now.", func(s *snap) int64 { return s.UDPSessionsActive }),
	counter("udp_sessions_rejected_total", "UDP datagrams dropped because the service port was at --udp-max-sessions.", func(s *snap) uint64 { return s.UDPSessionsRejected }),
	counter("udp_no_endpoints_total", "UDP datagrams dropped"+noEndpointsNote, func(s *snap) uint64 { return s.UDPNoEndpoints }),
	counter("udp_datagrams_total", udpDatagramsHelp, func(s *snap) uint64 { return s.UDPDatagramsIn }, "direction", "to_endpoint"),
	counter("udp_datagrams_total", udpDatagramsHelp, func(s *snap) uint64 { return s.UDPDatagramsOut }, "direction", "to_client"),
	counter("udp_dropped_total", "UDP datagrams the proxy could not send on: a full send buffer or a send error. Those the kernel drops before the proxy reads them (a full receive buffer) are counted in the kernel's UdpRcvbufErrors, not here.", func(s *snap) uint64 { return s.UDPDropped }),
	counter("udp_refused_total", "UDP endpoint refusals (ICMP port unreachable): a session with no reply yet moves to another endpoint, others end.", func(s *snap) uint64 { return s.UDPRefused }),
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
