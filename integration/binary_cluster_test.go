//go:build integration

package integration

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/source"
)

// The real binary following the real API server, in the node namespace of
// a test world, with the iptables portal, reached by real clients from the
// pod namespace; backends in the backend namespace at 198.18.12.2.
//
// The API server listens on the host's loopback, which a network namespace
// cannot reach. A relay carries the connections: the node namespace's
// 127.0.0.1:6443 to a Unix socket (Unix sockets live in the file system,
// not in a network namespace) to the API server's port. TLS passes through
// untouched, and the serving certificate is for 127.0.0.1 either way.

// runRelay is the node side: 127.0.0.1:port in this namespace to a Unix
// socket.
func runRelay(listen, unixPath string) error {
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return err
	}
	fmt.Println("ready")
	for {
		c, err := ln.Accept()
		if err != nil {
			return err
		}
		go func() {
			u, err := net.Dial("unix", unixPath)
			if err != nil {
				c.Close()
				return
			}
			splice(c, u)
		}()
	}
}

// splice copies both ways and closes both when either side ends.
func splice(a, b net.Conn) {
	var once sync.Once
	done := func() { once.Do(func() { a.Close(); b.Close() }) }
	go func() { io.Copy(a, b); done() }()
	io.Copy(b, a)
	done()
}

// relayAPIServer makes the API server reachable at 127.0.0.1:6443 inside
// ns and returns a kubeconfig that points there.
func relayAPIServer(t *testing.T, api *apiServer, ns netns) string {
	t.Helper()
	u, err := url.Parse(api.URL)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	sock := filepath.Join(dir, "api.sock")
	ul, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ul.Close() })
	go func() {
		for {
			c, err := ul.Accept()
			if err != nil {
				return
			}
			go func() {
				s, err := net.Dial("tcp", u.Host)
				if err != nil {
					c.Close()
					return
				}
				splice(c, s)
			}()
		}
	}()
	h := startHelper(t, ns, "relay", "KUPT_LISTEN=127.0.0.1:6443", "KUPT_UNIX="+sock)
	if l := h.line(10 * time.Second); l != "ready" {
		t.Fatalf("relay said %q", l)
	}
	cfg, err := clientcmd.LoadFromFile(api.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cfg.Clusters {
		c.Server = "https://127.0.0.1:6443"
	}
	path := filepath.Join(dir, "kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		t.Fatal(err)
	}
	return path
}

// eventually retries a client exchange until it gives a reply with prefix
// (changes reach the proxy asynchronously), bounded.
func eventually(t *testing.T, ns netns, proto, addr, prefix string) {
	t.Helper()
	var r clientResult
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if r = dial(t, ns, proto, addr, "ping", 0); r.Err == "" && strings.HasPrefix(r.Reply, prefix) {
			return
		}
	}
	t.Fatalf("%s %s from %s: %+v, want a reply starting %q within 15s", proto, addr, ns, r, prefix)
}

// eventuallyNot retries until the address stops answering, bounded.
func eventuallyNot(t *testing.T, ns netns, proto, addr string) {
	t.Helper()
	var r clientResult
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if r = dial(t, ns, proto, addr, "ping", 0); r.Err != "" {
			return
		}
	}
	t.Fatalf("%s %s from %s still answers %q after 15s", proto, addr, ns, r.Reply)
}

func TestBinaryFollowsCluster(t *testing.T) {
	api := requireAPIServer(t)
	w := newWorld(t)
	startBackend(t, w.backend, "8080=be1", "8081=be2")
	kubeconfig := relayAPIServer(t, api, w.node)
	c := api.Client
	ns := testNamespace(t, c)

	px := startCommand(t, "ip", "netns", "exec", string(w.node), proxyBin, "--kubeconfig", kubeconfig,
		"--portal=iptables", "--hostname-override=node", "-v=2")
	px.waitLog(0, `"Portals synced"`, 1, 60*time.Second)

	const vip = "198.18.0.60:80"
	createService(t, c, newService(ns, "web", func(s *corev1.Service) { s.Spec.ClusterIP = "198.18.0.60" }))
	putSlice(t, c, newSlice(ns, "web", "web-1", readyEP("198.18.12.2")))
	t.Run("a new service answers", func(t *testing.T) { eventually(t, w.pod, "tcp", vip, "be1:") })

	t.Run("scaling up adds an endpoint", func(t *testing.T) {
		s := newSlice(ns, "web", "web-2", readyEP("198.18.12.2"))
		port := int32(8081)
		s.Ports[0].Port = &port
		putSlice(t, c, s)
		eventually(t, w.pod, "tcp", vip, "be2:")
		eventually(t, w.pod, "tcp", vip, "be1:")
	})

	t.Run("ClientIP affinity pins the client", func(t *testing.T) {
		updateService(t, c, ns, "web", func(s *corev1.Service) { s.Spec.SessionAffinity = corev1.ServiceAffinityClientIP })
		// Wait until two requests in a row agree, then expect the rest to.
		var first string
		for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); {
			a, b := dial(t, w.pod, "tcp", vip, "ping", 0), dial(t, w.pod, "tcp", vip, "ping", 0)
			if a.Err == "" && a.Reply == b.Reply {
				first = a.Reply
				break
			}
		}
		for range 6 {
			if r := dial(t, w.pod, "tcp", vip, "ping", 0); r.Reply != first {
				t.Fatalf("affinity: %q then %q", first, r.Reply)
			}
		}
	})

	t.Run("scaling down removes the endpoint", func(t *testing.T) {
		updateService(t, c, ns, "web", func(s *corev1.Service) { s.Spec.SessionAffinity = corev1.ServiceAffinityNone })
		if err := c.DiscoveryV1().EndpointSlices(ns).Delete(context.Background(), "web-2", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		// Round robin over two endpoints never gives six be1 replies in a
		// row; once the removal lands, every reply is be1's.
		run := 0
		for deadline := time.Now().Add(15 * time.Second); run < 6 && time.Now().Before(deadline); {
			if r := dial(t, w.pod, "tcp", vip, "ping", 0); r.Err == "" && strings.HasPrefix(r.Reply, "be1:") {
				run++
			} else {
				run = 0
			}
		}
		if run < 6 {
			t.Fatal("the removed endpoint still gets connections after 15s")
		}
	})

	t.Run("the service-proxy-name label hides the service", func(t *testing.T) {
		updateService(t, c, ns, "web", func(s *corev1.Service) {
			s.Labels = map[string]string{source.LabelServiceProxyName: "someone-else"}
		})
		eventuallyNot(t, w.pod, "tcp", vip)
		updateService(t, c, ns, "web", func(s *corev1.Service) { s.Labels = nil })
		eventually(t, w.pod, "tcp", vip, "be1:")
	})

	t.Run("a deleted service stops answering", func(t *testing.T) {
		if err := c.CoreV1().Services(ns).Delete(context.Background(), "web", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		eventuallyNot(t, w.pod, "tcp", vip)
	})
}
