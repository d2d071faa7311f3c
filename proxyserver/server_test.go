package proxyserver

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/portal"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/state"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/userspace"
)

// probingPortal is a recording portal that, at each Sync, checks whether
// a proxy port still accepts connections.
type probingPortal struct {
	*portal.Fake
	addr     string // the proxy port checked; "" for none
	accepted []bool // at each Sync with addr set
}

func (p *probingPortal) Sync(ctx context.Context, portals []portal.Portal) error {
	if p.addr != "" {
		p.accepted = append(p.accepted, accepts(p.addr))
	}
	return p.Fake.Sync(ctx, portals)
}

func accepts(addr string) bool {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err == nil {
		c.Close()
	}
	return err == nil
}

// TestSyncRedirectsClosesGivenUpPortsAfterTheRules: a proxy port that an
// Apply gives up (here a renamed service port's) still accepts while the
// portal's rules are rewritten, and closes once they are, so no client the
// old rules still send there is refused; a sync the rate limit defers
// keeps it open, and so does a failed one: the rules of the last sync
// that worked still send clients there.
func TestSyncRedirectsClosesGivenUpPortsAfterTheRules(t *testing.T) {
	ctx := context.Background()
	be, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer be.Close()
	go func() {
		for {
			c, err := be.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	svc := func(port string) state.ServicePort {
		return state.ServicePort{Name: state.ServicePortName{Namespace: "ns", Name: "ren", Port: port, Protocol: state.TCP},
			Port: 80, ClusterIPs: []netip.Addr{netip.MustParseAddr("198.18.0.10")},
			ClusterEndpoints: []state.Endpoint{{Addr: be.Addr().(*net.TCPAddr).AddrPort(), Ready: true, Serving: true}}}
	}
	for _, tc := range []struct {
		name   string
		before func(*kernelSync, *portal.Fake) // set up the sync after the rename
		want   func(error) bool
		open   bool // the old proxy port still accepts after the sync
	}{
		{"synced", func(*kernelSync, *portal.Fake) {}, func(err error) bool { return err == nil }, false},
		{"failed", func(_ *kernelSync, f *portal.Fake) { f.SetError(errors.New("iptables-restore: boom")) },
			func(err error) bool { return errors.As(err, new(kernelError)) }, true},
		{"deferred", func(k *kernelSync, _ *portal.Fake) { k.minPeriod = time.Hour },
			func(err error) bool { return errors.As(err, new(errDeferred)) }, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := userspace.New(userspace.Config{BindAddress: netip.MustParseAddr("127.0.0.1"), HoldReleasedPorts: true})
			defer p.Close()
			pt := &probingPortal{Fake: &portal.Fake{}}
			k := &kernelSync{pt: pt, resync: time.Hour}
			old := state.NewSnapshot([]state.ServicePort{svc("http")})
			if err := p.Apply(old); err != nil {
				t.Fatal(err)
			}
			if err := syncRedirects(ctx, k, p, old); err != nil {
				t.Fatal(err)
			}
			oldAddr := fmt.Sprintf("127.0.0.1:%d", p.ProxyPort(svc("http").Name))
			pt.addr = oldAddr

			renamed := state.NewSnapshot([]state.ServicePort{svc("web")})
			if err := p.Apply(renamed); err != nil {
				t.Fatal(err)
			}
			tc.before(k, pt.Fake)
			err := syncRedirects(ctx, k, p, renamed)
			if !tc.want(err) {
				t.Fatalf("sync: %v", err)
			}
			if tc.name == "synced" && (len(pt.accepted) != 1 || !pt.accepted[0]) {
				t.Errorf("the old proxy port accepted at the portal's sync: %v, want true", pt.accepted)
			}
			if got := accepts(oldAddr); got != tc.open {
				t.Errorf("the old proxy port accepts after the sync: %v, want %v", got, tc.open)
			}
			if !tc.open {
				return
			}
			// The rate limit has passed, or the portal works again: the
			// rules move, then it closes.
			k.minPeriod = 0
			pt.SetError(nil)
			if err := syncRedirects(ctx, k, p, renamed); err != nil {
				t.Fatal(err)
			}
			if n := len(pt.accepted); n == 0 || !pt.accepted[n-1] || accepts(oldAddr) {
				t.Errorf("after the deferred sync: accepted at the sync %v, accepts now %v; want true, then false", pt.accepted, accepts(oldAddr))
			}
			if got := pt.Portals(); len(got) != 1 || got[0].ProxyPort != p.ProxyPort(svc("web").Name) {
				t.Errorf("the portal redirects as %v, want to the renamed port's proxy port", got)
			}
		})
	}
}

// TestPreferredPorts: the proxy ports a restarted proxy takes from the
// rules a previous run left. Every address rule reads back as ClusterIP,
// so the service port's own addresses tell internal from external.
func TestPreferredPorts(t *testing.T) {
	name := state.ServicePortName{Namespace: "ns", Name: "svc", Port: "http", Protocol: state.TCP}
	addr := netip.MustParseAddr
	rule := func(ip string, port uint16) portal.Portal {
		return portal.Portal{Service: name, Kind: portal.ClusterIP, IP: addr(ip), ProxyPort: port}
	}
	nodePort := portal.Portal{Service: name, Kind: portal.NodePort, ProxyPort: 3}
	split := &state.ServicePort{Name: name, ClusterIPs: []netip.Addr{addr("198.18.0.70")},
		LoadBalancerIPs: []netip.Addr{addr("198.18.0.7")}, ExternalLocal: true}
	plain := &state.ServicePort{Name: name, ExternalIPs: []netip.Addr{addr("198.18.0.7")}}
	tests := []struct {
		name               string
		sp                 *state.ServicePort
		previous           []portal.Portal
		internal, external uint16
	}{
		{"split, load-balancer IP first", split, []portal.Portal{rule("198.18.0.7", 2), rule("198.18.0.70", 1)}, 1, 2},
		{"split, node port", split, []portal.Portal{rule("198.18.0.7", 2), nodePort, rule("198.18.0.70", 1)}, 1, 3},
		{"split, the cluster IP changed", split, []portal.Portal{rule("198.18.0.7", 2), rule("198.18.0.71", 1)}, 1, 2},
		{"split, external rules only", split, []portal.Portal{rule("198.18.0.7", 2)}, 0, 2},
		{"one port, external IP only", plain, []portal.Portal{rule("198.18.0.7", 2)}, 2, 2},
		{"one port, node port only", plain, []portal.Portal{nodePort}, 3, 3},
		{"another service port's rules", split, []portal.Portal{{Service: state.ServicePortName{Namespace: "ns", Name: "other"}, IP: addr("198.18.0.70"), ProxyPort: 9}}, 0, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := preferredPorts(tc.previous)
			if in, ex := f(tc.sp, false), f(tc.sp, true); in != tc.internal || ex != tc.external {
				t.Errorf("internal %d, external %d; want %d and %d", in, ex, tc.internal, tc.external)
			}
		})
	}
}

// TestInitOnlyChecksTheSource: --init-only fails as a start would
// without a source of services (no --manifests, kubeconfig or --master,
// and not in a cluster), with the same error, as kube-proxy's, which
// builds its API client first; with one it exits cleanly. It said the
// options were valid and exited 0. A --manifests file is read as a start
// reads it: it said the same of a file a start refuses, or of none.
func TestInitOnlyChecksTheSource(t *testing.T) {
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	t.Setenv("KUBERNETES_SERVICE_PORT", "")
	dir := t.TempDir()
	good, broken := filepath.Join(dir, "services.yaml"), filepath.Join(dir, "broken.yaml")
	const service = "apiVersion: v1\nkind: Service\nmetadata: {name: a, namespace: x}\nspec:\n  ports: [{port: %d}]\n"
	if err := os.WriteFile(good, fmt.Appendf(nil, service, 80), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(broken, fmt.Appendf(nil, service, 99999), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		set  func(c *Config)
		want string // substring of Run's error; "" for none
	}{
		{"no source", func(*Config) {}, "no source of services: give --manifests FILE or --kubeconfig/--master, or run inside a cluster"},
		{"manifests", func(c *Config) { c.Manifests = good }, ""},
		{"broken manifests", func(c *Config) { c.Manifests = broken }, "manifests: " + broken + ":5: document 1 (Service x/a): spec.ports[0].port: 99999 is out of range 1-65535"},
		{"no manifest file", func(c *Config) { c.Manifests = filepath.Join(dir, "none.yaml") }, "manifests: open " + filepath.Join(dir, "none.yaml")},
		{"master", func(c *Config) { c.Master = "http://127.0.0.1:9" }, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := NewConfig()
			c.InitOnly, c.Portal = true, PortalNone
			c.HealthzBindAddress, c.MetricsBindAddress = "", ""
			tc.set(c)
			if err := c.Validate(); err != nil {
				t.Fatal(err)
			}
			err := Run(context.Background(), c)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("Run: %v, want nil", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("Run: %v, want an error saying %s", err, tc.want)
			}
		})
	}
}
