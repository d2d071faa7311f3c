package userspace

import (
	"errors"
	"fmt"
	"net"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/hashicorp/go-multierror"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/state"
)

// TestApplyErrorsNamePorts: each failure of a service port in Apply's
// error is a *PortError naming the port, found with errors.As, its message
// worded as before ("userspace: service NAME: ..."): the debug view finds
// a port's failure by it rather than by its wording.
func TestApplyErrorsNamePorts(t *testing.T) {
	base := freePortRun(t, 3)
	// The node port, held by another program.
	held, err := net.Listen("tcp4", fmt.Sprintf("127.0.0.1:%d", base+1))
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	tb := startTCPBackend(t, "t")
	p := newTestProxier(t, loopbackNodePorts(Config{PortRange: PortRange{Base: base, Size: 1}}))
	a, b, c := spn("a", "", state.TCP), spn("b", "", state.TCP), spn("c", "", state.TCP)
	err = p.Apply(state.NewSnapshot([]state.ServicePort{
		{Name: a, Port: 80, ClusterEndpoints: eps(tb.addr())},
		{Name: b, Port: 80, ClusterEndpoints: eps(tb.addr())},
		{Name: c, Port: 80, NodePort: base + 1, ClusterEndpoints: eps(tb.addr())},
	}))
	if err == nil {
		t.Fatal("Apply succeeded; want failures")
	}
	var me *multierror.Error
	if !errors.As(err, &me) {
		t.Fatalf("Apply: %v; want a *multierror.Error", err)
	}
	var got []string
	for _, e := range me.Errors {
		var pe *PortError
		if !errors.As(e, &pe) {
			t.Errorf("failure %q is not a *PortError", e)
			continue
		}
		got = append(got, pe.Name.String()+" "+sameListenError(e.Error()))
	}
	// a took the one proxy port; b and c found none left, and c's node
	// port is held.
	exhausted := "%s userspace: service %[1]s: proxy port range exhausted: all 1 ports of %d-%[2]d are in use (as proxy ports or node ports)"
	want := []string{
		fmt.Sprintf(exhausted, b, base),
		fmt.Sprintf(exhausted, c, base),
		fmt.Sprintf("%s userspace: service %[1]s: listen on 127.0.0.1:%d (node-port): bind: address already in use", c, base+1),
	}
	if !slices.Equal(got, want) {
		t.Errorf("failures:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}

	// The one proxy port of another range, held by another program.
	busy, err := net.Listen("tcp4", fmt.Sprintf("127.0.0.1:%d", base+2))
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	p2 := newTestProxier(t, Config{PortRange: PortRange{Base: base + 2, Size: 1}})
	err = p2.Apply(state.NewSnapshot([]state.ServicePort{{Name: a, Port: 80, ClusterEndpoints: eps(tb.addr())}}))
	var pe *PortError
	if !errors.As(err, &pe) || pe.Name != a {
		t.Fatalf("Apply: %v; want a *PortError for %s", err, a)
	}
	if msg, want := sameListenError(pe.Error()), fmt.Sprintf("userspace: service %s: open proxy port: listen on 127.0.0.1:%d: bind: address already in use", a, base+2); msg != want {
		t.Errorf("Apply: %q; want %q", msg, want)
	}
}

// sameListenError takes out of msg what only the goroutine build's
// listen errors say (net.Listen's "listen tcp4 ADDR: " before the
// errno), so that one wording is checked in both builds.
func sameListenError(msg string) string {
	return goListenPrefix.ReplaceAllString(msg, "")
}

var goListenPrefix = regexp.MustCompile(`listen (tcp|udp)[46]? \S+: `)
