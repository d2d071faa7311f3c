package userspace

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"k8s.io/klog/v2"
)

// What the protocols served by goroutines share: SCTP on every Linux
// build, and TCP where the event loops do not run (see doc.go).

// acceptLoop accepts with accept until the listener is closed, and hands
// each connection to serve on a goroutine of its own; serve must call
// sp.p.wg.Done. Running out of file descriptors sheds one waiting
// connection (shed, which must not wait, says what came of it); nothing
// wakes the loop when a client comes or descriptors are free again (on
// Linux accept fails so with no client waiting, and Go's poller waits only
// after EAGAIN), so it looks again within outOfDescriptorsRetry. Other
// errors, rare and usually transient, back off so a persistent one cannot
// spin.
func acceptLoop[C any](sp *servicePort, accepted *atomic.Uint64, accept func() (C, error), shed func() shedResult, serve func(C)) {
	p := sp.p
	var backoff time.Duration
	for {
		c, err := accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			limit := time.Second
			if isResourceExhausted(err) {
				switch shed() {
				case shedOne:
					accepted.Add(1) // taken, and shed (see Stats.TCPAccepted)
					p.shed.report(&p.stats, err, sp.name.String(), true)
					continue
				case shedFailed:
					p.shed.report(&p.stats, err, sp.name.String(), false)
				}
				limit = outOfDescriptorsRetry
			} else {
				p.stats.AcceptErrors.Add(1)
			}
			backoff = min(max(2*backoff, 5*time.Millisecond), limit)
			klog.V(2).InfoS("Accept failed; retrying", "service", sp.name, "err", err, "backoff", backoff)
			select {
			case <-time.After(backoff):
			case <-p.ctx.Done():
				return
			}
			continue
		}
		backoff = 0
		p.shed.retake()
		accepted.Add(1)
		p.wg.Add(1)
		go serve(c)
	}
}

// outOfDescriptorsRetry bounds how long a goroutine accept loop that is
// out of descriptors waits before it accepts again, or sheds: about how
// long a client that comes meanwhile waits for its reset.
const outOfDescriptorsRetry = 250 * time.Millisecond

// dialCounters are the counters of a protocol's dials.
type dialCounters struct {
	noEndpoints *atomic.Uint64 // connections refused because the port had no endpoints
	failures    *atomic.Uint64 // failed dials to endpoints (each attempt)
	giveUps     *atomic.Uint64 // connections refused after every dial attempt failed
}

// dialWithFailover connects to an endpoint chosen by b with dial. A failed
// attempt moves on to another endpoint with the next, longer timeout and
// replaces the client's affinity; at most len(DialTimeouts) attempts are
// made.
func dialWithFailover[C any](p *Proxier, b *balancer, role socketRole, client netip.AddrPort, sp *servicePort, n dialCounters, dial func(context.Context, netip.AddrPort) (C, error)) (C, netip.AddrPort, error) {
	var (
		zero    C
		tried   []netip.AddrPort
		lastErr error
	)
	for _, timeout := range p.cfg.DialTimeouts {
		ep, why, err := b.choose(client.Addr(), tried)
		if err != nil {
			n.noEndpoints.Add(1)
			if klog.V(4).Enabled() {
				klog.InfoS("No endpoints; resetting connection", "service", sp.name, "client", client)
			}
			return zero, ep, err
		}
		if !worthDialing(ep, tried, lastErr) {
			break
		}
		if klog.V(4).Enabled() {
			sp.explainPick(b, role, client, ep, why, len(tried)+1)
		}
		ctx, cancel := context.WithTimeout(p.ctx, timeout)
		conn, err := dial(ctx, ep)
		cancel()
		if err == nil {
			return conn, ep, nil
		}
		if isResourceExhausted(err) {
			p.stats.Shed.Add(1)
			p.shed.log(err, sp.name.String())
			return zero, ep, err
		}
		if p.ctx.Err() != nil {
			return zero, ep, p.ctx.Err()
		}
		n.failures.Add(1)
		b.penalize(ep, p.cfg.EndpointPenalty)
		klog.V(3).InfoS("Dial to endpoint failed", "service", sp.name, "endpoint", ep, "client", client, "err", err)
		tried = append(tried, ep)
		lastErr = err
	}
	n.giveUps.Add(1)
	sp.dialGaveUp(lastErr)
	klog.V(2).InfoS("Every dial attempt failed; resetting connection", "service", sp.name, "client", client, "tried", len(tried), "err", lastErr)
	return zero, netip.AddrPort{}, lastErr
}

// worthDialing reports whether ep deserves a dial after the failures so
// far (lastErr, nil before the first). A dial that timed out may succeed
// with the next, longer timeout even on an endpoint already tried (its SYN
// or the answer may have been lost); one refused or unreachable at once
// would fail the same way again, so the connection is given up instead.
func worthDialing(ep netip.AddrPort, tried []netip.AddrPort, lastErr error) bool {
	return lastErr == nil || !slices.Contains(tried, ep) || isDialTimeout(lastErr)
}

func isDialTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, syscall.ETIMEDOUT) ||
		errors.As(err, &ne) && ne.Timeout()
}

// liveSet lets Close find and end the live connections of one kind that
// goroutines serve.
type liveSet[C interface {
	comparable
	abort()
}] struct {
	mu sync.Mutex // guards m
	m  map[C]struct{}
}

// add records c, unless ctx (the proxier's) has ended: then the caller
// must end c itself.
func (s *liveSet[C]) add(ctx context.Context, c C) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if ctx.Err() != nil {
		return false
	}
	if s.m == nil {
		s.m = make(map[C]struct{})
	}
	s.m[c] = struct{}{}
	return true
}

func (s *liveSet[C]) remove(c C) {
	s.mu.Lock()
	delete(s.m, c)
	s.mu.Unlock()
}

func (s *liveSet[C]) abortAll() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for c := range s.m {
		c.abort()
	}
}
