package portal

import (
	"net/netip"
	"slices"
	"strings"
	"testing"
)

// TestRenderNoLocalExternalFrontends: an external frontend (external or
// load-balancer IP, as a node port) of a Local policy with endpoints on
// other nodes only still accepts what this host and its pods send through
// it, which the proxy takes to every endpoint, as kube-proxy routes them;
// only the rest is dropped. A cluster IP with a Local internal policy
// drops all of its new connections.
func TestRenderNoLocalExternalFrontends(t *testing.T) {
	pods := []netip.Prefix{netip.MustParsePrefix("198.18.10.0/24"), netip.MustParsePrefix("fd5e:b1b5:10::/64")}
	const (
		local    = `-A KUBE-NODEPORT-NON-LOCAL -p tcp -m comment --comment "default/elsewhere:http" -m addrtype --src-type LOCAL -m conntrack --ctstate DNAT -m tcp --dport 41239 -j ACCEPT`
		fromPods = `-A KUBE-NODEPORT-NON-LOCAL -s 198.18.10.0/24 -p tcp -m comment --comment "default/elsewhere:http" -m conntrack --ctstate DNAT -m tcp --dport 41239 -j ACCEPT`
		drop     = `-A KUBE-NODEPORT-NON-LOCAL -p tcp -m comment --comment "default/elsewhere:http has no local endpoints" -m conntrack --ctstate NEW -m tcp --dport 41239 -j DROP`
	)
	tests := []struct {
		name     string
		p        Portal
		accepted bool // this host's and pods' traffic
	}{
		{"external IP", Portal{Kind: ExternalIP, IP: netip.MustParseAddr("198.19.0.7")}, true},
		{"load-balancer IP", Portal{Kind: LoadBalancerIP, IP: netip.MustParseAddr("198.19.1.7")}, true},
		{"load-balancer IP with source ranges", Portal{Kind: LoadBalancerIP, IP: netip.MustParseAddr("198.19.1.7"), SourceRanges: []netip.Prefix{netip.MustParsePrefix("203.0.113.0/24")}}, true},
		{"node port", Portal{Kind: NodePort, Port: 30070}, true},
		{"cluster IP", Portal{Kind: ClusterIP, IP: netip.MustParseAddr("198.18.0.70")}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := tc.p
			p.Service, p.Family, p.ProxyPort, p.NoLocal = elsewhere, IPv4, 41239, true
			if p.Port == 0 {
				p.Port = 80
			}
			filter := string(render([]Portal{p}, IPv4, IPTablesConfig{ClusterCIDRs: pods}).filter)
			var want []string
			if tc.accepted {
				want = append(want, local, fromPods)
			}
			want = append(want, drop)
			var got []string
			for _, l := range strings.Split(filter, "\n") {
				if strings.HasPrefix(l, "-A "+ChainNodePortNonLocal+" ") {
					got = append(got, l)
				}
			}
			if !slices.Equal(got, want) {
				t.Errorf("%s rules\n%s\nwant\n%s", ChainNodePortNonLocal, strings.Join(got, "\n"), strings.Join(want, "\n"))
			}
		})
	}
}

// TestParseSaveEdges: a line parseSave cannot place in a table is an
// error, never a rule of some table: one after COMMIT, or a rule without
// a chain.
func TestParseSaveEdges(t *testing.T) {
	for _, text := range []string{
		"*nat\n:KUBE-PORTALS-CONTAINER - [0:0]\nCOMMIT\n-A KUBE-PORTALS-CONTAINER -j ACCEPT\n",
		"*nat\nCOMMIT\n[1:2] -A KUBE-PORTALS-CONTAINER -j ACCEPT\n",
		"*nat\n-A  -j ACCEPT\nCOMMIT\n",
		"*nat\n[1:2] -A  -j ACCEPT\nCOMMIT\n",
	} {
		if tables, err := parseSave(text); err == nil {
			t.Errorf("parseSave(%q) accepted: %v", text, tables[tableNAT].rules)
		}
	}
	// Tables may come back after a COMMIT; their rules add up.
	tables, err := parseSave("*nat\n-A X -j Y\nCOMMIT\n*filter\n-A Z -j Y\nCOMMIT\n*nat\n-A X -j W\nCOMMIT\n")
	if err != nil {
		t.Fatal(err)
	}
	if got := tables[tableNAT].rules["X"]; !slices.Equal(got, []string{"-j Y", "-j W"}) {
		t.Errorf("nat X = %q", got)
	}
	if got := tables[tableFilter].rules["Z"]; !slices.Equal(got, []string{"-j Y"}) {
		t.Errorf("filter Z = %q", got)
	}
}

// TestSplitArgsEdges: a backslash escapes the next character, which then
// makes a word by itself; a backslash with nothing after it is an error,
// like an open quote.
func TestSplitArgsEdges(t *testing.T) {
	tests := []struct {
		in   string
		want []string
		bad  bool
	}{
		{in: `a \" b`, want: []string{"a", `"`, "b"}},
		{in: `\  x`, want: []string{" ", "x"}},
		{in: `a\ b c`, want: []string{"a b", "c"}},
		{in: `--comment ""`, want: []string{"--comment", ""}},
		{in: `-j X\`, bad: true},
		{in: `\`, bad: true},
		{in: `"a\"`, bad: true},
	}
	for _, tc := range tests {
		got, err := splitArgs(tc.in)
		if tc.bad {
			if err == nil {
				t.Errorf("splitArgs(%q) = %q, want an error", tc.in, got)
			}
			continue
		}
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("splitArgs(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
}

// TestParseRuleEdges: only what render writes reads back as a portal. A
// port outside 1-65535 is refused, not wrapped; an address portal's
// destination is one address (a hand-widened -d is not the portal it was);
// the comment names a namespace and a name.
func TestParseRuleEdges(t *testing.T) {
	rule := func(dst, comment, dport, to string) string {
		s := ""
		if dst != "" {
			s = "-d " + dst + " "
		}
		return s + `-p udp -m comment --comment "` + comment + `" -m udp --dport ` + dport + " -j REDIRECT --to-ports " + to
	}
	const svc = "kube-system/dns:dns"
	tests := []struct {
		name, chain, args string
		ok                bool
	}{
		{"as rendered", ChainPortalsContainer, rule("198.18.0.53/32", svc, "53", "41235"), true},
		{"node port as rendered", ChainNodePortContainer, rule("", svc, "30053", "41235"), true},
		{"ports at the top", ChainPortalsContainer, rule("198.18.0.53/32", svc, "65535", "65535"), true},
		{"service port 0", ChainPortalsContainer, rule("198.18.0.53/32", svc, "0", "41235"), false},
		{"proxy port 0", ChainNodePortContainer, rule("", svc, "30053", "0"), false},
		{"DNAT to port 0", ChainPortalsContainer, `-d 198.18.0.53/32 -p udp -m comment --comment "` + svc + `" -m udp --dport 53 -j DNAT --to-destination 198.18.2.1:0`, false},
		{"service port 65536", ChainPortalsContainer, rule("198.18.0.53/32", svc, "65536", "41235"), false},
		{"proxy port 106771 (41235+65536)", ChainNodePortContainer, rule("", svc, "30053", "106771"), false},
		{"a CIDR destination", ChainPortalsContainer, rule("198.18.0.53/24", svc, "53", "41235"), false},
		{"a CIDR destination, host chain", ChainPortalsHost, rule("fd5e:b1b5::53/64", svc, "53", "41235"), false},
		{"no namespace", ChainPortalsContainer, rule("198.18.0.53/32", "/dns:dns", "53", "41235"), false},
		{"no name", ChainPortalsContainer, rule("198.18.0.53/32", "kube-system/:dns", "53", "41235"), false},
		{"nothing after the slash", ChainPortalsContainer, rule("198.18.0.53/32", "kube-system/", "53", "41235"), false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p, err := parseRule(tc.chain, tc.args)
			if (err == nil) != tc.ok {
				t.Fatalf("parseRule(%s, %q) = %v, %v; want ok=%v", tc.chain, tc.args, p, err, tc.ok)
			}
			if err == nil {
				if verr := p.validate(); verr != nil {
					t.Errorf("parseRule read %v, which is invalid: %v", p, verr)
				}
			}
		})
	}
}

// TestWidenedPortalDestinationIsDrift: a portal rule whose -d was widened
// by hand from the frontend's /32 to a /24 (the same address written
// first) is not read back as the portal render wrote, so the read-back
// that decides whether to write again sees it.
func TestWidenedPortalDestinationIsDrift(t *testing.T) {
	text := Render(fixedPortals(), IPv4, IPTablesConfig{})
	edited := strings.Replace(text, "-d 198.18.0.53/32 -p udp", "-d 198.18.0.53/24 -p udp", 1)
	if edited == text {
		t.Fatal("no rule to edit")
	}
	read := func(s string) ([]Portal, int) {
		tables, err := parseSave(s)
		if err != nil {
			t.Fatal(err)
		}
		return portalsInSave(tables, IPv4)
	}
	want, _ := read(text)
	got, bad := read(edited)
	if bad != 1 || slices.EqualFunc(got, want, Portal.Equal) {
		t.Errorf("widened rule read back as %v (%d unreadable), the same as the rendered one", got, bad)
	}
}

// TestMovedNodePortsEdges: node ports that only the earlier rules hold are
// not moved (conntrack.StaleUDP sees removed ones); a loopback guard that
// went missing (deleted by hand) moves every node port both hold, even
// with the same destinations, as MovedNodePorts documents.
func TestMovedNodePortsEdges(t *testing.T) {
	all := fixedPortals()
	withoutDNS := slices.DeleteFunc(slices.Clone(all), func(p Portal) bool { return p.Kind == NodePort && p.Service == dnsUDP })
	nodePorts := func(ps []Portal) (out []uint16) {
		for _, p := range ps {
			out = append(out, p.Port)
		}
		slices.Sort(out)
		return slices.Compact(out)
	}

	before := Render(all, IPv4, IPTablesConfig{})
	if from, to := movedNodePorts([]byte(before), []byte(Render(withoutDNS, IPv4, IPTablesConfig{})), IPv4); len(from)+len(to) != 0 {
		t.Errorf("a removed node port moved: %v -> %v", from, to)
	}
	if from, to := movedNodePorts([]byte(Render(withoutDNS, IPv4, IPTablesConfig{})), []byte(before), IPv4); len(from)+len(to) != 0 {
		t.Errorf("an added node port moved: %v -> %v", from, to)
	}

	var lines []string
	for _, l := range strings.Split(before, "\n") {
		if !strings.Contains(l, loopbackGuardComment) {
			lines = append(lines, l)
		}
	}
	noGuard := strings.Join(lines, "\n")
	if noGuard == before {
		t.Fatal("no loopback guard to delete")
	}
	want := []uint16{30053, 30070, 30080}
	from, to := movedNodePorts([]byte(noGuard), []byte(before), IPv4)
	if !slices.Equal(nodePorts(from), want) || !slices.Equal(nodePorts(to), want) {
		t.Errorf("guard put back: moved %v -> %v, want every node port %v", nodePorts(from), nodePorts(to), want)
	}
}
