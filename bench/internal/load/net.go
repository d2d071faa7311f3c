package load

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"time"
)

const dialTimeout = 3 * time.Second

func dial(ctx context.Context, addr string, timeout time.Duration) (net.Conn, error) {
	d := net.Dialer{Timeout: timeout}
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("load: dial %s: %w", addr, err)
	}
	return c, nil
}

// closeAll closes every non-nil connection.
func closeAll(conns []net.Conn) {
	for _, c := range conns {
		if c != nil {
			c.Close()
		}
	}
}

// sleepCtx sleeps for d or until ctx is done, whichever comes first.
func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// request fills buf with a recognisable message whose first 8 bytes are seq,
// so a stale reply can be told from the current one. buf must hold at least
// 8 bytes.
func request(buf []byte, seq uint64) []byte {
	for i := range buf {
		buf[i] = byte('a' + i%26)
	}
	binary.BigEndian.PutUint64(buf, seq)
	return buf
}

// isDeadline reports whether err is an expired connection deadline.
func isDeadline(err error) bool {
	return errors.Is(err, os.ErrDeadlineExceeded)
}

// before reports whether deadline is still ahead and ctx still live. Checking
// the clock, rather than only a context with that deadline, keeps an
// operation that failed because the deadline passed from being counted as a
// failure before the context's own timer has fired.
func before(ctx context.Context, deadline time.Time) bool {
	return ctx.Err() == nil && time.Now().Before(deadline)
}
