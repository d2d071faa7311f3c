package suite

import (
	"fmt"
	"time"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/bench/internal/load"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/bench/internal/report"
)

// Test ids, as they appear in the JSON results.
const (
	TestThroughput1  = "tcp-throughput-1"
	TestThroughput8  = "tcp-throughput-8"
	TestConnRate     = "tcp-connect-rate"
	TestConnCPU      = "tcp-connect-cpu"
	TestLatencyP50   = "tcp-latency-p50"
	TestLatencyP99   = "tcp-latency-p99"
	TestUDPRate      = "udp-rate"
	TestUDPCPU       = "udp-cpu"
	TestIdleHeld     = "idle-held"
	TestIdleRSS      = "idle-rss"
	TestIdleFDs      = "idle-fds"
	TestIdleRSSConn  = "idle-rss-per-conn"
	TestIdleFDsConn  = "idle-fds-per-conn"
	streamsMany      = 8
	holdersPerSocket = 3000 // client sockets per holder process
)

// params are the knobs of one run, full or short. Addresses are filled in
// per peer.
type params struct {
	warmup, throughput time.Duration
	connRate           load.ConnRateConfig
	latency            load.LatencyConfig
	udp                load.UDPConfig
	hold               load.HoldConfig // Conns is the total over all holders
	settle             time.Duration   // between the last connection and sampling
}

// fullParams keep each peer to about 30 seconds on 2 cores.
func fullParams(idleConns int) params {
	return params{
		warmup:     300 * time.Millisecond,
		throughput: 3 * time.Second,
		connRate:   load.ConnRateConfig{Workers: 8, MaxConns: 20000, Duration: 3 * time.Second, Size: 64},
		latency:    load.LatencyConfig{Conns: 8, Rate: 5000, Duration: 5 * time.Second, Size: 64},
		udp:        load.UDPConfig{Clients: 8, MaxRequests: 500000, Duration: 3 * time.Second, Size: 64},
		hold:       load.HoldConfig{Conns: idleConns, Concurrency: 32, Timeout: 3 * time.Second, MaxFailures: 200, Deadline: 60 * time.Second, Size: 64},
		settle:     time.Second,
	}
}

// shortParams keep the whole smoke run to about 30 seconds.
func shortParams(idleConns int) params {
	p := fullParams(idleConns)
	p.warmup = 100 * time.Millisecond
	p.throughput = 500 * time.Millisecond
	p.connRate.MaxConns, p.connRate.Duration = 3000, 500*time.Millisecond
	p.latency.Duration = time.Second
	p.udp.MaxRequests, p.udp.Duration = 100000, 500*time.Millisecond
	p.hold.MaxFailures, p.hold.Deadline = 50, 15*time.Second
	p.settle = 300 * time.Millisecond
	return p
}

// tests returns the tables the given groups fill, in order.
func (p params) tests(groups []string) []report.Test {
	var out []report.Test
	for _, g := range groups {
		out = append(out, p.groupTests(g)...)
	}
	return out
}

func (p params) groupTests(group string) []report.Test {
	switch group {
	case GroupThroughput:
		return []report.Test{
			{ID: TestThroughput1, Title: fmt.Sprintf("TCP bulk throughput, 1 stream, backend to client, %s", p.throughput), Unit: "Gbit/s"},
			{ID: TestThroughput8, Title: fmt.Sprintf("TCP bulk throughput, %d streams, backend to client, %s", streamsMany, p.throughput), Unit: "Gbit/s"},
		}
	case GroupConnRate:
		c := p.connRate
		return []report.Test{
			{ID: TestConnRate, Title: fmt.Sprintf("TCP connections per second: connect, %d B echo, close; %d workers, at most %d conns or %s", c.Size, c.Workers, c.MaxConns, c.Duration), Unit: "conn/s"},
			{ID: TestConnCPU, Title: "Proxy CPU per TCP connection in " + TestConnRate + " (user + system time of its process tree)", Unit: "µs", LowerIsBetter: true},
		}
	case GroupLatency:
		l := p.latency
		what := fmt.Sprintf("%d B echo at %d req/s over %d persistent conns for %s", l.Size, l.Rate, l.Conns, l.Duration)
		return []report.Test{
			{ID: TestLatencyP50, Title: "TCP request/response latency p50, " + what, Unit: "µs", LowerIsBetter: true},
			{ID: TestLatencyP99, Title: "TCP request/response latency p99, " + what, Unit: "µs", LowerIsBetter: true},
		}
	case GroupUDP:
		u := p.udp
		return []report.Test{
			{ID: TestUDPRate, Title: fmt.Sprintf("UDP request/response rate, %d B datagrams, %d clients with a socket each, at most %d requests or %s", u.Size, u.Clients, u.MaxRequests, u.Duration), Unit: "req/s"},
			{ID: TestUDPCPU, Title: "Proxy CPU per UDP request in " + TestUDPRate + " (user + system time of its process tree)", Unit: "µs", LowerIsBetter: true},
		}
	case GroupIdle:
		n := p.hold.Conns
		return []report.Test{
			{ID: TestIdleHeld, Title: fmt.Sprintf("Idle TCP connections held open through the proxy (of %d, each checked with one echo)", n), Unit: "conns"},
			{ID: TestIdleRSS, Title: fmt.Sprintf("Proxy memory with %d idle connections (VmRSS, summed over the proxy's process tree)", n), Unit: "MiB", LowerIsBetter: true},
			{ID: TestIdleFDs, Title: fmt.Sprintf("Proxy open file descriptors with %d idle connections (process tree)", n), Unit: "fds", LowerIsBetter: true},
			{ID: TestIdleRSSConn, Title: "Proxy memory per idle connection (PSS growth / connections held; PSS splits shared pages, fair to forking peers)", Unit: "KiB", LowerIsBetter: true},
			{ID: TestIdleFDsConn, Title: "Proxy file descriptors per idle connection (growth / connections held)", Unit: "fds", LowerIsBetter: true},
		}
	}
	return nil
}
