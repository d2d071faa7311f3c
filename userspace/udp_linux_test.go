//go:build linux

package userspace

import (
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/state"
)

// TestUDPServiceSocketBuffer: a UDP service socket asks for a receive
// buffer big enough for a burst of new clients, beyond the usual 208 KiB
// default. ss shows what the kernel granted (rb, twice what was asked).
func TestUDPServiceSocketBuffer(t *testing.T) {
	ssPath, err := exec.LookPath("ss")
	if err != nil {
		skipOrFail(t, "ss (iproute2) is not installed")
	}
	want := frontendRcvBuf
	if os.Geteuid() != 0 { // no SO_RCVBUFFORCE: rmem_max caps it
		raw, err := os.ReadFile("/proc/sys/net/core/rmem_max")
		if err != nil {
			skipOrFail(t, "no /proc/sys/net/core/rmem_max: %v", err)
		}
		max, err := strconv.Atoi(strings.TrimSpace(string(raw)))
		if err != nil {
			t.Fatal(err)
		}
		want = min(want, max)
	}
	be := startUDPBackend(t, "a")
	p := newTestProxier(t, Config{})
	name := spn("dns", "", state.UDP)
	mustApply(t, p, state.ServicePort{Name: name, Port: 53, ClusterEndpoints: eps(be.addr())})
	port := p.ProxyPort(name)
	out, err := exec.Command(ssPath, "-uanm", "sport", "=", fmt.Sprintf(":%d", port)).CombinedOutput()
	if err != nil {
		t.Fatalf("ss: %v: %s", err, out)
	}
	rbs := regexp.MustCompile(`skmem:\(r\d+,rb(\d+),`).FindAllStringSubmatch(string(out), -1)
	if len(rbs) == 0 {
		t.Fatalf("ss shows no socket on port %d:\n%s", port, out)
	}
	for _, m := range rbs {
		if rb, _ := strconv.Atoi(m[1]); rb < 2*want {
			t.Errorf("receive buffer %d bytes, want at least %d:\n%s", rb, 2*want, out)
		}
	}

	// A session's socket to the endpoint too: a burst of replies waits
	// there until the loop reads it.
	c := dialUDP(t, proxyAddr(t, p, name))
	if got, err := udpExchange(t, c, []byte("who")); err != nil || string(got) != "a" {
		t.Fatalf("reply %q, %v", got, err)
	}
	out, err = exec.Command(ssPath, "-uanm", "dport", "=", fmt.Sprintf(":%d", be.addr().Port())).CombinedOutput()
	if err != nil {
		t.Fatalf("ss: %v: %s", err, out)
	}
	rbs = regexp.MustCompile(`skmem:\(r\d+,rb(\d+),`).FindAllStringSubmatch(string(out), -1)
	if len(rbs) != 1 {
		t.Fatalf("ss shows %d sockets to the endpoint, want the session's:\n%s", len(rbs), out)
	}
	if rb, _ := strconv.Atoi(rbs[0][1]); rb < 2*want {
		t.Errorf("the session's receive buffer is %d bytes, want at least %d:\n%s", rb, 2*want, out)
	}
}
