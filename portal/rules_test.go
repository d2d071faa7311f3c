package portal

import (
	"context"
	"flag"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/state"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name+".golden")
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -update to create it)", err)
	}
	if got != string(want) {
		t.Errorf("%s differs from the golden file (run go test -update to accept):\n--- got\n%s\n--- want\n%s", path, got, want)
	}
}

func TestRenderGolden(t *testing.T) {
	pods := []netip.Prefix{netip.MustParsePrefix("198.18.10.0/24"), netip.MustParsePrefix("198.18.16.0/24"), netip.MustParsePrefix("fd5e:b1b5:10::/64")}
	tests := []struct {
		name      string
		fam       Family
		nodePorts []netip.Prefix
		pods      []netip.Prefix
		dnat      netip.Addr // IPTablesConfig.DNAT's answer for every family
	}{
		{"ipv4", IPv4, nil, nil, netip.Addr{}},
		{"ipv6", IPv6, nil, nil, netip.Addr{}},
		{"ipv4-nodeport-addresses", IPv4, []netip.Prefix{netip.MustParsePrefix("198.18.1.0/24"), netip.MustParsePrefix("127.0.0.1/8"), netip.MustParsePrefix("fd5e:b1b5:1::/64")}, nil, netip.Addr{}},
		{"ipv6-nodeport-addresses", IPv6, []netip.Prefix{netip.MustParsePrefix("198.18.1.0/24")}, nil, netip.Addr{}},
		{"ipv4-cluster-cidrs", IPv4, nil, pods, netip.Addr{}},
		{"ipv6-cluster-cidrs", IPv6, nil, pods, netip.Addr{}},
		{"ipv4-dnat", IPv4, nil, nil, netip.MustParseAddr("198.18.2.1")},
		{"ipv6-dnat", IPv6, nil, nil, netip.MustParseAddr("fd5e:b1b5:2::1")},
		// An address of the other family is never a target: REDIRECT.
		{"ipv4-dnat-wrong-family", IPv4, nil, nil, netip.MustParseAddr("fd5e:b1b5:2::1")},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := IPTablesConfig{NodePortAddresses: tc.nodePorts, ClusterCIDRs: tc.pods}
			if tc.dnat.IsValid() {
				cfg.DNAT = func(Family) netip.Addr { return tc.dnat }
			}
			got := Render(fixedPortals(), tc.fam, cfg)
			if tc.name == "ipv4-dnat-wrong-family" {
				if want := Render(fixedPortals(), tc.fam, IPTablesConfig{}); got != want {
					t.Errorf("an IPv6 target changed the IPv4 rules:\n%s", got)
				}
				return
			}
			golden(t, tc.name, got)

			// The fake renders the same text for the same snapshot.
			f := &Fake{NodePortAddresses: tc.nodePorts, ClusterCIDRs: tc.pods, DNAT: cfg.DNAT}
			if err := f.Sync(context.Background(), fixedPortals()); err != nil {
				t.Fatal(err)
			}
			if fr := f.Rules(tc.fam); fr != got {
				t.Errorf("fake rules differ from Render:\n%s\nvs\n%s", fr, got)
			}
		})
	}
}

func TestRenderEmptyDeclaresChains(t *testing.T) {
	got := Render(nil, IPv4, IPTablesConfig{})
	want := "*nat\n:KUBE-PORTALS-CONTAINER - [0:0]\n:KUBE-PORTALS-HOST - [0:0]\n:KUBE-NODEPORT-CONTAINER - [0:0]\n:KUBE-NODEPORT-HOST - [0:0]\nCOMMIT\n" +
		"*filter\n:KUBE-NODEPORT-NON-LOCAL - [0:0]\n:KUBE-PORTALS-FIREWALL - [0:0]\nCOMMIT\n"
	if got != want {
		t.Errorf("Render(nil) =\n%s\nwant\n%s", got, want)
	}
}

func TestRenderSkips(t *testing.T) {
	ps := fixedPortals()
	for i := range ps {
		if ps[i].IP == netip.MustParseAddr("198.18.0.10") {
			ps[i].ProxyPort = 0 // not served: no rule
		}
	}
	ps = append(ps, Portal{Kind: "bad"}) // invalid: no rule
	got := Render(ps, IPv4, IPTablesConfig{})
	if strings.Contains(got, "198.18.0.10/32") {
		t.Errorf("portal without a proxy port was rendered:\n%s", got)
	}
	if strings.Count(got, "-A ") != strings.Count(Render(fixedPortals(), IPv4, IPTablesConfig{}), "-A ")-1 {
		t.Errorf("want exactly the nat rule of the unserved portal left out (its filter rule stays for the other frontends):\n%s", got)
	}
}

// TestRenderHealthCheckNodePort: a Service's health-check node port is
// accepted (TCP) in the filter chain of each family that serves the
// Service, once however many portals carry it, whether or not the Service
// has endpoints or a proxy port (the proxy answers on it itself), as
// kube-proxy's "health check node port" rules accept it; a host whose
// INPUT policy drops would otherwise fail every load balancer's check.
func TestRenderHealthCheckNodePort(t *testing.T) {
	const rule = `-A KUBE-NODEPORT-NON-LOCAL -p tcp -m comment --comment "default/web health check node port" -m tcp --dport 30071 -j ACCEPT`
	lb4 := Portal{Service: webHTTP, Kind: LoadBalancerIP, Family: IPv4, IP: netip.MustParseAddr("198.19.1.1"), Port: 80, ProxyPort: 41234, HealthCheckNodePort: 30071}
	np4 := Portal{Service: webHTTP, Kind: NodePort, Family: IPv4, Port: 30080, ProxyPort: 41234, NoLocal: true, HealthCheckNodePort: 30071}
	other := np4
	other.Service.Port, other.Service.Protocol = "dns", "UDP" // another port of the Service
	unserved := lb4
	unserved.ProxyPort, unserved.Reject = 0, true
	tests := []struct {
		name    string
		portals []Portal
		fam     Family
		want    int // times the rule is written
	}{
		{"once for the Service's portals and ports", []Portal{lb4, np4, other}, IPv4, 1},
		{"not in a family that does not serve it", []Portal{lb4, np4}, IPv6, 0},
		{"without a proxy port or endpoints", []Portal{unserved}, IPv4, 1},
		{"none without one", []Portal{{Service: webHTTP, Kind: NodePort, Family: IPv4, Port: 30080, ProxyPort: 41234}}, IPv4, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := render(tc.portals, tc.fam, IPTablesConfig{})
			if got := strings.Count(string(r.filter), rule+"\n"); got != tc.want {
				t.Errorf("rule written %d times, want %d:\n%s", got, tc.want, r.filter)
			}
			if r.count != strings.Count(string(r.nat)+string(r.filter), "-A ") {
				t.Errorf("count %d, but %d rules written:\n%s%s", r.count, strings.Count(string(r.nat)+string(r.filter), "-A "), r.nat, r.filter)
			}
		})
	}
}

func TestQuoteComment(t *testing.T) {
	tests := []struct{ in, want string }{
		{"default/web:http", `"default/web:http"`},
		{`evil" -j ACCEPT`, `"evil__-j_ACCEPT"`},
		{"a\nb", `"a_b"`},
		{strings.Repeat("x", 300), `"` + strings.Repeat("x", 250) + `"`},
	}
	for _, tc := range tests {
		if got := quoteComment(tc.in); got != tc.want {
			t.Errorf("quoteComment(%q) = %s, want %s", tc.in, got, tc.want)
		}
	}
}

// TestRenderUnredirectedNodePortKeepsItsFilter: a node port none of whose
// --nodeport-addresses gets a rule (only loopback ones, with
// NoLocalhostNodePorts) still has its proxy port guarded: the proxy
// listens on it all the same, and with a Local policy the external proxy
// port is its own, so no other portal gives it the rules that drop new
// connections sent straight to it.
func TestRenderUnredirectedNodePortKeepsItsFilter(t *testing.T) {
	const external = 41239 // elsewhere's external proxy port (Local policy)
	for _, fam := range []Family{IPv4, IPv6} {
		cfg := IPTablesConfig{NodePortAddresses: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("::1/128")}, NoLocalhostNodePorts: true}
		text := Render(fixedPortals(), fam, cfg)
		tables, err := parseSave(text)
		if err != nil {
			t.Fatal(err)
		}
		var accept, drop bool
		for _, args := range tables[tableFilter].rules[ChainNodePortNonLocal] {
			if !strings.Contains(args, "--dport "+strconv.Itoa(external)+" ") {
				continue
			}
			accept = accept || strings.HasSuffix(args, "-j ACCEPT")
			drop = drop || strings.Contains(args, "--ctstate NEW") && strings.HasSuffix(args, "-j DROP")
		}
		if !accept || !drop {
			t.Errorf("%s: external proxy port :%d has accept=%v drop=%v in %s, want both:\n%s", fam, external, accept, drop, ChainNodePortNonLocal, text)
		}
	}
}

// TestRenderRejectReply: a service port without endpoints refuses new TCP
// connections with a reset, in both families, and UDP and SCTP ones with
// the default ICMP port unreachable ("-j REJECT", which iptables-save
// prints with the family's reply): the kernel rate-limits ICMP errors per
// client, so a busy TCP client had most of its SYNs go unanswered and
// timed out instead of being refused (xa57); a reset is not limited, and
// tcp-reset is valid only with -p tcp. Every frontend of the port shares
// the one rule on its proxy port.
func TestRenderRejectReply(t *testing.T) {
	tests := []struct {
		name   string
		svc    state.ServicePortName
		fam    Family
		target string
	}{
		{"TCP IPv4", webHTTP, IPv4, "-j REJECT --reject-with tcp-reset"},
		{"TCP IPv6", webHTTP, IPv6, "-j REJECT --reject-with tcp-reset"},
		{"UDP IPv4", dnsUDP, IPv4, "-j REJECT"},
		{"UDP IPv6", dnsUDP, IPv6, "-j REJECT"},
		{"SCTP IPv4", sigSCTP, IPv4, "-j REJECT"},
		{"SCTP IPv6", sigSCTP, IPv6, "-j REJECT"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ip, np := netip.MustParseAddr("198.18.0.10"), netip.MustParseAddr("198.18.1.1")
			if tc.fam == IPv6 {
				ip, np = netip.MustParseAddr("fd5e:b1b5::10"), netip.MustParseAddr("fd5e:b1b5:1::1")
			}
			portals := []Portal{
				{Service: tc.svc, Kind: ClusterIP, Family: tc.fam, IP: ip, Port: 80, ProxyPort: 41234, Reject: true},
				{Service: tc.svc, Kind: LoadBalancerIP, Family: tc.fam, IP: np, Port: 80, ProxyPort: 41234, Reject: true},
				{Service: tc.svc, Kind: NodePort, Family: tc.fam, Port: 30080, ProxyPort: 41234, Reject: true},
			}
			proto := strings.ToLower(string(tc.svc.Protocol))
			want := "-A KUBE-NODEPORT-NON-LOCAL -p " + proto + ` -m comment --comment "` + tc.svc.Comment() + ` has no endpoints"` +
				" -m conntrack --ctstate NEW -m " + proto + " --dport 41234 " + tc.target + "\n"
			r := render(portals, tc.fam, IPTablesConfig{})
			filter := string(r.filter)
			if got := strings.Count(filter, want); got != 1 {
				t.Errorf("the refusing rule is written %d times, want once: %q in\n%s", got, want, filter)
			}
			if n := strings.Count(filter, "REJECT"); n != 1 {
				t.Errorf("%d REJECT rules, want the one:\n%s", n, filter)
			}
			if tc.svc.Protocol != state.TCP && strings.Contains(filter, "tcp-reset") {
				t.Errorf("tcp-reset for %s:\n%s", tc.svc.Protocol, filter)
			}
			if strings.Contains(string(r.nat), "REJECT") {
				t.Errorf("a REJECT in the nat table:\n%s", r.nat)
			}
		})
	}
}
