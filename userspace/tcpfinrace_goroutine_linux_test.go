//go:build linux && goroutines

package userspace

import (
	"bytes"
	"fmt"
	"sync"
	"testing"
	"time"
)

// TestTCPResetAfterFINWriteTakesTheError: when a side sends its FIN and
// is then reset, and the other direction's write to it takes the
// socket's error (EPIPE) before the direction reading it reaches the
// EOF, that EOF is still passed on as the FIN, after all the side sent,
// and the reader is not cut short. The reading direction, finding the
// socket reset with no error left to say when, took the EOF for a reset
// before the FIN unless the write's report came first: the reader got
// no FIN and was reset after resetDrain (2 s), with what the proxy still
// held. The hook holds the write's report until the reading direction
// has decided, the order that lost.
func TestTCPResetAfterFINWriteTakesTheError(t *testing.T) {
	const size = 128 << 10
	payload := bytes.Repeat([]byte("0123456789abcdef"), size/16)
	writeFailed := make(chan struct{})
	var once sync.Once
	hookErr := make(chan error, 1)
	testHookWriteFailed = func(tc *tcpConn, side int) {
		if side != 1 {
			return
		}
		once.Do(func() { close(writeFailed) })
		// Hold the report until the direction reading the endpoint has
		// reached its EOF and decided (or has reported a failure).
		deadline := time.Now().Add(10 * time.Second)
		for !tc.eofUnderReset[1].Load() && tc.failed.Load() == 0 {
			if time.Now().After(deadline) {
				hookErr <- fmt.Errorf("the direction reading the endpoint did not reach its EOF")
				return
			}
			time.Sleep(time.Millisecond)
		}
	}
	// Registered first, so it runs last, once the proxier has closed
	// and no connection is left to call the hook.
	t.Cleanup(func() { testHookWriteFailed = nil })

	f := newFINFirstConn(t, "endpoint", payload)
	// The client talks on: the proxy's write to the endpoint's socket
	// takes its error, while the direction to the client waits for the
	// client to read (it would look at the endpoint at stallCheck, 5 s).
	if _, err := f.reader.Write([]byte("more")); err != nil {
		t.Fatal(err)
	}
	select {
	case <-writeFailed:
	case <-time.After(4 * time.Second):
		t.Fatal("the proxy's write to the endpoint did not fail")
	}
	got, err := readUntilError(f.reader)
	if len(got) != size || !bytes.Equal(got, payload) || err != nil {
		t.Fatalf("the client read %d of %d bytes (intact: %v), then %v; want all of them and EOF", len(got), size, bytes.Equal(got, payload[:min(len(got), size)]), err)
	}
	select {
	case err := <-hookErr:
		t.Fatal(err)
	default:
	}
	f.reader.Close()
	f.ended(t, 10*time.Second)
	noLeaks(t, f.sockets, f.goroutines)
}
