//go:build integration && linux

package integration

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// handoverManifest serves two Services from this node's endpoint, each
// over TCP and UDP: flip, a NodePort Service whose externalTrafficPolicy
// is etp, and ren, a ClusterIP Service whose ports are named tcpName and
// udpName.
func handoverManifest(etp, tcpName, udpName string) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Service
metadata: {name: flip, namespace: e2e}
spec:
  type: NodePort
  clusterIP: 198.18.0.60
  externalTrafficPolicy: %[1]s
  ports:
  - {name: http, protocol: TCP, port: 80, nodePort: 30060}
  - {name: dns, protocol: UDP, port: 53, nodePort: 30061}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: flip-1, namespace: e2e, labels: {kubernetes.io/service-name: flip}}
addressType: IPv4
ports: [{name: http, protocol: TCP, port: 8080}, {name: dns, protocol: UDP, port: 8080}]
endpoints: [{addresses: ["198.18.12.2"], nodeName: node}]
---
apiVersion: v1
kind: Service
metadata: {name: ren, namespace: e2e}
spec:
  clusterIP: 198.18.0.61
  ports:
  - {name: %[2]s, protocol: TCP, port: 80}
  - {name: %[3]s, protocol: UDP, port: 53}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: ren-1, namespace: e2e, labels: {kubernetes.io/service-name: ren}}
addressType: IPv4
ports: [{name: %[2]s, protocol: TCP, port: 8080}, {name: %[3]s, protocol: UDP, port: 8080}]
endpoints: [{addresses: ["198.18.12.2"], nodeName: node}]
`, etp, tcpName, udpName)
}

// TestBinaryEditsRefuseNoClient: through the iptables portal, an edit that
// moves a Service's traffic to another proxy port refuses no client while
// the Service's endpoints are up, as kube-proxy's atomic iptables-restore
// refuses none. Switching externalTrafficPolicy from Local to Cluster
// gives up the external proxy port; renaming a Service port replaces its
// service port, and so its proxy port. The proxy port given up used to be
// closed before the rules stopped redirecting to it: for 30-50 ms new TCP
// clients were reset, and a UDP client keeping its source port was
// refused (ICMP port unreachable) until its conntrack entry went. Clients
// outside the node (to the node ports) and in a pod (to the ClusterIP)
// connect, and send a datagram from a port they keep, every 2 ms through
// each edit, from before it until after the rules follow it: no TCP
// client may fail, and no datagram be refused. Both builds.
func TestBinaryEditsRefuseNoClient(t *testing.T) {
	for _, build := range bothBuilds(t) {
		t.Run(build.name, func(t *testing.T) {
			w := newWorld(t)
			startBackend(t, w.backend, "8080=be1")
			file := filepath.Join(t.TempDir(), "services.yaml")
			writeFile(t, file, handoverManifest("Local", "http", "dns"))
			px := startCommand(t, "ip", "netns", "exec", string(w.node), build.bin, "--manifests", file, "--hostname-override=node", "-v=2", "--portal=iptables")
			px.waitLog(0, `"Portals synced"`, 1, 30*time.Second)
			for _, e := range []struct {
				name, manifest string
			}{
				{"externalTrafficPolicy Local to Cluster", handoverManifest("Cluster", "http", "dns")},
				{"externalTrafficPolicy Cluster to Local", handoverManifest("Local", "http", "dns")},
				{"service ports renamed", handoverManifest("Local", "web", "domain")},
				{"service ports renamed back", handoverManifest("Local", "http", "dns")},
			} {
				t.Run(e.name, func(t *testing.T) { checkEditRefusesNoClient(t, w, px, file, e.manifest) })
			}
		})
	}
}

// checkEditRefusesNoClient writes manifest to file, which px serves, while
// clients outside the node (to the node ports) and in a pod (to the
// ClusterIP) connect, and send datagrams, all through the edit.
func checkEditRefusesNoClient(t *testing.T, w *world, px *proxyProc, file, manifest string) {
	t.Helper()
	loops := []*connLoop{
		startConnLoop(t, w.outside, nodeOutSide+":30060", nodeOutSide+":30061", 45861),
		startConnLoop(t, w.pod, "198.18.0.61:80", "198.18.0.61:53", 45862),
	}
	for _, l := range loops {
		l.waitRunning()
	}
	from := px.lineCount()
	replaceFile(t, file, manifest)
	px.waitLog(from, `"Applying edited manifests"`, 1, 10*time.Second)
	px.waitLog(from, `"Portals synced"`, 1, 10*time.Second)
	time.Sleep(200 * time.Millisecond) // and past it
	for _, l := range loops {
		r := l.result()
		t.Logf("%s: TCP %d answered, %d failed; UDP %d answered, %d refused, %d lost", l.from, r.TCPOK, r.TCPFailed, r.UDPOK, r.UDPRefused, r.UDPLost)
		// The answer to the datagram in flight when the sync deletes the
		// client's conntrack entry leaves without its NAT undone, and the
		// client drops it, as with kube-proxy's cleanup: one may be lost,
		// none refused.
		if r.TCPFailed > 0 || r.UDPRefused > 0 || r.UDPLost > 1 {
			t.Errorf("%s: clients failed through the edit: TCP %d of %d, UDP %d refused and %d lost of %d; first: %v",
				l.from, r.TCPFailed, r.TCPOK+r.TCPFailed, r.UDPRefused, r.UDPLost, r.UDPOK+r.UDPRefused+r.UDPLost, r.Errors)
		}
		if r.TCPOK == 0 || r.UDPOK == 0 {
			t.Errorf("%s: nothing answered (%+v)", l.from, r)
		}
	}
}

// Bounds of a connect loop: at most how many exchanges of each protocol,
// how far apart, and how long a TCP exchange, or a datagram's answer, may
// take.
const (
	connLoopMaxRounds = 2000
	connLoopInterval  = 2 * time.Millisecond
	connLoopTimeout   = time.Second
	connLoopUDPWait   = 300 * time.Millisecond
)

// connLoopResult is what a connect loop saw.
type connLoopResult struct {
	TCPOK, TCPFailed           int
	UDPOK, UDPRefused, UDPLost int
	Errors                     []string // the first few
}

// connLoop is a connect loop running in a namespace: a helper (see
// startHelper) in mode "connloop".
type connLoop struct {
	from netns
	h    *helperProc
}

// startConnLoop runs a connect loop in ns: TCP exchanges with tcpAddr and,
// beside them, datagrams to udpAddr from one socket bound to srcPort (a
// resolver that keeps its port), each connLoopInterval after the last
// answer, until result asks for the result. Bounded: it ends by itself
// after connLoopMaxRounds of each, and is killed at cleanup.
func startConnLoop(t *testing.T, ns netns, tcpAddr, udpAddr string, srcPort int) *connLoop {
	t.Helper()
	return &connLoop{from: ns, h: startHelper(t, ns, "connloop", fmt.Sprintf("KUPT_CONNLOOP=%s,%s,%d", tcpAddr, udpAddr, srcPort))}
}

// waitRunning waits until both loops have had an answer.
func (l *connLoop) waitRunning() {
	l.h.t.Helper()
	l.h.waitRunning("connect loop in " + string(l.from))
}

// result ends the loop and returns what it saw.
func (l *connLoop) result() connLoopResult {
	l.h.t.Helper()
	var r connLoopResult
	l.h.result("connect loop in "+string(l.from), &r)
	return r
}

// runConnLoop is main for a connect loop; spec is "tcpAddr,udpAddr,srcPort".
func runConnLoop(spec string) error {
	parts := strings.Split(spec, ",")
	if len(parts) != 3 {
		return fmt.Errorf("bad spec %q", spec)
	}
	tcpAddr, udpAddr := parts[0], parts[1]
	srcPort, err := strconv.Atoi(parts[2])
	if err != nil {
		return err
	}
	dst, err := net.ResolveUDPAddr("udp", udpAddr)
	if err != nil {
		return err
	}
	// Connected, as resolvers are, so an ICMP port unreachable comes back
	// as "connection refused".
	uc, err := net.DialUDP("udp", &net.UDPAddr{Port: srcPort}, dst)
	if err != nil {
		return err
	}
	defer uc.Close()

	var (
		mu sync.Mutex
		r  connLoopResult
	)
	fail := func(what string, err error) {
		mu.Lock()
		defer mu.Unlock()
		if len(r.Errors) < 5 {
			r.Errors = append(r.Errors, fmt.Sprintf("%s %s: %v", time.Now().Format("15:04:05.000"), what, err))
		}
	}
	tcpOnce := func(i int) error {
		c, err := net.DialTimeout("tcp", tcpAddr, connLoopTimeout)
		if err != nil {
			return err
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(connLoopTimeout))
		if _, err := fmt.Fprintf(c, "t%d\n", i); err != nil {
			return err
		}
		b, err := io.ReadAll(c)
		if got, want := string(b), fmt.Sprintf("be1:t%d\n", i); err != nil || got != want {
			return fmt.Errorf("read %q, want %q: %v", got, want, err)
		}
		return nil
	}
	buf := make([]byte, 1500)
	udpOnce := func(i int) error {
		want := fmt.Sprintf("be1:u%d", i)
		if _, err := fmt.Fprintf(uc, "u%d", i); err != nil {
			return err
		}
		uc.SetReadDeadline(time.Now().Add(connLoopUDPWait))
		for {
			n, err := uc.Read(buf)
			if err != nil {
				return err
			}
			if string(buf[:n]) == want {
				return nil
			}
			// A late answer to an earlier datagram: read on.
		}
	}
	// Both answer once before the loop says it runs.
	if err := tcpOnce(-1); err != nil {
		return fmt.Errorf("first TCP exchange: %w", err)
	}
	if err := udpOnce(-1); err != nil {
		return fmt.Errorf("first UDP exchange: %w", err)
	}
	fmt.Println("running")
	stop := make(chan struct{})
	go func() {
		io.Copy(io.Discard, os.Stdin)
		close(stop)
	}()
	stopped := func() bool {
		select {
		case <-stop:
			return true
		default:
			return false
		}
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := 0; i < connLoopMaxRounds && !stopped(); i++ {
			err := tcpOnce(i)
			mu.Lock()
			if err == nil {
				r.TCPOK++
			} else {
				r.TCPFailed++
			}
			mu.Unlock()
			if err != nil {
				fail("TCP", err)
			}
			time.Sleep(connLoopInterval)
		}
	})
	wg.Go(func() {
		for i := 0; i < connLoopMaxRounds && !stopped(); i++ {
			err := udpOnce(i)
			mu.Lock()
			switch {
			case err == nil:
				r.UDPOK++
			case errors.Is(err, syscall.ECONNREFUSED):
				r.UDPRefused++
			default:
				r.UDPLost++
			}
			mu.Unlock()
			if err != nil {
				fail("UDP", err)
			}
			time.Sleep(connLoopInterval)
		}
	})
	wg.Wait()
	return json.NewEncoder(os.Stdout).Encode(r)
}
