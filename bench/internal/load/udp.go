package load

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// UDPConfig describes one UDP request/response test: each client has its own
// socket and sends one datagram at a time, waiting for its echo.
type UDPConfig struct {
	Addr string // the UDP echo server, or a proxy in front of it
	// Clients is the number of concurrent clients, one socket each. If
	// zero, 8.
	Clients int
	// MaxRequests bounds the datagrams sent over all clients. If zero,
	// 500000.
	MaxRequests int
	// Duration bounds the test's time. If zero, 3s.
	Duration time.Duration
	// Size is the datagram size in bytes, at least 8. If zero, 64.
	Size int
	// Timeout is how long a client waits for an echo before it counts the
	// request as lost. If zero, 200ms.
	Timeout time.Duration
}

func (c UDPConfig) withDefaults() UDPConfig {
	if c.Clients <= 0 {
		c.Clients = 8
	}
	if c.MaxRequests <= 0 {
		c.MaxRequests = 500000
	}
	if c.Duration <= 0 {
		c.Duration = 3 * time.Second
	}
	if c.Size < 8 {
		c.Size = 64
	}
	if c.Timeout <= 0 {
		c.Timeout = 200 * time.Millisecond
	}
	return c
}

// UDPResult is what one UDP test measured.
type UDPResult struct {
	OK, Lost int64
	Elapsed  time.Duration
}

// PerSecond returns the answered requests per second.
func (r UDPResult) PerSecond() float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return float64(r.OK) / r.Elapsed.Seconds()
}

// UDPRate runs cfg.Clients request/response loops until MaxRequests were sent
// or Duration has passed.
func UDPRate(ctx context.Context, cfg UDPConfig) (UDPResult, error) {
	cfg = cfg.withDefaults()
	raddr, err := net.ResolveUDPAddr("udp", cfg.Addr)
	if err != nil {
		return UDPResult{}, fmt.Errorf("load: udp address: %w", err)
	}
	socks := make([]*net.UDPConn, 0, cfg.Clients)
	defer func() {
		for _, s := range socks {
			s.Close()
		}
	}()
	for range cfg.Clients {
		s, err := net.DialUDP("udp", nil, raddr)
		if err != nil {
			return UDPResult{}, fmt.Errorf("load: udp socket: %w", err)
		}
		socks = append(socks, s)
	}

	start := time.Now()
	deadline := start.Add(cfg.Duration)
	var tickets, ok, lost atomic.Int64
	var wg sync.WaitGroup
	for _, s := range socks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req := make([]byte, cfg.Size)
			resp := make([]byte, cfg.Size+1)
			for seq := uint64(1); before(ctx, deadline) && tickets.Add(1) <= int64(cfg.MaxRequests); seq++ {
				if exchange(s, req, resp, seq, cfg.Timeout) {
					ok.Add(1)
				} else {
					lost.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	r := UDPResult{OK: ok.Load(), Lost: lost.Load(), Elapsed: time.Since(start)}
	if err := ctx.Err(); err != nil {
		return r, err
	}
	if r.OK == 0 {
		return r, fmt.Errorf("load: no UDP echo from %s (%d lost)", cfg.Addr, r.Lost)
	}
	return r, nil
}

// exchange sends one datagram and waits for the echo carrying the same seq,
// skipping late echoes of earlier requests.
func exchange(s *net.UDPConn, req, resp []byte, seq uint64, timeout time.Duration) bool {
	request(req, seq)
	s.SetReadDeadline(time.Now().Add(timeout))
	if _, err := s.Write(req); err != nil {
		return false
	}
	for {
		n, err := s.Read(resp)
		if err != nil {
			return false
		}
		if n == len(req) && binary.BigEndian.Uint64(resp) == seq {
			return true
		}
	}
}
