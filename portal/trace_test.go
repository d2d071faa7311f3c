package portal

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"testing"
)

// tracePacket follows a packet through the rendered nat rules as the
// kernel would with our jumps in place: the portal chain of its hook, then
// the node-port chain when its destination is local. It returns the
// REDIRECT port and the rule that took it, or ok false.
func tracePacket(t *testing.T, ruleText, hook, proto string, dst netip.AddrPort, local bool) (port uint16, rule string, ok bool) {
	t.Helper()
	tables, err := parseSave(ruleText)
	if err != nil {
		t.Fatalf("parse rendered rules: %v", err)
	}
	chains := map[string][]string{
		"PREROUTING": {ChainPortalsContainer, ChainNodePortContainer},
		"OUTPUT":     {ChainPortalsHost, ChainNodePortHost},
	}[hook]
	var walk func(chain string) (uint16, string, bool)
	walk = func(chain string) (uint16, string, bool) {
		for _, args := range tables[tableNAT].rules[chain] {
			if into, ok := strings.CutPrefix(args[strings.LastIndex(args, " -j ")+1:], "-j KUBE-"); ok {
				if p, rule, ok := walk("KUBE-" + into); ok { // a jump that matches everything
					return p, rule, true
				}
				continue
			}
			if p, ok := matchRule(t, args, proto, dst); ok {
				return p, chain + " " + args, true
			}
		}
		return 0, "", false
	}
	for i, chain := range chains {
		if i == 1 && !local { // the node-port jump has --dst-type LOCAL
			break
		}
		if p, rule, ok := walk(chain); ok {
			return p, rule, true
		}
	}
	return 0, "", false
}

func matchRule(t *testing.T, args, proto string, dst netip.AddrPort) (uint16, bool) {
	words, err := splitArgs(args)
	if err != nil {
		t.Fatal(err)
	}
	var to uint16
	for i := 0; i+1 < len(words); i++ {
		v := words[i+1]
		switch words[i] {
		case "-d":
			if !netip.MustParsePrefix(v).Contains(dst.Addr()) {
				return 0, false
			}
		case "-p":
			if v != proto {
				return 0, false
			}
		case "--dport":
			if v != strconv.Itoa(int(dst.Port())) {
				return 0, false
			}
		case "--to-ports":
			n, _ := strconv.Atoi(v)
			to = uint16(n)
		}
	}
	return to, to != 0
}

func TestTrace(t *testing.T) {
	nodeAddrs := []netip.Prefix{netip.MustParsePrefix("198.18.1.0/24")}
	tests := []struct {
		hook, proto, dst string
		local            bool
		nodePortAddrs    []netip.Prefix
		want             uint16 // 0: not redirected
	}{
		{"PREROUTING", "tcp", "198.18.0.10:80", false, nil, 41234},
		{"OUTPUT", "tcp", "198.18.0.10:80", false, nil, 41234},
		{"PREROUTING", "udp", "198.18.0.10:80", false, nil, 0}, // wrong protocol
		{"PREROUTING", "tcp", "198.18.0.10:81", false, nil, 0}, // wrong port
		{"PREROUTING", "tcp", "198.19.0.5:80", false, nil, 41234},
		{"OUTPUT", "tcp", "198.19.1.1:80", false, nil, 41234},
		{"PREROUTING", "udp", "198.18.0.53:53", false, nil, 41235},
		{"OUTPUT", "udp", "198.18.0.53:53", false, nil, 41235},
		{"PREROUTING", "sctp", "198.18.0.99:3868", false, nil, 41236},
		{"PREROUTING", "tcp", "[fd5e:b1b5::10]:80", false, nil, 41234},
		{"OUTPUT", "tcp", "[fd5e:b1b5::80]:8080", false, nil, 41237},
		{"PREROUTING", "tcp", "198.18.1.1:30080", true, nil, 41234},
		{"OUTPUT", "udp", "127.0.0.1:30053", true, nil, 41235},
		{"PREROUTING", "tcp", "198.18.9.9:30080", false, nil, 0}, // not a local address
		{"PREROUTING", "tcp", "[fd5e:b1b5:1::1]:30081", true, nil, 41237},
		{"PREROUTING", "tcp", "198.18.1.1:30080", true, nodeAddrs, 41234},
		{"OUTPUT", "tcp", "127.0.0.1:30080", true, nodeAddrs, 0}, // outside --nodeport-addresses
		{"PREROUTING", "tcp", "[fd5e:b1b5:1::1]:30081", true, nodeAddrs, 0},
	}
	for _, tc := range tests {
		dst := netip.MustParseAddrPort(tc.dst)
		name := fmt.Sprintf("%s %s/%s local=%v nodeports=%v", tc.hook, tc.dst, strings.ToUpper(tc.proto), tc.local, tc.nodePortAddrs)
		t.Run(name, func(t *testing.T) {
			text := Render(fixedPortals(), FamilyOf(dst.Addr()), tc.nodePortAddrs)
			got, rule, ok := tracePacket(t, text, tc.hook, tc.proto, dst, tc.local)
			if tc.want == 0 {
				if ok {
					t.Errorf("%s redirects to :%d by %q, want no redirect", tc.dst, got, rule)
				}
				return
			}
			if !ok || got != tc.want {
				t.Errorf("%s/%s redirects to :%d (%v), want :%d", tc.dst, strings.ToUpper(tc.proto), got, ok, tc.want)
			}
			// The fake agrees with the rules for address portals.
			f := &Fake{NodePortAddresses: tc.nodePortAddrs}
			f.Sync(t.Context(), fixedPortals())
			if fp, _ := f.Lookup(strings.ToUpper(tc.proto), dst); !tc.local && fp != got {
				t.Errorf("Fake.Lookup = :%d, rules say :%d", fp, got)
			}
		})
	}
}
