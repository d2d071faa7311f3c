package proxyserver

import (
	"context"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clientmetrics "k8s.io/client-go/tools/metrics"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/internal/buildinfo"
)

// client-go's request metrics, under the names and labels kube-proxy
// exposes them (k8s.io/component-base/metrics/prometheus/restclient), so
// the kubernetes-mixin "Kubernetes / Proxy" dashboard plots them. client-go
// takes its adapters once per process (metrics.Register), so the
// collectors are the process's; each metrics registry serves them.
//
// client-go observes the two histograms only for requests that are not
// watches (Request.Do and Stream): the informers' streaming lists
// (WatchList) and watches go through Request.Watch, which neither times
// nor rate-limits them, so the histograms usually have no series. The
// README says so; nothing here stands in for the missing observations.
var (
	restRequestLatency = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "rest_client_request_duration_seconds",
		Help:    "How long the proxy's requests to the API server took, in seconds, by verb and host.",
		Buckets: []float64{0.005, 0.025, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0},
	}, []string{"verb", "host"})
	restRateLimiterLatency = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "rest_client_rate_limiter_duration_seconds",
		Help:    "How long the proxy's requests to the API server waited for its client-side rate limiter, in seconds, by verb and host.",
		Buckets: []float64{0.005, 0.025, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0},
	}, []string{"verb", "host"})
	restRequestResult = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "rest_client_requests_total",
		Help: "The proxy's requests to the API server, by HTTP status code, method and host.",
	}, []string{"code", "method", "host"})
	restRequestRetry = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "rest_client_request_retries_total",
		Help: "The proxy's retried requests to the API server, by HTTP status code, verb and host.",
	}, []string{"code", "verb", "host"})
	registerClientMetrics sync.Once
)

type latencyAdapter struct{ m *prometheus.HistogramVec }

func (l latencyAdapter) Observe(_ context.Context, verb string, u url.URL, latency time.Duration) {
	l.m.WithLabelValues(verb, u.Host).Observe(latency.Seconds())
}

type resultAdapter struct{ m *prometheus.CounterVec }

func (r resultAdapter) Increment(_ context.Context, code, method, host string) {
	r.m.WithLabelValues(code, method, host).Inc()
}

type retryAdapter struct{ m *prometheus.CounterVec }

func (r retryAdapter) IncrementRetry(_ context.Context, code, method, host string) {
	r.m.WithLabelValues(code, method, host).Inc()
}

// clientCollectors hands client-go its adapters (once per process) and
// returns the collectors a registry serves them with.
func clientCollectors() []prometheus.Collector {
	registerClientMetrics.Do(func() {
		clientmetrics.Register(clientmetrics.RegisterOpts{
			RequestLatency:     latencyAdapter{restRequestLatency},
			RateLimiterLatency: latencyAdapter{restRateLimiterLatency},
			RequestResult:      resultAdapter{restRequestResult},
			RequestRetry:       retryAdapter{restRequestRetry},
		})
	})
	return []prometheus.Collector{restRequestLatency, restRateLimiterLatency, restRequestResult, restRequestRetry}
}

// buildInfoCollector is kube-proxy's kubernetes_build_info, with this
// proxy's build: constant 1, the build in its labels.
func buildInfoCollector() prometheus.Collector {
	v := buildinfo.Info()
	major, minor := v.Major, v.Minor
	if major == "" { // from the version, v1.2.3-...: 1 and 2
		parts := strings.SplitN(strings.TrimPrefix(v.GitVersion, "v"), ".", 3)
		if len(parts) >= 2 && parts[0] != "" && strings.Trim(parts[0], "0123456789") == "" {
			major, minor = parts[0], strings.TrimRight(parts[1], "-+")
		}
	}
	g := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "kubernetes_build_info",
		Help: "A metric with a constant '1' value labeled by major, minor, git version, git commit, git tree state, build date, Go version, and compiler from which this proxy was built, and platform on which it is running.",
	}, []string{"major", "minor", "git_version", "git_commit", "git_tree_state", "build_date", "go_version", "compiler", "platform"})
	g.WithLabelValues(major, minor, v.GitVersion, v.GitCommit, v.GitTreeState, v.BuildDate, v.GoVersion, v.Compiler, v.Platform).Set(1)
	return g
}
