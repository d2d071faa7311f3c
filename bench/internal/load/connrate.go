package load

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"
)

// ConnRateConfig describes one connection-rate test: each connection is
// opened, carries one request and its echo, and is closed by the client.
type ConnRateConfig struct {
	Addr string // the echo server, or a proxy in front of it
	// Workers is the number of concurrent connect loops. If zero, 8.
	Workers int
	// MaxConns bounds the connections attempted. If zero, 20000.
	MaxConns int
	// Duration bounds the test's time. If zero, 3s.
	Duration time.Duration
	// Size is the request size in bytes, at least 8. If zero, 64.
	Size int
	// Timeout bounds each connection's life. If zero, 2s.
	Timeout time.Duration
}

func (c ConnRateConfig) withDefaults() ConnRateConfig {
	if c.Workers <= 0 {
		c.Workers = 8
	}
	if c.MaxConns <= 0 {
		c.MaxConns = 20000
	}
	if c.Duration <= 0 {
		c.Duration = 3 * time.Second
	}
	if c.Size < 8 {
		c.Size = 64
	}
	if c.Timeout <= 0 {
		c.Timeout = 2 * time.Second
	}
	return c
}

// ConnRateResult is what one connection-rate test measured.
type ConnRateResult struct {
	OK, Failed int64
	Elapsed    time.Duration
	FirstErr   error // the first failure, if any
}

// PerSecond returns the completed connections per second.
func (r ConnRateResult) PerSecond() float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return float64(r.OK) / r.Elapsed.Seconds()
}

// ConnRate runs cfg.Workers loops of connect, write, read echo, close until
// MaxConns connections were attempted or Duration has passed.
func ConnRate(ctx context.Context, cfg ConnRateConfig) (ConnRateResult, error) {
	cfg = cfg.withDefaults()
	start := time.Now()
	deadline := start.Add(cfg.Duration)
	bounded, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()

	var tickets, ok, failed atomic.Int64
	var firstErr error
	var errOnce sync.Once
	var wg sync.WaitGroup
	for range cfg.Workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req := make([]byte, cfg.Size)
			resp := make([]byte, cfg.Size)
			for before(bounded, deadline) && tickets.Add(1) <= int64(cfg.MaxConns) {
				if err := echoOnce(bounded, cfg, req, resp); err != nil {
					if !before(bounded, deadline) {
						return // cut short by the time bound: not a failure
					}
					failed.Add(1)
					errOnce.Do(func() { firstErr = err })
					continue
				}
				ok.Add(1)
			}
		}()
	}
	wg.Wait()
	r := ConnRateResult{OK: ok.Load(), Failed: failed.Load(), Elapsed: time.Since(start), FirstErr: firstErr}
	if err := ctx.Err(); err != nil {
		return r, err
	}
	if r.OK == 0 {
		return r, fmt.Errorf("load: no connection completed to %s: %v", cfg.Addr, firstErr)
	}
	return r, nil
}

func echoOnce(ctx context.Context, cfg ConnRateConfig, req, resp []byte) error {
	c, err := dial(ctx, cfg.Addr, cfg.Timeout)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(cfg.Timeout))
	request(req, 1)
	if _, err := c.Write(req); err != nil {
		return fmt.Errorf("load: write: %w", err)
	}
	if _, err := io.ReadFull(c, resp); err != nil {
		return fmt.Errorf("load: read echo: %w", err)
	}
	if !bytes.Equal(req, resp) {
		return fmt.Errorf("load: echo differs from request")
	}
	return nil
}
