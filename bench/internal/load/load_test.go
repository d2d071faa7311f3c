package load

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/bench/internal/backend"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/bench/internal/iocopy"
)

// world is a backend with a go-iocopy proxy in front of its TCP servers.
type world struct {
	backend    *backend.Server
	echo, bulk string // through the proxy
}

func newWorld(t *testing.T) world {
	t.Helper()
	s, err := backend.Listen(backend.Config{Echo: "127.0.0.1:0", Bulk: "127.0.0.1:0", UDP: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	s.Serve()
	t.Cleanup(func() { s.Close() })
	w := world{backend: s}
	for _, p := range []struct {
		to  string
		dst *string
	}{{s.EchoAddr(), &w.echo}, {s.BulkAddr(), &w.bulk}} {
		px, err := iocopy.Listen("127.0.0.1:0", p.to)
		if err != nil {
			t.Fatal(err)
		}
		px.Serve()
		t.Cleanup(func() { px.Close() })
		*p.dst = px.Addr()
	}
	return w
}

func TestThroughput(t *testing.T) {
	w := newWorld(t)
	for _, upload := range []bool{false, true} {
		r, err := Throughput(context.Background(), ThroughputConfig{
			Addr: w.bulk, Streams: 2, Upload: upload,
			Warmup: 20 * time.Millisecond, Duration: 100 * time.Millisecond,
		})
		if err != nil {
			t.Fatalf("upload=%v: %v", upload, err)
		}
		if r.Bytes <= 0 || r.BitsPerSecond() <= 0 || r.StreamErrors != 0 {
			t.Fatalf("upload=%v: %+v", upload, r)
		}
	}
}

func TestConnRate(t *testing.T) {
	w := newWorld(t)
	r, err := ConnRate(context.Background(), ConnRateConfig{Addr: w.echo, Workers: 4, MaxConns: 200, Duration: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if r.OK != 200 || r.Failed != 0 {
		t.Fatalf("ConnRate = %+v, want 200 completed, none failed", r)
	}
}

func TestConnRateStopsAtDeadline(t *testing.T) {
	w := newWorld(t)
	r, err := ConnRate(context.Background(), ConnRateConfig{Addr: w.echo, Workers: 4, MaxConns: 1 << 30, Duration: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if r.Failed != 0 || r.Elapsed > time.Second {
		t.Fatalf("ConnRate = %+v, want no failure counted at the deadline", r)
	}
}

func TestLatency(t *testing.T) {
	w := newWorld(t)
	r, err := Latency(context.Background(), LatencyConfig{Addr: w.echo, Conns: 2, Rate: 1000, Duration: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if r.Requests != 200 || r.Errors != 0 {
		t.Fatalf("Latency = %+v, want 200 answered", r)
	}
	if !(0 < r.P50 && r.P50 <= r.P99 && r.P99 <= r.P999 && r.P999 <= r.Max) {
		t.Fatalf("percentiles out of order: %+v", r)
	}
}

func TestLatencyReconnects(t *testing.T) {
	// An echo server that answers every connection's first request only.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			buf := make([]byte, 64)
			if n, err := c.Read(buf); err == nil {
				c.Write(buf[:n])
			}
			c.Close()
		}
	}()
	t.Cleanup(func() { ln.Close(); <-done })

	r, err := Latency(context.Background(), LatencyConfig{Addr: ln.Addr().String(), Conns: 1, Rate: 100, Duration: 100 * time.Millisecond, Timeout: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	// Requests alternate: answered on a fresh connection, then failed.
	if r.Requests < 4 || r.Errors < 4 || r.FirstErr == nil {
		t.Fatalf("Latency = %+v, want answers and failures both", r)
	}
}

func TestUDPRate(t *testing.T) {
	w := newWorld(t)
	r, err := UDPRate(context.Background(), UDPConfig{Addr: w.backend.UDPAddr(), Clients: 2, MaxRequests: 500, Duration: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if r.OK+r.Lost != 500 || r.OK == 0 {
		t.Fatalf("UDPRate = %+v, want 500 requests", r)
	}
}

func TestHold(t *testing.T) {
	w := newWorld(t)
	h := Hold(context.Background(), HoldConfig{Addr: w.echo, Conns: 50, Concurrency: 8})
	defer h.Close()
	if h.OK() != 50 || h.Failed != 0 {
		t.Fatalf("Hold: %d held, %d failed (%v); want 50 held", h.OK(), h.Failed, h.FirstErr)
	}
}

func TestHoldStopsAfterFailures(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens: every dial is refused
	h := Hold(context.Background(), HoldConfig{Addr: addr, Conns: 1000, Concurrency: 4, MaxFailures: 10})
	defer h.Close()
	if h.OK() != 0 || h.Failed < 10 || h.Failed > 10+4 {
		t.Fatalf("Hold: %d held, %d failed; want 0 held and about 10 failed", h.OK(), h.Failed)
	}
}

func TestPercentile(t *testing.T) {
	var s []time.Duration
	for i := 1; i <= 100; i++ {
		s = append(s, time.Duration(i))
	}
	tests := []struct {
		p    float64
		want time.Duration
	}{{50, 50}, {99, 99}, {99.9, 100}, {100, 100}, {0.5, 1}}
	for _, tc := range tests {
		if got := Percentile(s, tc.p); got != tc.want {
			t.Errorf("Percentile(%v) = %v, want %v", tc.p, got, tc.want)
		}
	}
	if got := Percentile(nil, 50); got != 0 {
		t.Errorf("Percentile(nil) = %v, want 0", got)
	}
}
