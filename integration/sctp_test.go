//go:build integration && linux

package integration

import (
	"bytes"
	"crypto/sha256"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/internal/sctp"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/internal/sctp/sctptest"
)

// The real binary serving SCTP. This kernel has no SCTP, so these tests
// run in the VM of `make test-sctp` (hack/test-sctp.sh), as root, with
// sctp.ko and dummy.ko loaded and nothing else on the machine; elsewhere
// they skip (sctptest.Require).

// sctpManifest is an SCTP NodePort service whose endpoints are the given
// loopback ports, one EndpointSlice each.
func sctpManifest(affinity string, ports ...uint16) string {
	var b strings.Builder
	fmt.Fprintf(&b, `apiVersion: v1
kind: Service
metadata: {name: sig, namespace: tel}
spec:
  type: NodePort
  clusterIP: 198.18.0.30
  sessionAffinity: %s
  ports: [{name: diameter, protocol: SCTP, port: 3868, nodePort: 30868}]
`, affinity)
	for i, p := range ports {
		fmt.Fprintf(&b, `---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: sig-%d, namespace: tel, labels: {kubernetes.io/service-name: sig}}
addressType: IPv4
ports: [{name: diameter, protocol: SCTP, port: %d}]
endpoints: [{addresses: ["127.0.0.1"]}]
`, i, p)
	}
	return b.String()
}

// TestSCTPBinaryNodePort: without kernel portals the binary serves an SCTP
// NodePort itself: round robin over three backends, an edit to ClientIP
// affinity, dead endpoints passed over, a 1 MiB transfer checked by hash,
// and messages that keep their stream ids.
func TestSCTPBinaryNodePort(t *testing.T) {
	sctptest.Require(t)
	var bs []*sctptest.Backend
	var ports []uint16
	for _, n := range []string{"a", "b", "c"} {
		b := sctptest.StartBackend(t, n, netip.MustParseAddrPort("127.0.0.1:0"))
		bs = append(bs, b)
		ports = append(ports, b.Addr.Port())
	}
	file := filepath.Join(t.TempDir(), "sctp.yaml")
	writeFile(t, file, sctpManifest("None", ports...))
	px := startProxy(t, proxyArgs(file)...)
	px.waitLog(0, `"Serving".*via="node-port"`, 1, 30*time.Second)
	np := netip.MustParseAddrPort("127.0.0.1:30868")

	t.Run("round robin", func(t *testing.T) {
		seen := map[string]int{}
		for range 6 {
			seen[sctptest.WhoAt(t, np)]++
		}
		if seen["a"] != 2 || seen["b"] != 2 || seen["c"] != 2 {
			t.Fatalf("6 associations reached %v, want 2 each", seen)
		}
	})

	t.Run("1 MiB checked by hash", func(t *testing.T) {
		c := sctptest.Dial(t, np, sctp.Options{})
		defer c.Close()
		payload := make([]byte, 1<<20)
		for i := range payload {
			payload[i] = byte(i ^ i>>9)
		}
		go func() {
			for off := 0; off < len(payload); off += 32 << 10 {
				if _, err := c.WriteMsg(payload[off:off+32<<10], sctp.Info{}); err != nil {
					return
				}
			}
		}()
		h := sha256.New()
		buf := make([]byte, 64<<10)
		for got := 0; got < len(payload); {
			n, _, err := c.ReadMsg(buf)
			if err != nil {
				t.Fatalf("after %d bytes: %v", got, err)
			}
			h.Write(buf[:n])
			got += n
		}
		if want := sha256.Sum256(payload); !bytes.Equal(h.Sum(nil), want[:]) {
			t.Fatal("1 MiB came back changed")
		}
	})

	t.Run("messages keep stream ids and PPIDs", func(t *testing.T) {
		c := sctptest.Dial(t, np, sctp.Options{OutStreams: 16})
		defer c.Close()
		for _, info := range []sctp.Info{{Stream: 15, PPID: 46}, {Stream: 3, PPID: 0x12345678, Unordered: true}, {}} {
			msg := fmt.Appendf(nil, "on stream %d", info.Stream)
			got, ri, err := sctptest.Ask(c, msg, info)
			if err != nil || !bytes.Equal(got, msg) || ri != info {
				t.Fatalf("sent %q with %+v; got %q with %+v, %v", msg, info, got, ri, err)
			}
		}
	})

	t.Run("ClientIP affinity after an edit", func(t *testing.T) {
		from := px.lineCount()
		replaceFile(t, file, sctpManifest("ClientIP", ports...))
		px.waitLog(from, `"Applying edited manifests"`, 1, 10*time.Second)
		time.Sleep(500 * time.Millisecond) // applied right after that line
		first := sctptest.WhoAt(t, np)
		for range 4 {
			if got := sctptest.WhoAt(t, np); got != first {
				t.Fatalf("affinity: %q then %q", first, got)
			}
		}
	})

	t.Run("dead endpoints are passed over", func(t *testing.T) {
		bs[1].Close()
		bs[2].Close()
		for range 4 {
			if got := sctptest.WhoAt(t, np); got != "a" {
				t.Fatalf("reached %q, want the live backend a", got)
			}
		}
	})
}

// TestSCTPBinaryBindPortal: the bind portal puts the ClusterIP on an
// interface of this (VM) host and the binary listens on it.
func TestSCTPBinaryBindPortal(t *testing.T) {
	sctptest.Require(t)
	if os.Geteuid() != 0 {
		t.Skip("the bind portal needs root")
	}
	b := sctptest.StartBackend(t, "bound", netip.MustParseAddrPort("127.0.0.1:0"))
	file := filepath.Join(t.TempDir(), "sctp.yaml")
	writeFile(t, file, sctpManifest("None", b.Addr.Port()))
	px := startProxy(t, "--manifests", file, "--portal=bind", "--nodeport-addresses=127.0.0.1/32")
	px.waitLog(0, `"Serving".*198.18.0.30:3868`, 1, 30*time.Second)
	dev, addrs := "lo", interfaceAddrs(t, "lo")
	if _, err := net.InterfaceByName("kube-ups0"); err == nil {
		dev, addrs = "kube-ups0", interfaceAddrs(t, "kube-ups0")
	}
	t.Logf("bind portal uses %s: %v", dev, addrs)
	if !strings.Contains(strings.Join(addrs, " "), "198.18.0.30/32") {
		t.Fatalf("198.18.0.30 not on %s: %v", dev, addrs)
	}
	if got := sctptest.WhoAt(t, netip.MustParseAddrPort("198.18.0.30:3868")); got != "bound" {
		t.Fatalf("ClusterIP reached %q", got)
	}
	if got := sctptest.WhoAt(t, netip.MustParseAddrPort("127.0.0.1:30868")); got != "bound" {
		t.Fatalf("NodePort reached %q", got)
	}
	// Deleting the service takes the address away.
	from := px.lineCount()
	replaceFile(t, file, `apiVersion: v1
kind: Service
metadata: {name: other, namespace: tel}
spec:
  clusterIP: 198.18.0.31
  ports: [{name: tcp, protocol: TCP, port: 80}]
`)
	px.waitLog(from, `"Stopped serving".*198.18.0.30:3868`, 1, 10*time.Second)
	if addrs := interfaceAddrs(t, dev); strings.Contains(strings.Join(addrs, " "), "198.18.0.30/32") {
		t.Fatalf("198.18.0.30 left on %s after delete: %v", dev, addrs)
	}
	// The new service's address came before its listener, even though the
	// edit came within the minimum sync period.
	px.waitLog(from, `"Serving".*198.18.0.31:80`, 1, 10*time.Second)
	if strings.Contains(px.log(), "Sync failed") {
		t.Fatal("a sync failed")
	}
}

func interfaceAddrs(t *testing.T, name string) []string {
	t.Helper()
	ifi, err := net.InterfaceByName(name)
	if err != nil {
		t.Fatal(err)
	}
	as, err := ifi.Addrs()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, a := range as {
		out = append(out, a.String())
	}
	return out
}

// TestWithoutSCTPTheRestIsServed: on a kernel without SCTP (like the build
// machines') the binary says once that SCTP is unavailable, skips the SCTP
// service ports, and serves the others, here a TCP NodePort beside two SCTP
// services.
func TestWithoutSCTPTheRestIsServed(t *testing.T) {
	if sctp.Available() == nil {
		t.Skip("this kernel has SCTP")
	}
	web := httpBackend(t, "web")
	np := freePort(t)
	file := filepath.Join(t.TempDir(), "mixed.yaml")
	writeFile(t, file, sctpManifest("None", 3868)+"---\n"+strings.NewReplacer("sig", "sig2", "198.18.0.30", "198.18.0.32", "30868", "30869").Replace(sctpManifest("None", 3869))+fmt.Sprintf(`---
apiVersion: v1
kind: Service
metadata: {name: web, namespace: tel}
spec:
  type: NodePort
  ports: [{name: http, protocol: TCP, port: 80, nodePort: %d}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, namespace: tel, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{name: http, protocol: TCP, port: %d}]
endpoints: [{addresses: ["127.0.0.1"]}]
`, np, web))
	px := startProxy(t, proxyArgs(file)...)
	px.waitLog(0, `"Serving".*tel/web:http/TCP`, 1, 20*time.Second)
	if body, err := curl(t, fmt.Sprintf("http://127.0.0.1:%d/", np)); err != nil || body != "web" {
		t.Fatalf("curl beside the SCTP services: %q, %v", body, err)
	}
	log := px.log()
	if n := strings.Count(log, "SCTP is not available"); n != 1 {
		t.Fatalf("%d lines say SCTP is unavailable, want 1:\n%s", n, log)
	}
	if strings.Contains(log, "Sync failed") || strings.Contains(log, `"Serving" service="tel/sig`) {
		t.Fatalf("an SCTP service port failed the sync or was served:\n%s", log)
	}
}
