package proxyserver

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"syscall"
	"testing"
	"time"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/state"
)

// TestRetryAfterStaysWithinResync: a sync that keeps failing is retried
// after pauses that double from retryMin and never pass the sync period;
// one short of file descriptors is retried at retryMin, at most a second
// apart, however long the pause before it was.
func TestRetryAfterStaysWithinResync(t *testing.T) {
	l := newSyncLoop(nil, 100*time.Millisecond, 30*time.Second)
	var backoff time.Duration
	var got []time.Duration
	for range 12 {
		backoff = l.retryAfter(false, backoff)
		got = append(got, backoff)
	}
	want := []time.Duration{100 * time.Millisecond, 200 * time.Millisecond, 400 * time.Millisecond, 800 * time.Millisecond,
		1600 * time.Millisecond, 3200 * time.Millisecond, 6400 * time.Millisecond, 12800 * time.Millisecond, 25600 * time.Millisecond,
		30 * time.Second, 30 * time.Second, 30 * time.Second}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("pauses after 12 failures in a row: %v, want %v (doubling from retryMin, never past the sync period)", got, want)
	}

	// Short of descriptors after a long run of failures, or from the start.
	for _, tc := range []struct {
		retryMin, backoff, want time.Duration
	}{
		{100 * time.Millisecond, 0, 100 * time.Millisecond},
		{100 * time.Millisecond, 25600 * time.Millisecond, 100 * time.Millisecond},
		{100 * time.Millisecond, 30 * time.Second, 100 * time.Millisecond},
		{5 * time.Second, 30 * time.Second, time.Second},
	} {
		l := newSyncLoop(nil, tc.retryMin, 30*time.Second)
		if got := l.retryAfter(true, tc.backoff); got != tc.want {
			t.Errorf("short of descriptors, retryMin %v, last pause %v: retry in %v, want %v (at most a second)", tc.retryMin, tc.backoff, got, tc.want)
		}
	}
	// Several fdShort failures in a row, the loop's own sequence.
	backoff = 0
	for i := range 8 {
		backoff = l.retryAfter(true, backoff)
		if backoff > time.Second {
			t.Fatalf("fdShort failure %d: retry in %v, want at most 1s", i+1, backoff)
		}
	}
	if !shortOfFDs(joinErrors(errors.New("listen: address in use"), fmt.Errorf("listen: %w", syscall.EMFILE))) {
		t.Error("a sync error holding EMFILE is not taken for a shortage of file descriptors")
	}
}

// TestChangeDuringSyncWaitsForTheNextSync: a change offered while a sync
// runs is not applied by it, so it waits from that sync's start: when the
// sync after fails in the portal, /healthz turns 503 once the health
// timeout has passed since then, as kube-proxy's QueuedUpdate keeps it.
func TestChangeDuringSyncWaitsForTheNextSync(t *testing.T) {
	clock := &fakeNow{t: time.Now()}
	h := newProxyHealth(time.Minute)
	h.now, h.started = clock.now, clock.t
	results, applied := make(chan error), make(chan struct{})
	started := make(chan int, 1)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	l := newSyncLoop(func(s state.Snapshot) error {
		select {
		case started <- s.Len():
		default:
		}
		select {
		case err := <-results:
			select {
			case applied <- struct{}{}:
			case <-ctx.Done():
			}
			return err
		case <-ctx.Done():
			return ctx.Err()
		}
	}, 10*time.Millisecond, time.Hour)
	l.health = h
	done := make(chan struct{})
	go func() { l.run(ctx); close(done) }()
	defer func() {
		cancel()
		select {
		case <-done:
		case <-time.After(scriptTimeout):
			t.Errorf("the sync loop did not stop within %v of its context's end", scriptTimeout)
		}
	}()
	healthz := func() int {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/healthz", nil))
		return rec.Code
	}

	l.offer(snapOf(1))
	// The first apply is under way (it waits on results): a second offer
	// comes during it.
	select {
	case n := <-started:
		if n != 1 {
			t.Fatalf("the first apply had %d service ports, want 1", n)
		}
	case <-time.After(scriptTimeout):
		t.Fatalf("no apply started within %v of the offer", scriptTimeout)
	}
	l.offer(snapOf(2))
	syncWith(t, results, applied, nil, "the sync that ran during the second offer")
	syncWith(t, results, applied, kernelError{errors.New("iptables-restore failed")}, "the sync of the second offer")
	clock.t = time.Now() // the sync's start is at or before this
	if code := healthz(); code != http.StatusOK {
		t.Fatalf("/healthz %d before the health timeout, want 200", code)
	}
	clock.t = clock.t.Add(time.Minute + time.Second)
	if code := healthz(); code != http.StatusServiceUnavailable {
		t.Fatalf("/healthz %d a minute after a change that came during a sync and whose own sync failed, want 503", code)
	}
}
