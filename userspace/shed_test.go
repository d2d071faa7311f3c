package userspace

import (
	"os"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// TestShedderTakesBackItsSpare: when the spare descriptor cannot be taken
// back after a shed (another loop took the freed descriptor), the next
// accepted connection, which shows a descriptor is free again, takes it
// back, so the next time descriptors run out a connection is shed again
// instead of waiting in the backlog for good.
func TestShedderTakesBackItsSpare(t *testing.T) {
	full := false // the process is out of descriptors
	s := newShedder()
	defer s.close()
	s.open = func() (*os.File, error) {
		if full {
			return nil, syscall.EMFILE
		}
		return os.Open(os.DevNull)
	}
	var stats Stats
	shedOnce := func() bool {
		shed := s.withSpare(func() shedResult {
			if s.spare != nil {
				t.Error("the spare is held while a connection is shed")
			}
			return shedOne // one connection accepted with the spare and reset
		}) == shedOne
		s.report(&stats, syscall.EMFILE, "test/web", shed)
		return shed
	}

	full = true // another loop takes the descriptor the spare gave up
	if !shedOnce() {
		t.Fatal("the first shed failed")
	}
	if s.spare != nil || !s.missing.Load() {
		t.Fatalf("spare %v, missing %v: want it missing", s.spare, s.missing.Load())
	}
	// Without a spare nothing can be shed, and nothing is counted.
	if s.withSpare(func() shedResult { return shedFailed }) != shedFailed {
		t.Fatal("shed without a spare")
	}
	s.report(&stats, syscall.EMFILE, "test/web", false)
	if n := stats.Shed.Load(); n != 1 {
		t.Errorf("Shed = %d, want 1: only connections really shed count", n)
	}

	s.retake() // still full: stays missing, no harm
	if s.spare != nil || !s.missing.Load() {
		t.Fatal("retake while out of descriptors")
	}
	full = false // a connection was accepted: descriptors are free
	s.retake()
	if s.spare == nil || s.missing.Load() {
		t.Fatalf("spare %v, missing %v after retake: want it back", s.spare, s.missing.Load())
	}
	if !shedOnce() || stats.Shed.Load() != 2 {
		t.Errorf("shed after the spare came back: Shed = %d, want 2", stats.Shed.Load())
	}
}

// TestShedderTriesAgainWhenItsFreedDescriptorIsTaken: another goroutine
// that opens a descriptor just as the spare is given up (a dial, a scrape
// of /metrics reading /proc/self/fd) takes the number the shed meant to
// accept with, and the accept fails. That descriptor is usually closed a
// moment later: the shedder tries again then, sheds the connection and
// has its spare back, where it used to leave the client waiting and log
// that the proxy had no spare.
func TestShedderTriesAgainWhenItsFreedDescriptorIsTaken(t *testing.T) {
	s := newShedder()
	defer s.close()
	taken := true // by another goroutine, for the first try
	s.open = func() (*os.File, error) {
		if taken {
			return nil, syscall.EMFILE
		}
		return os.Open(os.DevNull)
	}
	tries := 0
	r := s.withSpare(func() shedResult {
		tries++
		if tries == 1 {
			taken = true
			return shedFailed // accept: EMFILE, the descriptor is taken
		}
		return shedOne
	})
	if r != shedOne || tries != 2 {
		t.Fatalf("withSpare = %v after %d tries; want a shed on the second", r, tries)
	}
	taken = false
	if r := s.withSpare(func() shedResult { return shedOne }); r != shedOne || s.spare == nil || s.missing.Load() {
		t.Fatalf("after the retry: %v, spare %v, missing %v; want it back", r, s.spare, s.missing.Load())
	}
	tries = 0
	if r := s.withSpare(func() shedResult { tries++; return shedFailed }); r != shedFailed || tries != spareTries {
		t.Fatalf("a shed that keeps failing: %v after %d tries; want shedFailed after %d", r, tries, spareTries)
	}
}

// TestShedderRetakeAsksForAShedOnlyForWantOfDescriptors: retake says the
// connection just accepted must be shed only when the spare is missing
// because descriptors ran out; a spare that cannot be opened for another
// reason (no /dev/null in the container) never costs a connection, or
// every client would be reset.
func TestShedderRetakeAsksForAShedOnlyForWantOfDescriptors(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{nil, true},
		{syscall.EMFILE, false},
		{syscall.ENFILE, false},
		{syscall.ENOENT, true},
		{syscall.EACCES, true},
	} {
		s := newShedder()
		dropSpare(s)
		s.missing.Store(true)
		s.open = func() (*os.File, error) {
			if tc.err != nil {
				return nil, tc.err
			}
			return os.Open(os.DevNull)
		}
		if got := s.retake(); got != tc.want {
			t.Errorf("retake with the spare's open failing with %v: %v, want %v", tc.err, got, tc.want)
		}
		s.close()
	}
}

// TestShedderTookSpare: a socket opened while the spare is missing for
// want of descriptors is ended, and the spare takes its number back; with
// the spare in hand, or missing for another reason, the socket is kept.
func TestShedderTookSpare(t *testing.T) {
	for _, tc := range []struct {
		missing bool
		err     error
		took    bool
	}{
		{false, nil, false},
		{true, syscall.EMFILE, true},
		{true, syscall.EACCES, false},
	} {
		s := newShedder()
		if tc.missing {
			loseSpare(s, tc.err)
		}
		ended := false
		if got := s.tookSpare(func() { ended = true }); got != tc.took || ended != tc.took {
			t.Errorf("spare missing %v (%v): tookSpare = %v, socket ended %v; want %v", tc.missing, tc.err, got, ended, tc.took)
		}
		if tc.took && (s.spare == nil || s.missing.Load()) {
			t.Errorf("spare missing (%v): not taken back after the socket ended", tc.err)
		}
		s.close()
	}
}

// loseSpare makes s's spare missing, as a shed elsewhere leaves it when a
// socket took its number: its next reopening fails with err, and those
// after it succeed (the socket was ended). It holds s's lock, under which
// the loops open the spare.
func loseSpare(s *shedder, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.dropSpareLocked()
	s.missing.Store(true)
	opens := 0
	s.open = func() (*os.File, error) {
		if opens++; opens == 1 {
			return nil, err
		}
		return os.Open(os.DevNull)
	}
}

// dropSpare closes s's spare, as a shed does for a moment, and leaves s
// open.
func dropSpare(s *shedder) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.dropSpareLocked()
}

// TestShedderClosedOpensNoSpare: once closed (the proxier closing), the
// shedder opens no spare again, which nothing would close: a loop may
// shed, or open a socket for a connection, before it stops. Sockets are
// not ended for want of the spare meanwhile, even if it was missing for
// want of descriptors when the shedder closed.
func TestShedderClosedOpensNoSpare(t *testing.T) {
	s := newShedder()
	loseSpare(s, syscall.EMFILE)
	s.close()
	opened := 0
	s.open = func() (*os.File, error) {
		opened++
		return os.Open(os.DevNull)
	}
	if r := s.withSpare(func() shedResult { return shedOne }); r != shedOne {
		t.Errorf("withSpare after close = %v, want shedOne (f's answer)", r)
	}
	if !s.retake() {
		t.Error("retake after close reports the spare missing for want of descriptors")
	}
	ended := false
	if s.tookSpare(func() { ended = true }) || ended {
		t.Error("a socket opened after close was ended for want of the spare")
	}
	if opened != 0 || s.spare != nil {
		t.Errorf("after close the spare was opened %d times (held: %v), want never", opened, s.spare)
	}
	if s.missing.Load() {
		t.Error("the spare counts as missing after close")
	}
}

// spareHeldElsewhere is a shedder whose spare cannot be opened while the
// returned flag is set: a socket opened for a connection holds the number
// the spare had.
func spareHeldElsewhere(t *testing.T) (*shedder, *atomic.Bool) {
	s := newShedder()
	t.Cleanup(s.close)
	var held atomic.Bool
	s.open = func() (*os.File, error) {
		if held.Load() {
			return nil, syscall.EMFILE
		}
		return os.Open(os.DevNull)
	}
	return s, &held
}

// TestShedderSocketOpenedWhileTheSpareIsGivenUp: a socket opened for a
// connection by another loop (its accept, or a dial) while a shed has
// given the spare up may take the spare's number. Its check waits for the
// shed to end, then gives the number back. It used to find the spare in
// hand, since the spare counted as missing only once the shed could not
// take it back: the connection kept the number, the spare was lost, and
// the clients after it waited instead of being reset (a CI run of
// TestBinaryOutOfDescriptorsShedsNewClients).
func TestShedderSocketOpenedWhileTheSpareIsGivenUp(t *testing.T) {
	s, held := spareHeldElsewhere(t)
	checked := make(chan bool, 1)
	r := s.withSpare(func() shedResult {
		held.Store(true) // the other loop's socket takes the number
		go func() { checked <- s.tookSpare(func() { held.Store(false) }) }()
		select {
		case took := <-checked:
			t.Fatalf("the socket's check returned %v while the shed was under way; want it to wait", took)
		case <-time.After(100 * time.Millisecond):
		}
		return shedNone // its own accept found nothing waiting
	})
	if r != shedNone {
		t.Fatalf("withSpare = %v, want shedNone", r)
	}
	if took := <-checked; !took || held.Load() {
		t.Fatalf("tookSpare = %v, socket still open %v; want it ended", took, held.Load())
	}
	if s.spare == nil || s.missing.Load() {
		t.Fatal("the spare was not taken back")
	}
}

// TestShedderLetsTheSocketOnItsNumberEndBetweenTries: when a shed's own
// accept fails because a connection's socket took the freed number, the
// socket's check can end it while the shedder waits to try again, and the
// next try sheds the connection with the spare. The shedder used to hold
// its lock while it waited, so every try failed and the client waited.
func TestShedderLetsTheSocketOnItsNumberEndBetweenTries(t *testing.T) {
	s, held := spareHeldElsewhere(t)
	s.pause = func() {
		checked := make(chan bool, 1)
		go func() { checked <- s.tookSpare(func() { held.Store(false) }) }()
		select {
		case took := <-checked:
			if !took {
				t.Error("the socket on the spare's number was kept")
			}
		case <-time.After(5 * time.Second):
			t.Error("the socket's check waited for the shedder's pause")
		}
	}
	tries := 0
	r := s.withSpare(func() shedResult {
		if tries++; tries == 1 {
			held.Store(true) // another loop's socket took the freed number
		}
		if held.Load() {
			return shedFailed // accept: EMFILE
		}
		return shedOne
	})
	if r != shedOne || tries != 2 {
		t.Fatalf("withSpare = %v after %d tries; want a shed on the second", r, tries)
	}
	if s.spare == nil || s.missing.Load() {
		t.Fatal("the spare was not taken back")
	}
}
