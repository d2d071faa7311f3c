package portal

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/state"
)

// savedTable is one table of iptables-save output.
type savedTable struct {
	chains []string            // declared chains, in order
	rules  map[string][]string // chain -> rule arguments after "-A CHAIN "
}

// parseSave reads iptables-save output into its tables. It accepts what
// both backends print, including their comments and counters, and returns
// an error for a line it cannot place.
func parseSave(text string) (map[string]*savedTable, error) {
	tables := make(map[string]*savedTable)
	var cur *savedTable
	for n, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		switch {
		case line == "" || strings.HasPrefix(line, "#"):
		case strings.HasPrefix(line, "*"):
			name := line[1:]
			if name == "" {
				return nil, fmt.Errorf("line %d: table without a name", n+1)
			}
			cur = tables[name]
			if cur == nil {
				cur = &savedTable{rules: make(map[string][]string)}
				tables[name] = cur
			}
		case line == "COMMIT":
			cur = nil
		case cur == nil:
			return nil, fmt.Errorf("line %d: %q outside a table", n+1, line)
		case strings.HasPrefix(line, ":"):
			name, _, _ := strings.Cut(line[1:], " ")
			if name == "" {
				return nil, fmt.Errorf("line %d: chain without a name", n+1)
			}
			cur.chains = append(cur.chains, name)
		case strings.HasPrefix(line, "[") || strings.HasPrefix(line, "-A "):
			if strings.HasPrefix(line, "[") { // iptables-save -c counters
				_, rest, ok := strings.Cut(line, "] ")
				if !ok {
					return nil, fmt.Errorf("line %d: bad counters", n+1)
				}
				line = rest
			}
			rest, ok := strings.CutPrefix(line, "-A ")
			if !ok {
				return nil, fmt.Errorf("line %d: %q is not a rule", n+1, line)
			}
			chain, args, _ := strings.Cut(rest, " ")
			if chain == "" {
				return nil, fmt.Errorf("line %d: rule without a chain", n+1)
			}
			cur.rules[chain] = append(cur.rules[chain], args)
		default:
			return nil, fmt.Errorf("line %d: unknown line %q", n+1, line)
		}
	}
	return tables, nil
}

// countRules counts the rules in iptables-save output, ignoring what it
// cannot parse (a backend that is not there prints nothing or an error).
func countRules(text string) int {
	n := 0
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "-A ") {
			n++
		}
	}
	return n
}

// splitArgs splits rule arguments as iptables-save quotes them: double
// quotes group words, and a backslash escapes the next character.
func splitArgs(s string) ([]string, error) {
	var out []string
	var cur strings.Builder
	inWord, quoted, escaped := false, false, false
	for _, r := range s {
		switch {
		case escaped:
			cur.WriteRune(r)
			escaped = false
		case r == '\\':
			escaped, inWord = true, true
		case r == '"':
			quoted, inWord = !quoted, true
		case (r == ' ' || r == '\t') && !quoted:
			if inWord {
				out = append(out, cur.String())
				cur.Reset()
				inWord = false
			}
		default:
			cur.WriteRune(r)
			inWord = true
		}
	}
	if quoted || escaped {
		return nil, fmt.Errorf("unterminated quote in %q", s)
	}
	if inWord {
		out = append(out, cur.String())
	}
	return out, nil
}

// parseRule reads one of our portal rules (the arguments after
// "-A CHAIN ") back into a Portal. Address rules come back as ClusterIP:
// the rules do not tell the address kinds apart.
func parseRule(chain, args string) (Portal, error) {
	words, err := splitArgs(args)
	if err != nil {
		return Portal{}, err
	}
	vals := make(map[string]string)
	for i := 0; i < len(words); i++ {
		switch w := words[i]; w {
		case "-d", "-p", "--comment", "--dport", "--to-ports", "--to-destination":
			if i+1 >= len(words) {
				return Portal{}, fmt.Errorf("%s without a value", w)
			}
			i++
			vals[w] = words[i]
		}
	}
	var p Portal
	dst := vals["-d"]
	if to, ok := vals["--to-destination"]; ok {
		// A DNAT to a node address (IPTablesConfig.DNAT) and the proxy port.
		ap, err := netip.ParseAddrPort(to)
		if err != nil {
			return Portal{}, fmt.Errorf("bad --to-destination %q", to)
		}
		vals["--to-ports"] = strconv.Itoa(int(ap.Port()))
	}
	for _, f := range []struct {
		flag string
		to   *uint16
	}{{"--dport", &p.Port}, {"--to-ports", &p.ProxyPort}} {
		n, err := strconv.ParseUint(vals[f.flag], 10, 16)
		if err != nil || n == 0 {
			return Portal{}, fmt.Errorf("bad %s %q", f.flag, vals[f.flag])
		}
		*f.to = uint16(n)
	}
	if p.Service, err = parseComment(vals["--comment"], vals["-p"]); err != nil {
		return Portal{}, err
	}
	switch chain {
	case ChainPortalsContainer, ChainPortalsHost:
		pfx, err := netip.ParsePrefix(dst)
		if err != nil || !pfx.IsSingleIP() {
			return Portal{}, fmt.Errorf("bad destination %q", dst)
		}
		p.Kind, p.IP, p.Family = ClusterIP, pfx.Addr(), FamilyOf(pfx.Addr())
	case ChainNodePortContainer, ChainNodePortHost:
		p.Kind, p.Family = NodePort, IPv4
		if dst != "" {
			pfx, err := netip.ParsePrefix(dst)
			if err != nil {
				return Portal{}, fmt.Errorf("bad destination %q", dst)
			}
			p.Family, p.NodePortDst = FamilyOf(pfx.Addr()), pfx.Masked()
		}
	default:
		return Portal{}, fmt.Errorf("chain %s is not a portal chain", chain)
	}
	return p, nil
}

// parseComment reads "ns/name:port" (or "ns/name") and a lower-case
// protocol back into a service port name.
func parseComment(comment, proto string) (state.ServicePortName, error) {
	pr, err := state.ParseProtocol(proto)
	if err != nil {
		return state.ServicePortName{}, err
	}
	ns, rest, ok := strings.Cut(comment, "/")
	if !ok || ns == "" || rest == "" {
		return state.ServicePortName{}, fmt.Errorf("comment %q is not ns/name:port", comment)
	}
	name, port, _ := strings.Cut(rest, ":")
	if name == "" {
		return state.ServicePortName{}, fmt.Errorf("comment %q is not ns/name:port", comment)
	}
	return state.ServicePortName{Namespace: ns, Name: name, Port: port, Protocol: pr}, nil
}

// targetsInSave returns where our nat chains of tables send traffic, the
// ports aside (portalsInSave reads those): "REDIRECT", or the DNAT
// addresses, and each RETURN guard ("RETURN", its chain and arguments),
// sorted, each once, prefixed with fam.
func targetsInSave(tables map[string]*savedTable, fam Family) []string {
	nat := tables[tableNAT]
	if nat == nil {
		return nil
	}
	var out []string
	for _, chain := range portalChains {
		for _, args := range nat.rules[chain] {
			_, target, ok := strings.Cut(args, " -j ")
			if ok && strings.HasSuffix(args, " -j RETURN") {
				// A loopback guard (see loopbackGuardComment): where
				// it is, and for what, so that a deleted or edited
				// one is seen.
				if words, err := splitArgs(args); err == nil {
					out = append(out, fam.String()+" RETURN "+chain+" "+strings.Join(words, " "))
				}
				continue
			}
			if !ok || notPortal(args) {
				continue
			}
			if to, isDNAT := strings.CutPrefix(target, "DNAT --to-destination "); isDNAT {
				if f := strings.Fields(to); len(f) > 0 {
					if ap, err := netip.ParseAddrPort(f[0]); err == nil {
						target = "DNAT " + ap.Addr().String()
					}
				}
			} else {
				target, _, _ = strings.Cut(target, " ")
			}
			out = append(out, fam.String()+" "+target)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// portalChains are the nat chains whose rules are portals: the container
// chains, and the host chains, which redirect loopback destinations
// themselves (the container chains leave them alone).
var portalChains = []string{ChainPortalsContainer, ChainPortalsHost, ChainNodePortContainer, ChainNodePortHost}

// notPortal reports whether a rule of portalChains is no portal: a jump
// into another of our chains, or the container chain's return on loopback
// destinations.
func notPortal(args string) bool {
	return strings.HasSuffix(args, " -j RETURN") || strings.Contains(args, " -j KUBE-")
}

// portalsInSave returns the portals our container chains (and the host
// node-port chain, for loopback destinations) hold in nat-table
// iptables-save output of family fam, sorted; the host chains otherwise
// jump into the container ones. Rules it cannot read are skipped and
// counted.
func portalsInSave(tables map[string]*savedTable, fam Family) (out []Portal, unreadable int) {
	nat := tables[tableNAT]
	if nat == nil {
		return nil, 0
	}
	for _, chain := range portalChains {
		for _, args := range nat.rules[chain] {
			if notPortal(args) {
				continue
			}
			p, err := parseRule(chain, args)
			if err != nil {
				unreadable++
				continue
			}
			if p.Kind == NodePort {
				p.Family = fam
			}
			out = append(out, p)
		}
	}
	// A portal with loadBalancerSourceRanges has a rule per range.
	slices.SortFunc(out, Portal.Compare)
	return slices.CompactFunc(out, Portal.Equal), unreadable
}

// parseTargets turns targetsInSave's words back into addresses.
func parseTargets(to []string) map[Family][]netip.Addr {
	out := make(map[Family][]netip.Addr)
	for _, t := range to {
		fam, target, _ := strings.Cut(t, " ")
		f := IPv4
		if fam == IPv6.String() {
			f = IPv6
		}
		switch {
		case target == "REDIRECT":
			out[f] = append(out[f], netip.Addr{})
		case strings.HasPrefix(target, "DNAT "):
			if a, err := netip.ParseAddr(strings.TrimPrefix(target, "DNAT ")); err == nil {
				out[f] = append(out[f], a)
			}
		}
	}
	return out
}

// movedNodePorts compares the node-port rules of two nat-table texts of
// family fam (iptables-save output, or what render wrote) and returns the
// node ports both hold whose destinations differ, as each text has them:
// every one when the loopback guards differ. Node ports only one text
// holds are left out (conntrack.StaleUDP sees those); so is everything
// when before cannot be read.
func movedNodePorts(before, after []byte, fam Family) (from, to []Portal) {
	bt, err := parseSave(string(before))
	if err != nil {
		return nil, nil
	}
	at, err := parseSave(string(after))
	if err != nil {
		return nil, nil
	}
	type key struct {
		svc  state.ServicePortName
		port uint16
	}
	byKey := func(tables map[string]*savedTable) map[key][]Portal {
		m := make(map[key][]Portal)
		ps, _ := portalsInSave(tables, fam)
		for _, p := range ps {
			if p.Kind == NodePort {
				k := key{p.Service, p.Port}
				m[k] = append(m[k], p)
			}
		}
		return m
	}
	guards := func(tables map[string]*savedTable) []string {
		return slices.DeleteFunc(targetsInSave(tables, fam), func(t string) bool {
			return !strings.HasPrefix(t, fam.String()+" RETURN ")
		})
	}
	all := !slices.Equal(guards(bt), guards(at))
	was, is := byKey(bt), byKey(at)
	dsts := func(ps []Portal) []netip.Prefix {
		var out []netip.Prefix
		for _, p := range ps {
			out = append(out, p.NodePortDst)
		}
		slices.SortFunc(out, comparePrefix)
		return slices.Compact(out)
	}
	for k, old := range was {
		now, ok := is[k]
		if !ok || !all && slices.Equal(dsts(old), dsts(now)) {
			continue
		}
		from = append(from, old...)
		to = append(to, now...)
	}
	slices.SortFunc(from, Portal.Compare)
	slices.SortFunc(to, Portal.Compare)
	return from, to
}

// ruleWords reads one rule of family fam as iptables-save prints it (the
// arguments after "-A CHAIN ") into words comparable with render's: the
// quoting undone (iptables-save quotes a comment only when it must), and
// a REJECT with the default reply read as render writes it
// (iptables-save adds "--reject-with icmp-port-unreachable", or
// icmp6-port-unreachable in IPv6, to the "-j REJECT" iptables-restore
// took). Nothing else is read as equal.
func ruleWords(args string, fam Family) ([]string, error) {
	words, err := splitArgs(args)
	if err != nil {
		return nil, err
	}
	def := "icmp-port-unreachable"
	if fam == IPv6 {
		def = "icmp6-port-unreachable"
	}
	if n := len(words); n >= 4 && words[n-4] == "-j" && words[n-3] == "REJECT" && words[n-2] == "--reject-with" && words[n-1] == def {
		words = words[:n-2]
	}
	return words, nil
}

// chainDiff compares the rules of one chain of family fam, as
// iptables-save printed them (got) and as render wrote them (want), each
// the arguments after "-A CHAIN ", in order. It returns "" when they are
// the same rules, else what differs first, for the log.
func chainDiff(got, want []string, fam Family) string {
	for i := range max(len(got), len(want)) {
		if i >= len(got) {
			return fmt.Sprintf("rule %d missing: %s", i+1, want[i])
		}
		if i >= len(want) {
			return fmt.Sprintf("rule %d extra: %s", i+1, got[i])
		}
		g, gerr := ruleWords(got[i], fam)
		w, werr := ruleWords(want[i], fam)
		if gerr != nil || werr != nil || !slices.Equal(g, w) {
			return fmt.Sprintf("rule %d is %s, not %s", i+1, got[i], want[i])
		}
	}
	return ""
}
