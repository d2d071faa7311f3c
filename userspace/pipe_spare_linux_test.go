//go:build linux && !goroutines

package userspace

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"io"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/state"
)

// TestSplicePipeOnTheSparesNumberIsClosed: a splice pipe made while the
// spare descriptor is missing for want of descriptors (given up for a
// moment by a shed on another loop) may hold the spare's number, and the
// pool would keep it for good. It is closed instead, the spare takes the
// number back, and the bulk data goes through memory, whole.
func TestSplicePipeOnTheSparesNumberIsClosed(t *testing.T) {
	be := startTCPBackend(t, "a")
	p := newTestProxier(t, Config{})
	name := spn("web", "http", state.TCP)
	mustApply(t, p, state.ServicePort{Name: name, Port: 80, ClusterEndpoints: eps(be.addr())})
	c, err := net.Dial("tcp", proxyAddr(t, p, name))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	r := bufio.NewReader(c)
	if greeting, err := r.ReadString('\n'); err != nil || greeting != "a\n" {
		t.Fatalf("greeting %q, %v", greeting, err)
	}
	// No pipe in the pool, so the bulk data below makes one.
	for drained := false; !drained; {
		select {
		case pp := <-idlePipes:
			pp.close()
		default:
			drained = true
		}
	}
	loseSpare(p.shed, syscall.EMFILE) // the new pipe holds the number

	payload := make([]byte, 1<<20)
	rand.Read(payload)
	go c.Write(payload)
	got := make([]byte, len(payload))
	if _, err := io.ReadFull(r, got); err != nil || !bytes.Equal(got, payload) {
		t.Fatalf("echo of 1 MiB: %v, equal %v", err, bytes.Equal(got, payload))
	}
	p.shed.mu.Lock()
	defer p.shed.mu.Unlock()
	if p.shed.missing.Load() || p.shed.spare == nil {
		t.Error("the spare was not taken back")
	}
}
