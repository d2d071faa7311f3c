package proxyserver

import (
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/state"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/userspace"
)

// countedError is a sync failure that counts how often it is worded.
type countedError struct {
	msg   string
	calls *int
}

func (e countedError) Error() string { *e.calls++; return e.msg }

// TestDebugServicesWordsEachFailureOnce: with thousands of service ports
// whose sync failed (a --proxy-port-range too small for them), the view
// words each failure a bounded number of times, and names each port's own.
// It looked every port up in every failure, (failing ports)² of them:
// 20 s of CPU for one request with 9,100 failing ports (xa59).
func TestDebugServicesWordsEachFailureOnce(t *testing.T) {
	p := userspace.New(userspace.Config{})
	t.Cleanup(func() { p.Close() })
	d := &debugView{p: p, mode: PortalNone}
	const n = 3000
	var calls int
	sps, err := failingPorts(n, &calls)
	var b strings.Builder
	d.write(&b, &debugSnapshot{snap: state.NewSnapshot(sps), err: err})
	// Once to find its port, once on its port's line, and the first few
	// once more in the header.
	if most := 2*n + maxShownErrors; calls > most {
		t.Errorf("%d failures worded %d times, more than %d", n, calls, most)
	}
	view := b.String()
	for _, sp := range sps {
		want := fmt.Sprintf("  listening:    none: the last sync failed for it, and is retried: userspace: service %s: open proxy port: no free port in 25100-25199\n", sp.Name)
		if s := portSection(view, sp.Name); !strings.Contains(s, want) {
			t.Fatalf("lacks %q:\n%s", want, s)
		}
	}
}

// BenchmarkDebugServicesFailingPorts: the view of 10,000 service ports,
// every one of which failed to sync.
func BenchmarkDebugServicesFailingPorts(b *testing.B) {
	p := userspace.New(userspace.Config{})
	b.Cleanup(func() { p.Close() })
	d := &debugView{p: p, mode: PortalNone}
	var calls int
	sps, err := failingPorts(10000, &calls)
	last := &debugSnapshot{snap: state.NewSnapshot(sps), err: err}
	b.ReportAllocs()
	for b.Loop() {
		d.write(io.Discard, last)
	}
}

// failingPorts returns n service ports and a sync error with a failure
// for each, as Apply words a proxy port range with none left; each
// failure counts its wording in calls.
func failingPorts(n int, calls *int) ([]state.ServicePort, error) {
	var sps []state.ServicePort
	var errs []error
	for i := range n {
		sp := state.ServicePort{Name: state.ServicePortName{Namespace: "t", Name: "many", Port: fmt.Sprintf("p%d", i), Protocol: state.TCP}, Port: uint16(i + 1)}
		sps = append(sps, sp)
		errs = append(errs, countedError{fmt.Sprintf("userspace: service %s: open proxy port: no free port in 25100-25199", sp.Name), calls})
	}
	return sps, joinErrors(errs...)
}

// TestDebugServicesFindsEachPortsFailure: each port without a socket shows
// the first failure of the sync that names it ("service <name>:"),
// wherever the failure names it, however many ports a failure names, and
// a name that begins another's is told apart from it; as when each port
// was looked up in every failure (oldNotListening).
func TestDebugServicesFindsEachPortsFailure(t *testing.T) {
	name := func(ns, n, port string, proto state.Protocol) state.ServicePortName {
		return state.ServicePortName{Namespace: ns, Name: n, Port: port, Protocol: proto}
	}
	names := []state.ServicePortName{
		name("e2e", "app", "http", state.TCP),
		name("e2e", "app", "", state.TCP),
		name("e2e", "app", "http", state.UDP),
		name("e2e", "ap", "", state.TCP),
		name("e2e", "web", "a:b", state.TCP), // no port name has a colon; a manifest's might
		name("e2e", "web", "a", state.TCP),
		name("e2e", "quiet", "dns", state.UDP),
	}
	for _, tc := range []struct {
		name string
		errs []error
	}{
		{"one each", []error{
			fmt.Errorf("userspace: service %s: listen on 0.0.0.0:30062 (node-port): bind: address already in use", names[0]),
			fmt.Errorf("userspace: service %s: open proxy port: no free port", names[2]),
		}},
		{"the first of two", []error{
			fmt.Errorf("userspace: service %s: first", names[0]),
			fmt.Errorf("userspace: service %s: second", names[0]),
		}},
		{"two in one", []error{
			fmt.Errorf("health check: service %s: port 30100 is also service %s: port 30100", names[3], names[1]),
			fmt.Errorf("userspace: service %s: later", names[1]),
		}},
		{"colons in names", []error{
			fmt.Errorf("userspace: service %s: listen on [fd5e:b1b5::60]:80 (external-ip): bind: cannot assign requested address", names[4]),
			fmt.Errorf("userspace: service %s: x", names[5]),
		}},
		{"named without the colon, or as another word", []error{
			fmt.Errorf("userspace: service %s", names[0]),
			fmt.Errorf("userspace: the service %s; service %s:", names[1], "e2e/ap"),
			fmt.Errorf("userspace: service service %s: doubled", names[6]),
		}},
		{"nested", []error{
			joinErrors(fmt.Errorf("userspace: service %s: inner", names[5]), fmt.Errorf("userspace: service %s: inner", names[2])),
			fmt.Errorf("userspace: service %s: outer", names[2]),
		}},
		{"not a service's", []error{kernelError{errors.New("portal: iptables: restore: exit status 4")}}},
		{"one failure alone", []error{fmt.Errorf("userspace: service %s: alone", names[6])}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := userspace.New(userspace.Config{})
			t.Cleanup(func() { p.Close() })
			d := &debugView{p: p, mode: PortalNone}
			var sps []state.ServicePort
			for i, n := range names {
				sps = append(sps, state.ServicePort{Name: n, Port: uint16(80 + i)})
			}
			err := joinErrors(tc.errs...)
			var b strings.Builder
			d.write(&b, &debugSnapshot{snap: state.NewSnapshot(sps), err: err})
			view := b.String()
			for _, n := range names {
				want := fmt.Sprintf("  listening:    %s\n", oldNotListening(n, err))
				if s := portSection(view, n); !strings.Contains(s, want) {
					t.Errorf("lacks %q:\n%s", want, s)
				}
			}
		})
	}
}

// oldNotListening is how a port's failure was found before it was looked
// up in an index: in every failure of the sync, for every port.
func oldNotListening(name state.ServicePortName, syncErr error) string {
	if syncErr != nil {
		for _, e := range splitErrors(syncErr) {
			if strings.Contains(e.Error(), "service "+name.String()+":") {
				return fmt.Sprintf("none: the last sync failed for it, and is retried: %v", e)
			}
		}
	}
	return "none"
}

// portSection returns the lines of view about service port name, from its
// name to the blank line after them.
func portSection(view string, name state.ServicePortName) string {
	head := "\n" + name.String() + "\n"
	i := strings.Index(view, head)
	if i < 0 {
		return "(no " + name.String() + " in the view)"
	}
	s := view[i+1:]
	if end := strings.Index(s, "\n\n"); end >= 0 {
		s = s[:end+1]
	}
	return s
}
