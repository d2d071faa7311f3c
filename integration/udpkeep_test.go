//go:build integration && linux

package integration

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// keepManifest serves two UDP Services from four endpoints, two on this
// node (a and b) and two on another (c and d), all in the backend
// namespace on ports of their own: keep, a NodePort Service whose
// externalTrafficPolicy is etp, and kren, a ClusterIP Service whose port
// is named portName.
func keepManifest(etp, portName string) string {
	slicesOf := func(svc, port string) string {
		var b strings.Builder
		for i, ep := range []struct{ name, node string }{{"a", "node"}, {"b", "node"}, {"c", "other"}, {"d", "other"}} {
			fmt.Fprintf(&b, `---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: %[1]s-%[2]s, namespace: e2e, labels: {kubernetes.io/service-name: %[1]s}}
addressType: IPv4
ports: [{name: %[3]q, protocol: UDP, port: %[4]d}]
endpoints: [{addresses: ["198.18.12.2"], nodeName: %[5]s}]
`, svc, ep.name, port, 21091+i, ep.node)
		}
		return b.String()
	}
	return fmt.Sprintf(`apiVersion: v1
kind: Service
metadata: {name: keep, namespace: e2e}
spec:
  type: NodePort
  clusterIP: 198.18.0.62
  externalTrafficPolicy: %[1]s
  ports:
  - {name: dns, protocol: UDP, port: 53, nodePort: 30062}
%[3]s---
apiVersion: v1
kind: Service
metadata: {name: kren, namespace: e2e}
spec:
  clusterIP: 198.18.0.63
  ports:
  - {name: %[2]s, protocol: UDP, port: 53}
%[4]s`, etp, portName, slicesOf("keep", "dns"), slicesOf("kren", portName))
}

// TestBinaryUDPClientsKeepEndpointsThroughEdits: through the iptables
// portal, an edit that moves a Service's traffic to another proxy port
// keeps each live UDP client on its endpoint, as kube-proxy's conntrack
// entry keeps such a flow on its pod: the portal's sync deletes the
// client's conntrack entry, and its next datagram opens a session on the
// new proxy port, which goes on to the endpoint the old session had. It
// used to be balanced afresh (the old port's session ended as its socket
// closed), and often went to another endpoint mid-stream. Clients outside
// the node (to the node port, from externalTrafficPolicy Local to
// Cluster and back) and in a pod (to the ClusterIP, whose port is
// renamed) each send a datagram every 20 ms from a port they keep,
// through each edit. Only a Local policy moves a client: one on another
// node's endpoint goes to this node's. Both builds.
func TestBinaryUDPClientsKeepEndpointsThroughEdits(t *testing.T) {
	for _, build := range bothBuilds(t) {
		t.Run(build.name, func(t *testing.T) {
			w := newWorld(t)
			startBackend(t, w.backend, "21091=a", "21092=b", "21093=c", "21094=d")
			file := filepath.Join(t.TempDir(), "services.yaml")
			writeFile(t, file, keepManifest("Local", "dns"))
			px := startCommand(t, "ip", "netns", "exec", string(w.node), build.bin, "--manifests", file, "--hostname-override=node", "-v=4", "--portal=iptables")
			px.waitLog(0, `"Portals synced"`, 1, 30*time.Second)
			local := map[string]bool{"a": true, "b": true}
			for i, e := range []struct {
				name, manifest string
				// flipLocal: the node port's clients may move, to this
				// node's endpoints only.
				flipLocal bool
			}{
				{"externalTrafficPolicy Local to Cluster", keepManifest("Cluster", "dns"), false},
				{"externalTrafficPolicy Cluster to Local", keepManifest("Local", "dns"), true},
				{"service port renamed", keepManifest("Local", "domain"), false},
				{"service port renamed back", keepManifest("Local", "dns"), false},
			} {
				t.Run(e.name, func(t *testing.T) {
					// New clients for each edit, on ports of their own:
					// those of the edit before may be remembered still,
					// and would keep the endpoints they had.
					ports := 21100 + 20*i
					groups := []*udpClients{
						startUDPClients(t, w.outside, nodeOutSide+":30062", ports),
						startUDPClients(t, w.pod, "198.18.0.63:53", ports+10),
					}
					for _, g := range groups {
						g.waitRunning()
					}
					from := px.lineCount()
					replaceFile(t, file, e.manifest)
					px.waitLog(from, `"Applying edited manifests"`, 1, 10*time.Second)
					px.waitLog(from, `"Portals synced"`, 1, 10*time.Second)
					time.Sleep(500 * time.Millisecond) // and past it
					for gi, g := range groups {
						r := g.result()
						t.Logf("%s: endpoints seen by each client: %v; %d answered, %d lost", g.from, r.Seen, r.OK, r.Lost)
						for i, seen := range r.Seen {
							if len(seen) == 0 {
								t.Errorf("%s: client %d had no answer", g.from, i)
								continue
							}
							moveOK := gi == 0 && e.flipLocal && !local[seen[0]]
							switch {
							case len(seen) == 1:
								if moveOK {
									t.Errorf("%s: client %d stayed on %s, which externalTrafficPolicy: Local keeps it from", g.from, i, seen[0])
								}
							case !moveOK || len(seen) > 2 || !local[seen[1]]:
								t.Errorf("%s: client %d moved through the edit: %s", g.from, i, strings.Join(seen, " -> "))
							}
						}
						// The answer to the datagram in flight when the
						// sync deletes a client's conntrack entry leaves
						// without its NAT undone: one each may be lost.
						if r.Lost > len(r.Seen) {
							t.Errorf("%s: %d datagrams lost of %d", g.from, r.Lost, r.OK+r.Lost)
						}
					}
				})
			}
			if !strings.Contains(px.log(), "kept the endpoint of the session this client had on the proxy port") {
				t.Error(`no "Chose endpoint" line says a session kept its endpoint`)
			}
		})
	}
}

// Bounds of a UDP clients helper: how many clients, how far apart each
// sends, how long it waits for an answer, and at most how many rounds.
const (
	udpClientsCount     = 6
	udpClientsInterval  = 20 * time.Millisecond
	udpClientsWait      = 300 * time.Millisecond
	udpClientsMaxRounds = 1500
)

// udpClientsResult is what a UDP clients helper saw: for each client,
// the endpoints that answered it, in turn (each named once per stretch).
type udpClientsResult struct {
	Seen     [][]string
	OK, Lost int
}

// udpClients is a UDP clients helper running in a namespace (see
// startHelper), in mode "udpclients".
type udpClients struct {
	from netns
	h    *helperProc
}

// startUDPClients runs udpClientsCount UDP clients in ns, each on its own
// source port from srcPort on, that each send a datagram to addr every
// udpClientsInterval after the last answer (or its loss) until result
// asks for the result. Bounded: they end by themselves after
// udpClientsMaxRounds, and are killed at cleanup.
func startUDPClients(t *testing.T, ns netns, addr string, srcPort int) *udpClients {
	t.Helper()
	return &udpClients{from: ns, h: startHelper(t, ns, "udpclients", fmt.Sprintf("KUPT_UDPCLIENTS=%s,%d", addr, srcPort))}
}

// waitRunning waits until every client has had an answer.
func (c *udpClients) waitRunning() {
	c.h.t.Helper()
	c.h.waitRunning("UDP clients in " + string(c.from))
}

// result ends the clients and returns what they saw.
func (c *udpClients) result() udpClientsResult {
	c.h.t.Helper()
	var r udpClientsResult
	c.h.result("UDP clients in "+string(c.from), &r)
	return r
}

// runUDPClients is main for a UDP clients helper; spec is "addr,srcPort".
func runUDPClients(spec string) error {
	addr, port, ok := strings.Cut(spec, ",")
	srcPort, err := strconv.Atoi(port)
	if !ok || err != nil {
		return fmt.Errorf("bad spec %q", spec)
	}
	dst, err := net.ResolveUDPAddr("udp", addr)
	if err != nil {
		return err
	}
	conns := make([]*net.UDPConn, udpClientsCount)
	for i := range conns {
		if conns[i], err = net.DialUDP("udp", &net.UDPAddr{Port: srcPort + i}, dst); err != nil {
			return err
		}
		defer conns[i].Close()
	}
	// once sends one datagram on c and returns the name of the endpoint
	// that answered it ("" if none did).
	once := func(c *net.UDPConn, i, round int) string {
		if _, err := fmt.Fprintf(c, "c%dr%d", i, round); err != nil {
			return ""
		}
		c.SetReadDeadline(time.Now().Add(udpClientsWait))
		buf := make([]byte, 1500)
		for {
			n, err := c.Read(buf)
			if err != nil {
				return ""
			}
			name, got, _ := strings.Cut(string(buf[:n]), ":")
			if got == fmt.Sprintf("c%dr%d", i, round) {
				return name
			}
			// A late answer to an earlier datagram: read on.
		}
	}
	var (
		mu sync.Mutex
		r  = udpClientsResult{Seen: make([][]string, len(conns))}
	)
	note := func(i int, name string) {
		mu.Lock()
		defer mu.Unlock()
		switch seen := r.Seen[i]; {
		case name == "":
			r.Lost++
		case len(seen) == 0 || seen[len(seen)-1] != name:
			r.Seen[i] = append(seen, name)
			r.OK++
		default:
			r.OK++
		}
	}
	for i, c := range conns {
		name := once(c, i, -1)
		if name == "" {
			return fmt.Errorf("client %d: no first answer", i)
		}
		note(i, name)
	}
	fmt.Println("running")
	stop := make(chan struct{})
	go func() {
		io.Copy(io.Discard, os.Stdin)
		close(stop)
	}()
	var wg sync.WaitGroup
	for i, c := range conns {
		wg.Go(func() {
			for round := range udpClientsMaxRounds {
				select {
				case <-stop:
					return
				case <-time.After(udpClientsInterval):
				}
				note(i, once(c, i, round))
			}
		})
	}
	wg.Wait()
	return json.NewEncoder(os.Stdout).Encode(r)
}
