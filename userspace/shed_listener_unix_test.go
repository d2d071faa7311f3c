//go:build unix

package userspace

import (
	"errors"
	"net"
	"slices"
	"syscall"
	"testing"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/state"
)

// TestListenerOnTheSparesNumberIsRefused: a listening socket that took the
// number of the spare descriptor (freed for a moment by a shed elsewhere
// while descriptors ran out) is closed, so that the spare takes the number
// back, and the sync fails with EMFILE, which is tried again: the next
// Apply serves the port. The listener used to keep the number for as long
// as its port was served, and new clients then waited instead of being
// reset. Health-check node ports (CountListener) are checked the same way.
func TestListenerOnTheSparesNumberIsRefused(t *testing.T) {
	be := startTCPBackend(t, "a")
	ub := startUDPBackend(t, "u")
	// Served first, so that the event loops, which a first listener
	// starts, hold their descriptors already.
	warm := state.ServicePort{Name: spn("warm", "", state.TCP), Port: 81, ClusterEndpoints: eps(be.addr())}
	for _, tc := range []struct {
		sp     state.ServicePort
		served func(t *testing.T, addr string) error
	}{
		{state.ServicePort{Name: spn("web", "", state.TCP), Port: 80, ClusterEndpoints: eps(be.addr())},
			func(t *testing.T, addr string) error {
				if got := tcpWho(t, addr); got != "a" {
					return errorf("reached %q, want a", got)
				}
				return nil
			}},
		{state.ServicePort{Name: spn("dns", "", state.UDP), Port: 53, ClusterEndpoints: eps(ub.addr())},
			func(t *testing.T, addr string) error {
				if got, err := udpExchange(t, dialUDP(t, addr), []byte("q")); err != nil || string(got) != "q" {
					return errorf("answered %q, %v", got, err)
				}
				return nil
			}},
	} {
		t.Run(string(tc.sp.Name.Protocol), func(t *testing.T) {
			p := newTestProxier(t, Config{})
			mustApply(t, p, warm)
			refusedOnTheSparesNumber(t, p, tc.sp, warm)
			if err := tc.served(t, proxyAddr(t, p, tc.sp.Name)); err != nil {
				t.Fatalf("with the spare back: %v", err)
			}
		})
	}

	t.Run("CountListener", func(t *testing.T) {
		p := newTestProxier(t, Config{})
		listeners := p.fds.listeners.Load()
		loseSpare(p.shed, syscall.EMFILE)
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := p.CountListener(ln); !errors.Is(err, syscall.EMFILE) {
			t.Fatalf("CountListener on the spare's number: %v, want EMFILE", err)
		}
		if _, err := ln.Accept(); !errors.Is(err, net.ErrClosed) {
			t.Fatalf("the refused listener is left open: %v", err)
		}
		if p.shed.missing.Load() {
			t.Error("the spare was not taken back")
		}
		if n := p.fds.listeners.Load(); n != listeners {
			t.Errorf("%d listeners counted, want %d", n, listeners)
		}
	})
}

// refusedOnTheSparesNumber adds sp to p, which serves others, while the
// spare descriptor is lost: sp's listener, the first descriptor opened,
// holds its number. It checks that Apply fails with EMFILE, that sp is not
// served, and that the spare is back and the listener uncounted; then it
// applies again, for the caller to check that sp is served.
func refusedOnTheSparesNumber(t *testing.T, p *Proxier, sp state.ServicePort, others ...state.ServicePort) {
	t.Helper()
	ports := append(slices.Clone(others), sp)
	listeners := p.fds.listeners.Load()
	loseSpare(p.shed, syscall.EMFILE)
	if err := p.Apply(state.NewSnapshot(ports)); !errors.Is(err, syscall.EMFILE) {
		t.Fatalf("Apply with the listener on the spare's number: %v, want EMFILE", err)
	}
	if port := p.ProxyPort(sp.Name); port != 0 {
		t.Errorf("port %d served on the spare's number", port)
	}
	if p.shed.missing.Load() {
		t.Error("the spare was not taken back")
	}
	if n := p.fds.listeners.Load(); n != listeners {
		t.Errorf("%d listeners counted, want %d", n, listeners)
	}
	mustApply(t, p, ports...)
}
