package userspace

import (
	"os"
	"syscall"
	"testing"
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
		shed := s.withSpare(func() bool {
			if s.spare != nil {
				t.Error("the spare is held while a connection is shed")
			}
			return true // one connection accepted with the spare and reset
		})
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
	if s.withSpare(func() bool { return false }) {
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
