package load

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"sync"
	"time"
)

// HoldConfig describes how to open many idle connections.
type HoldConfig struct {
	Addr string // the echo server, or a proxy in front of it
	// Conns is the number of connections to open. If zero, 1000.
	Conns int
	// Concurrency bounds the connections being opened at once. If zero, 32.
	Concurrency int
	// Timeout bounds the opening of one connection, its request and its
	// echo. If zero, 3s.
	Timeout time.Duration
	// MaxFailures stops opening after this many failed connections, so a
	// peer that ran out of file descriptors does not cost Conns timeouts.
	// If zero, 200.
	MaxFailures int
	// Deadline bounds the whole opening phase. If zero, 60s.
	Deadline time.Duration
	// Size is the request size in bytes, at least 8. If zero, 64.
	Size int
}

func (c HoldConfig) withDefaults() HoldConfig {
	if c.Conns <= 0 {
		c.Conns = 1000
	}
	if c.Concurrency <= 0 {
		c.Concurrency = 32
	}
	if c.Timeout <= 0 {
		c.Timeout = 3 * time.Second
	}
	if c.MaxFailures <= 0 {
		c.MaxFailures = 200
	}
	if c.Deadline <= 0 {
		c.Deadline = 60 * time.Second
	}
	if c.Size < 8 {
		c.Size = 64
	}
	return c
}

// Held is a set of open, idle connections. Each one carried one request and
// its echo end to end, so a proxy that accepted a connection but never
// reached the backend does not count.
type Held struct {
	Failed   int
	FirstErr error // the first failure, if any

	conns []net.Conn
}

// OK returns the number of connections held open.
func (h *Held) OK() int { return len(h.conns) }

// Close closes every held connection.
func (h *Held) Close() {
	closeAll(h.conns)
	h.conns = nil
}

// Hold opens cfg.Conns connections, sends one request on each and waits for
// its echo, then leaves them open and idle. It stops early after MaxFailures
// failures, at Deadline, or when ctx is done; the caller closes the result.
func Hold(ctx context.Context, cfg HoldConfig) *Held {
	cfg = cfg.withDefaults()
	deadline := time.Now().Add(cfg.Deadline)
	bounded, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()

	h := &Held{conns: make([]net.Conn, 0, cfg.Conns)}
	var mu sync.Mutex // guards h and next
	next := 0
	// claim hands out the next connection to open, or false when done.
	claim := func() bool {
		mu.Lock()
		defer mu.Unlock()
		if next >= cfg.Conns || h.Failed >= cfg.MaxFailures || !before(bounded, deadline) {
			return false
		}
		next++
		return true
	}
	record := func(c net.Conn, err error) {
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			h.Failed++
			if h.FirstErr == nil {
				h.FirstErr = err
			}
			return
		}
		h.conns = append(h.conns, c)
	}

	var wg sync.WaitGroup
	for range cfg.Concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req := make([]byte, cfg.Size)
			resp := make([]byte, cfg.Size)
			for claim() {
				record(openIdle(bounded, cfg, req, resp))
			}
		}()
	}
	wg.Wait()
	return h
}

func openIdle(ctx context.Context, cfg HoldConfig, req, resp []byte) (net.Conn, error) {
	c, err := dial(ctx, cfg.Addr, cfg.Timeout)
	if err != nil {
		return nil, err
	}
	c.SetDeadline(time.Now().Add(cfg.Timeout))
	request(req, 1)
	if _, err := c.Write(req); err != nil {
		c.Close()
		return nil, fmt.Errorf("load: write: %w", err)
	}
	if _, err := io.ReadFull(c, resp); err != nil {
		c.Close()
		return nil, fmt.Errorf("load: read echo: %w", err)
	}
	if !bytes.Equal(req, resp) {
		c.Close()
		return nil, fmt.Errorf("load: echo differs from request")
	}
	c.SetDeadline(time.Time{})
	return c, nil
}
