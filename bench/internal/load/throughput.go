package load

import (
	"context"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/bench/internal/backend"
)

const bulkBufSize = 256 << 10

// ThroughputConfig describes one bulk transfer test.
type ThroughputConfig struct {
	Addr string // the bulk server, or a proxy in front of it
	// Streams is the number of parallel connections. If zero, 1.
	Streams int
	// Warmup runs before the measured window and is not counted. If zero,
	// 300ms.
	Warmup time.Duration
	// Duration is the measured window. If zero, 3s.
	Duration time.Duration
	// Upload sends client to backend; the default is backend to client.
	Upload bool
}

func (c ThroughputConfig) withDefaults() ThroughputConfig {
	if c.Streams <= 0 {
		c.Streams = 1
	}
	if c.Warmup <= 0 {
		c.Warmup = 300 * time.Millisecond
	}
	if c.Duration <= 0 {
		c.Duration = 3 * time.Second
	}
	return c
}

// ThroughputResult is what one bulk transfer test measured.
type ThroughputResult struct {
	Bytes   int64         // moved during the measured window
	Elapsed time.Duration // length of the measured window
	// StreamErrors counts streams that failed before the window closed.
	StreamErrors int
}

// BitsPerSecond returns the throughput of the measured window.
func (r ThroughputResult) BitsPerSecond() float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return float64(r.Bytes) * 8 / r.Elapsed.Seconds()
}

// Throughput opens cfg.Streams connections to a bulk server, moves data in
// one direction for Warmup+Duration and reports the bytes moved during
// Duration. Bytes are counted as the client reads them (download) or as the
// kernel accepts them from the client (upload).
func Throughput(ctx context.Context, cfg ThroughputConfig) (ThroughputResult, error) {
	cfg = cfg.withDefaults()
	conns, err := dialBulk(ctx, cfg)
	if err != nil {
		return ThroughputResult{}, err
	}
	defer closeAll(conns)

	var moved atomic.Int64
	var failed atomic.Int32
	var wg sync.WaitGroup
	for _, c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := pump(c, cfg.Upload, &moved); !isDeadline(err) {
				failed.Add(1)
			}
		}()
	}
	// stop ends the pumps by expiring their deadlines, then waits for them.
	stop := func() {
		for _, c := range conns {
			c.SetDeadline(time.Now())
		}
		wg.Wait()
	}

	if err := sleepCtx(ctx, cfg.Warmup); err != nil {
		stop()
		return ThroughputResult{}, err
	}
	start, startBytes := time.Now(), moved.Load()
	err = sleepCtx(ctx, cfg.Duration)
	end, endBytes := time.Now(), moved.Load()
	stop()
	if err != nil {
		return ThroughputResult{}, err
	}
	r := ThroughputResult{Bytes: endBytes - startBytes, Elapsed: end.Sub(start), StreamErrors: int(failed.Load())}
	if r.Bytes == 0 {
		return r, fmt.Errorf("load: no bytes moved through %s", cfg.Addr)
	}
	return r, nil
}

func dialBulk(ctx context.Context, cfg ThroughputConfig) ([]net.Conn, error) {
	mode := backend.BulkSource
	if cfg.Upload {
		mode = backend.BulkSink
	}
	var conns []net.Conn
	for range cfg.Streams {
		c, err := dial(ctx, cfg.Addr, dialTimeout)
		if err != nil {
			closeAll(conns)
			return nil, err
		}
		conns = append(conns, c)
		if _, err := c.Write([]byte{mode}); err != nil {
			closeAll(conns)
			return nil, fmt.Errorf("load: start bulk stream: %w", err)
		}
	}
	return conns, nil
}

// pump reads (download) or writes (upload) until the connection fails or
// its deadline expires, adding every byte to moved. It returns the error
// that stopped it, never nil.
func pump(c net.Conn, upload bool, moved *atomic.Int64) error {
	buf := make([]byte, bulkBufSize)
	for {
		var n int
		var err error
		if upload {
			n, err = c.Write(buf)
		} else {
			n, err = c.Read(buf)
		}
		moved.Add(int64(n))
		if err != nil {
			return err
		}
	}
}
