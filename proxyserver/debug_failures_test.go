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
	// Once on its port's line, and the first few once more in the
	// header: a port's failure is found without wording it.
	if most := n + maxShownErrors; calls > most {
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
		errs = append(errs, &userspace.PortError{Name: sp.Name,
			Err: countedError{fmt.Sprintf("userspace: service %s: open proxy port: no free port in 25100-25199", sp.Name), calls}})
	}
	return sps, joinErrors(errs...)
}

// TestDebugServicesFindsEachPortsFailure: each port without a socket shows
// the first failure of the sync that is about it (a *userspace.PortError
// naming it, as Apply returns), however the failure is worded, wrapped or
// joined; a failure that only names a port in its wording is about none.
// The view matched the wording "service <name>:" before.
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
	failure := func(i int, format string, args ...any) error {
		return &userspace.PortError{Name: names[i], Err: fmt.Errorf(format, args...)}
	}
	for _, tc := range []struct {
		name string
		errs []error
		// want maps the index of a name to the index in errs of the
		// failure it shows; the others show none.
		want map[int]int
	}{
		{"one each", []error{
			failure(0, "userspace: service %s: listen on 0.0.0.0:30062 (node-port): bind: address already in use", names[0]),
			failure(2, "userspace: service %s: open proxy port: no free port", names[2]),
		}, map[int]int{0: 0, 2: 1}},
		{"the first of two", []error{
			failure(0, "userspace: service %s: first", names[0]),
			failure(0, "userspace: service %s: second", names[0]),
		}, map[int]int{0: 0}},
		{"two in one", []error{
			errors.Join(failure(3, "userspace: service %s: one", names[3]), failure(1, "userspace: service %s: two", names[1])),
			failure(1, "userspace: service %s: later", names[1]),
		}, map[int]int{3: 0, 1: 0}},
		{"names within names", []error{
			failure(4, "userspace: service %s: listen on [fd5e:b1b5::60]:80 (external-ip): bind: cannot assign requested address", names[4]),
			failure(5, "userspace: service %s: x", names[5]),
			failure(3, "userspace: service %s: y", names[3]),
		}, map[int]int{4: 0, 5: 1, 3: 2}},
		{"worded otherwise", []error{
			failure(6, "userspace: the proxy port of e2e/quiet is gone"),
			failure(0, "userspace: service %s", names[0]),
		}, map[int]int{6: 0, 0: 1}},
		{"named in the wording only", []error{
			fmt.Errorf("userspace: service %s: not a port's failure", names[0]),
			fmt.Errorf("health check: service %s: port 30100 is also service %s: port 30100", names[3], names[1]),
		}, nil},
		{"wrapped", []error{
			fmt.Errorf("apply: %w", failure(2, "userspace: service %s: inner", names[2])),
		}, map[int]int{2: 0}},
		{"nested", []error{
			joinErrors(failure(5, "userspace: service %s: inner", names[5]), failure(2, "userspace: service %s: inner", names[2])),
			failure(2, "userspace: service %s: outer", names[2]),
		}, map[int]int{5: 0, 2: 1}},
		{"not a service's", []error{kernelError{errors.New("portal: iptables: restore: exit status 4")}}, nil},
		{"one failure alone", []error{failure(6, "userspace: service %s: alone", names[6])}, map[int]int{6: 0}},
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
			// The failures as the view lists them: a nested join is
			// split into its own.
			split := splitErrors(err)
			var b strings.Builder
			d.write(&b, &debugSnapshot{snap: state.NewSnapshot(sps), err: err})
			view := b.String()
			for i, n := range names {
				want := "  listening:    none\n"
				if e, ok := tc.want[i]; ok {
					failed := tc.errs[e]
					if len(split) > len(tc.errs) { // "nested": the first failure is split
						failed = split[e]
					}
					want = fmt.Sprintf("  listening:    none: the last sync failed for it, and is retried: %v\n", failed)
				}
				if s := portSection(view, n); !strings.Contains(s, want) {
					t.Errorf("%s lacks %q:\n%s", n, want, s)
				}
			}
		})
	}
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
