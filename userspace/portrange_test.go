package userspace

import (
	"errors"
	"fmt"
	"maps"
	"testing"
	"time"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/state"
)

func TestParsePortRange(t *testing.T) {
	tests := []struct {
		in      string
		want    PortRange
		wantErr bool
	}{
		{in: "", want: PortRange{}},
		{in: "0", want: PortRange{}},
		{in: "0-0", want: PortRange{}},
		{in: "30000-30009", want: PortRange{Base: 30000, Size: 10}},
		{in: "30000+9", want: PortRange{Base: 30000, Size: 10}},
		{in: "30000+0", want: PortRange{Base: 30000, Size: 1}},
		{in: "8080", want: PortRange{Base: 8080, Size: 1}},
		{in: " 1-65535 ", want: PortRange{Base: 1, Size: 65535}},
		{in: "30009-30000", wantErr: true},
		// An end just before the begin is no empty range.
		{in: "2000-1999", wantErr: true},
		{in: "2000-2000", want: PortRange{Base: 2000, Size: 1}},
		{in: "65535+1", wantErr: true},
		{in: "0-10", wantErr: true},
		{in: "abc", wantErr: true},
		{in: "1-", wantErr: true},
		{in: "-5", wantErr: true},
		{in: "70000", wantErr: true},
		{in: "1+x", wantErr: true},
		// As kube-proxy's utilnet.ParsePortRange: only the whole value
		// is trimmed.
		{in: "30000 - 30100", wantErr: true},
		{in: "30000 -30100", wantErr: true},
		{in: "30000- 30100", wantErr: true},
		{in: "30000 + 9", wantErr: true},
		{in: "30000\t-30100", wantErr: true},
		{in: "\t30000-30100\n", want: PortRange{Base: 30000, Size: 101}},
	}
	for _, tc := range tests {
		t.Run(tc.in, func(t *testing.T) {
			got, err := ParsePortRange(tc.in)
			if (err != nil) != tc.wantErr {
				t.Fatalf("ParsePortRange(%q) error = %v, wantErr %v", tc.in, err, tc.wantErr)
			}
			if err == nil && got != tc.want {
				t.Fatalf("ParsePortRange(%q) = %+v, want %+v", tc.in, got, tc.want)
			}
		})
	}
}

func FuzzParsePortRange(f *testing.F) {
	for _, s := range []string{"", "0", "1-2", "100+5", "65535", "x-y", "5-1", "1+65535"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		r, err := ParsePortRange(s)
		if err != nil {
			return
		}
		if r.Size < 0 || int(r.Base)+r.Size-1 > 65535 || (r.Size > 0 && r.Base == 0) {
			t.Fatalf("ParsePortRange(%q) = %+v: out of bounds", s, r)
		}
		if r.Size > 0 {
			back, err := ParsePortRange(r.String())
			if err != nil || back != r {
				t.Fatalf("round trip of %q via %q = %+v, %v", s, r.String(), back, err)
			}
		}
	})
}

func TestPortAllocator(t *testing.T) {
	t.Run("kernel chosen", func(t *testing.T) {
		a := newPortAllocator(PortRange{}, time.Now)
		if p, err := a.allocate("x", "x"); p != 0 || err != nil {
			t.Fatalf("allocate() = %d, %v; want 0, nil", p, err)
		}
	})
	t.Run("exhaust and release", func(t *testing.T) {
		a := newPortAllocator(PortRange{Base: 1000, Size: 3}, time.Now)
		seen := map[uint16]bool{}
		for range 3 {
			p, err := a.allocate("x", "x")
			if err != nil || !a.r.Contains(p) || seen[p] {
				t.Fatalf("allocate() = %d, %v (seen %v)", p, err, seen)
			}
			seen[p] = true
		}
		if _, err := a.allocate("x", "x"); !errors.Is(err, ErrPortRangeExhausted) {
			t.Fatalf("allocate on a full range: %v, want ErrPortRangeExhausted", err)
		}
		a.release(1001)
		if p, err := a.allocate("x", "x"); p != 1001 || err != nil {
			t.Fatalf("allocate after release = %d, %v; want 1001", p, err)
		}
		a.release(5) // outside: ignored
		if a.claim(1001) {
			t.Fatal("claim of a used port succeeded")
		}
	})
	t.Run("a retired port goes to others last", func(t *testing.T) {
		clock := newFakeClock()
		a := newPortAllocator(PortRange{Base: 1000, Size: 3}, clock.Now)
		var got []uint16
		for range 3 {
			p, _ := a.allocate("a", "a")
			got = append(got, p)
		}
		a.retire(got[0], "a")
		a.release(got[1]) // a rollback, not a service port giving it up
		if p, err := a.allocate(fmt.Sprint(got[0]-1000), "b"); p != got[1] || err != nil {
			t.Fatalf("another owner got %d, %v; want %d, the port not just given up", p, err, got[1])
		}
		if p, err := a.allocate("x", "b"); p != got[0] || err != nil {
			t.Fatalf("with no other port free, another owner got %d, %v; want the retired %d", p, err, got[0])
		}
		a.retire(got[0], "b")
		if p, _ := a.allocate("x", "b"); p != got[0] {
			t.Fatalf("its own owner got %d back; want %d", p, got[0])
		}
		a.retire(got[0], "b")
		a.release(got[1])
		clock.Step(reuseDelay)
		// Past reuseDelay the key decides again: find a key whose scan
		// starts at the retired port.
		for i := range 100 {
			key := fmt.Sprint(i)
			h := newPortAllocator(PortRange{Base: 1000, Size: 3}, clock.Now)
			if p, _ := h.allocate(key, key); p != got[0] {
				continue
			}
			if p, _ := a.allocate(key, "c"); p != got[0] {
				t.Fatalf("after reuseDelay, key %q got %d; want %d, where it starts", key, p, got[0])
			}
			return
		}
		t.Fatal("no key starts at the retired port")
	})
	// The owner that gave a port up takes it back, though other ports are
	// free, where its key starts the scan; another owner passes over it.
	t.Run("a retired port goes back to its owner first", func(t *testing.T) {
		clock := newFakeClock()
		a := newPortAllocator(PortRange{Base: 1000, Size: 10}, clock.Now)
		p, err := a.allocate("k", "a")
		if err != nil {
			t.Fatal(err)
		}
		a.retire(p, "a")
		if got, err := a.allocate("k", "b"); got == p || err != nil {
			t.Fatalf("another owner with the same key got %d, %v; want any free port but the retired %d", got, err, p)
		}
		if got, err := a.allocate("k", "a"); got != p || err != nil {
			t.Fatalf("the owner got %d, %v back with other ports free; want its retired %d", got, err, p)
		}
	})
	t.Run("the key decides the start", func(t *testing.T) {
		firsts := map[uint16]bool{}
		for i := range 20 {
			key := fmt.Sprintf("ns/svc-%d:http/TCP", i)
			p, _ := newPortAllocator(PortRange{Base: 2000, Size: 100}, time.Now).allocate(key, key)
			again, _ := newPortAllocator(PortRange{Base: 2000, Size: 100}, time.Now).allocate(key, key)
			if p != again {
				t.Fatalf("%s: %d, then %d from a fresh allocator", key, p, again)
			}
			firsts[p] = true
		}
		if len(firsts) < 10 {
			t.Fatalf("20 keys started at only %v", firsts)
		}
	})
}

// TestProxyPortsSurviveARestart: a new proxier given the same Services
// gives each service port the proxy port it had. With --portal=none clients
// use proxy ports directly, and nothing else remembers them.
func TestProxyPortsSurviveARestart(t *testing.T) {
	be := startTCPBackend(t, "a")
	var ports []state.ServicePort
	for _, n := range []string{"web", "api", "db", "cache", "queue"} {
		ports = append(ports, state.ServicePort{Name: spn(n, "", state.TCP), Port: 80, ClusterEndpoints: eps(be.addr())})
	}
	// A free run outside the ephemeral ports: a fixed one was in them, and
	// test processes run side by side took the same one.
	r := PortRange{Base: freePortRun(t, 200), Size: 200}
	run := func() map[state.ServicePortName]uint16 {
		p := New(Config{PortRange: r})
		defer p.Close()
		mustApply(t, p, ports...)
		got := make(map[state.ServicePortName]uint16)
		for _, sp := range ports {
			got[sp.Name] = p.ProxyPort(sp.Name)
		}
		return got
	}
	first, second := run(), run()
	if !maps.Equal(first, second) {
		t.Fatalf("proxy ports moved across a restart: %v, then %v", first, second)
	}
}

// TestPortRangeEnds: the ports just outside a range, Base-1 and
// Base+Size, are not in it, and the allocator refuses to claim them and
// ignores their release, as it does for any port outside.
func TestPortRangeEnds(t *testing.T) {
	r := PortRange{Base: 1000, Size: 3}
	for port, want := range map[uint16]bool{999: false, 1000: true, 1002: true, 1003: false} {
		if got := r.Contains(port); got != want {
			t.Errorf("%v.Contains(%d) = %v, want %v", r, port, got, want)
		}
	}
	for _, port := range []uint16{999, 1003} {
		t.Run(fmt.Sprint(port), func(t *testing.T) {
			a := newPortAllocator(r, time.Now)
			noPanic(t, "claim", func() {
				if a.claim(port) {
					t.Errorf("claim(%d) succeeded in %v", port, r)
				}
			})
			noPanic(t, "release", func() { a.release(port) })
			noPanic(t, "retire", func() { a.retire(port, "a") })
			// The range is whole: three ports to hand out, then none.
			for range 3 {
				if p, err := a.allocate("x", "x"); err != nil || !r.Contains(p) {
					t.Fatalf("allocate() = %d, %v", p, err)
				}
			}
			if p, err := a.allocate("x", "x"); !errors.Is(err, ErrPortRangeExhausted) {
				t.Fatalf("allocate on a full range: %d, %v; want ErrPortRangeExhausted", p, err)
			}
		})
	}
}

// noPanic runs f, failing the test if it panics rather than crashing the
// package.
func noPanic(t *testing.T, what string, f func()) {
	t.Helper()
	defer func() {
		if v := recover(); v != nil {
			t.Errorf("%s panicked: %v", what, v)
		}
	}()
	f()
}

// TestPreferredPortPastAShrunkRange: a previous run's proxy port just
// outside the range, which shrank since (or moved up by one), is not
// taken: the service port gets one from the range, and Apply does not
// fail.
func TestPreferredPortPastAShrunkRange(t *testing.T) {
	be := startTCPBackend(t, "a")
	// Free ports, and free just outside too, so that a proxy port taken
	// there would bind.
	r := PortRange{Base: freePortRun(t, 6) + 1, Size: 4}
	for _, prev := range []uint16{r.Base + uint16(r.Size), r.Base - 1} {
		t.Run(fmt.Sprint(prev), func(t *testing.T) {
			p := newTestProxier(t, Config{PortRange: r,
				PreferredProxyPort: func(*state.ServicePort, bool) uint16 { return prev }})
			name := spn("shrunk", "", state.TCP)
			noPanic(t, "Apply", func() {
				mustApply(t, p, state.ServicePort{Name: name, Port: 80, ClusterEndpoints: eps(be.addr())})
			})
			if got := p.ProxyPort(name); !r.Contains(got) {
				t.Fatalf("proxy port %d with the previous %d outside %v; want one from the range", got, prev, r)
			}
			if got := tcpWho(t, proxyAddr(t, p, name)); got != "a" {
				t.Fatalf("reached %q", got)
			}
		})
	}
}
