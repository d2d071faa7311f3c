package load

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math"
	"net"
	"slices"
	"sync"
	"time"
)

// LatencyConfig describes one request/response latency test: requests are
// sent at a fixed total rate over persistent connections, each connection
// waiting for the echo of one request before it sends the next.
type LatencyConfig struct {
	Addr string // the echo server, or a proxy in front of it
	// Conns is the number of persistent connections. If zero, 8.
	Conns int
	// Rate is the total requests per second over all connections. If
	// zero, 5000.
	Rate int
	// Duration bounds the test's time; Rate*Duration bounds its count.
	// If zero, 5s.
	Duration time.Duration
	// Size is the request size in bytes, at least 8. If zero, 64.
	Size int
	// Timeout bounds the wait for one echo. If zero, 1s.
	Timeout time.Duration
}

func (c LatencyConfig) withDefaults() LatencyConfig {
	if c.Conns <= 0 {
		c.Conns = 8
	}
	if c.Rate <= 0 {
		c.Rate = 5000
	}
	if c.Duration <= 0 {
		c.Duration = 5 * time.Second
	}
	if c.Size < 8 {
		c.Size = 64
	}
	if c.Timeout <= 0 {
		c.Timeout = time.Second
	}
	return c
}

// LatencyResult is what one latency test measured. Latency runs from just
// before a request is written to the moment its whole echo has been read.
type LatencyResult struct {
	Requests int           // answered requests
	Errors   int           // failed requests; the sender reconnects after each
	FirstErr error         // the first failure, if any
	Elapsed  time.Duration // from the first scheduled send to the last answer
	P50, P99 time.Duration
	P999     time.Duration
	Max      time.Duration
}

// Achieved returns the answered requests per second.
func (r LatencyResult) Achieved() float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return float64(r.Requests) / r.Elapsed.Seconds()
}

// Latency sends requests at cfg.Rate for cfg.Duration and reports latency
// percentiles. A sender that falls behind its schedule sends at once, so a
// slow peer shows both a lower achieved rate and a higher latency.
func Latency(ctx context.Context, cfg LatencyConfig) (LatencyResult, error) {
	cfg = cfg.withDefaults()
	conns := make([]net.Conn, 0, cfg.Conns)
	for range cfg.Conns {
		c, err := dial(ctx, cfg.Addr, dialTimeout)
		if err != nil {
			closeAll(conns)
			return LatencyResult{}, err
		}
		conns = append(conns, c)
	}
	defer closeAll(conns)

	interval := time.Duration(cfg.Conns) * time.Second / time.Duration(cfg.Rate)
	perConn := int(int64(cfg.Rate) * int64(cfg.Duration) / int64(time.Second) / int64(cfg.Conns))
	start := time.Now()
	senders := make([]sender, len(conns))
	var wg sync.WaitGroup
	for i := range conns {
		senders[i] = sender{cfg: cfg, conn: conns[i], interval: interval, count: perConn,
			// Stagger the connections evenly over one interval.
			first: start.Add(time.Duration(i) * interval / time.Duration(len(conns)))}
		wg.Add(1)
		go func() {
			defer wg.Done()
			senders[i].run(ctx)
			conns[i] = senders[i].conn // closed by the deferred closeAll
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	if err := ctx.Err(); err != nil {
		return LatencyResult{}, err
	}
	return summarize(senders, elapsed, cfg.Addr)
}

// sender paces requests over one connection.
type sender struct {
	cfg      LatencyConfig
	conn     net.Conn // nil after a failed reconnect
	first    time.Time
	interval time.Duration
	count    int

	lat      []time.Duration // of each answered request
	errors   int
	firstErr error
}

// run sends count requests, the k-th no earlier than first+k*interval. A
// failed request (a timeout, a reset) costs the connection: it is counted
// and the sender reconnects before its next request.
func (s *sender) run(ctx context.Context) {
	s.lat = make([]time.Duration, 0, s.count)
	req := make([]byte, s.cfg.Size)
	resp := make([]byte, s.cfg.Size)
	for k := range s.count {
		if sleepCtx(ctx, time.Until(s.first.Add(time.Duration(k)*s.interval))) != nil {
			return // cancelled: the caller reports ctx.Err()
		}
		if s.conn == nil {
			c, err := dial(ctx, s.cfg.Addr, s.cfg.Timeout)
			if err != nil {
				s.fail(err)
				continue
			}
			s.conn = c
		}
		d, err := s.roundTrip(req, resp, uint64(k))
		if err != nil {
			s.fail(err)
			s.conn.Close()
			s.conn = nil
			continue
		}
		s.lat = append(s.lat, d)
	}
}

func (s *sender) roundTrip(req, resp []byte, seq uint64) (time.Duration, error) {
	request(req, seq)
	sent := time.Now()
	s.conn.SetDeadline(sent.Add(s.cfg.Timeout))
	if _, err := s.conn.Write(req); err != nil {
		return 0, fmt.Errorf("load: write: %w", err)
	}
	if _, err := io.ReadFull(s.conn, resp); err != nil {
		return 0, fmt.Errorf("load: read echo: %w", err)
	}
	d := time.Since(sent)
	if !bytes.Equal(req, resp) {
		return 0, fmt.Errorf("load: echo differs from request")
	}
	return d, nil
}

func (s *sender) fail(err error) {
	s.errors++
	if s.firstErr == nil {
		s.firstErr = err
	}
}

func summarize(senders []sender, elapsed time.Duration, addr string) (LatencyResult, error) {
	var all []time.Duration
	r := LatencyResult{Elapsed: elapsed}
	for _, s := range senders {
		all = append(all, s.lat...)
		r.Errors += s.errors
		if r.FirstErr == nil {
			r.FirstErr = s.firstErr
		}
	}
	r.Requests = len(all)
	if len(all) == 0 {
		return r, fmt.Errorf("load: no request answered by %s: %v", addr, r.FirstErr)
	}
	slices.Sort(all)
	r.P50 = Percentile(all, 50)
	r.P99 = Percentile(all, 99)
	r.P999 = Percentile(all, 99.9)
	r.Max = all[len(all)-1]
	return r, nil
}

// Percentile returns the p-th percentile (0 < p <= 100) of sorted, by the
// nearest-rank method, or 0 when sorted is empty.
func Percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	rank := int(math.Ceil(p / 100 * float64(len(sorted))))
	rank = max(1, min(rank, len(sorted)))
	return sorted[rank-1]
}
