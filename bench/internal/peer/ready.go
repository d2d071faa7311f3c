package peer

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"time"
)

const (
	readyTries    = 200 // bounded retries, readyInterval apart
	readyInterval = 50 * time.Millisecond
	udpProbeWait  = 100 * time.Millisecond
	udpProbeTries = 20
)

// waitReady polls the peer's TCP frontends until they accept, and checks that
// its UDP frontend (if any) echoes. A UDP frontend that never echoes is
// dropped from Front, so that the UDP test reports it, instead of failing the
// whole peer.
func waitReady(ctx context.Context, in *Instance) error {
	for _, addr := range []string{in.Front.Echo, in.Front.Bulk} {
		if err := waitTCP(ctx, in, addr); err != nil {
			return err
		}
	}
	if in.Front.UDP != "" && !probeUDP(ctx, in.Front.UDP) {
		in.Front.UDP = ""
	}
	return nil
}

func waitTCP(ctx context.Context, in *Instance, addr string) error {
	var lastErr error
	for range readyTries {
		if err := in.Check(); err != nil {
			return err
		}
		d := net.Dialer{Timeout: time.Second}
		c, err := d.DialContext(ctx, "tcp", addr)
		if err == nil {
			c.Close()
			return nil
		}
		lastErr = err
		if err := sleep(ctx, readyInterval); err != nil {
			return err
		}
	}
	return fmt.Errorf("peer: %s does not accept on %s: %w", in.Name, addr, lastErr)
}

// probeUDP sends datagrams to an echo service until one comes back.
func probeUDP(ctx context.Context, addr string) bool {
	c, err := net.Dial("udp", addr)
	if err != nil {
		return false
	}
	defer c.Close()
	msg := []byte("kube-userspace-proxy bench probe")
	buf := make([]byte, 2*len(msg))
	for range udpProbeTries {
		next := time.Now().Add(udpProbeWait)
		c.SetDeadline(next)
		if _, err := c.Write(msg); err == nil {
			n, err := c.Read(buf)
			if err == nil && bytes.Equal(buf[:n], msg) {
				return true
			}
		}
		// Not echoing yet (a timeout, or ECONNREFUSED from an earlier
		// probe): try again no sooner than one wait later.
		if sleep(ctx, time.Until(next)) != nil {
			return false
		}
	}
	return false
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
