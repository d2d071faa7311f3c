package portal

import (
	"bytes"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/state"
)

// The tables and chains of the iptables portal: the legacy userspace names,
// so old documentation still teaches (DESIGN.md, "Portal chains").
const (
	tableNAT    = "nat"
	tableFilter = "filter"

	ChainPortalsContainer  = "KUBE-PORTALS-CONTAINER"
	ChainPortalsHost       = "KUBE-PORTALS-HOST"
	ChainNodePortContainer = "KUBE-NODEPORT-CONTAINER"
	ChainNodePortHost      = "KUBE-NODEPORT-HOST"
	ChainNodePortNonLocal  = "KUBE-NODEPORT-NON-LOCAL"
	// ChainFirewall drops new traffic to a load-balancer IP from sources
	// outside its loadBalancerSourceRanges, which the portal chains did
	// not redirect. (kube-proxy's own chain, KUBE-PROXY-FIREWALL, is not
	// reused: a leftover of it is kube-proxy's to remove.)
	ChainFirewall = "KUBE-PORTALS-FIREWALL"
)

// natChains are our nat chains in the order they are declared.
var natChains = []string{ChainPortalsContainer, ChainPortalsHost, ChainNodePortContainer, ChainNodePortHost}

// jump is a rule in a built-in chain that enters one of ours.
type jump struct {
	table, from, to string
	// prepend puts the jump first in from; otherwise it is appended. The
	// portal jumps must come before the node-port ones: on clouds that
	// install load-balancer IPs as local routes, "--dst-type LOCAL" would
	// otherwise catch them.
	prepend bool
	match   []string // matches before the comment
	comment string
}

// spec is the rule as go-iptables takes it (no quoting).
func (j jump) spec() []string {
	return slices.Concat(j.match, []string{"-m", "comment", "--comment", j.comment, "-j", j.to})
}

const (
	hostJumpComment     = "kube-userspace-proxy: node traffic takes the same portals"
	jumpPortalsComment  = "kube-userspace-proxy service portals; keep before the node port jump"
	jumpNodePortComment = "kube-userspace-proxy node ports; keep as the last rule"
	jumpNonLocalComment = "kube-userspace-proxy: accept new connections to proxy ports"
	jumpFirewallComment = "kube-userspace-proxy: load-balancer source ranges"
)

var (
	localOnly = []string{"-m", "addrtype", "--dst-type", "LOCAL"}
	newOnly   = []string{"-m", "conntrack", "--ctstate", "NEW"}
)

// jumps lists our jump rules, in the order Sync ensures them.
var jumps = []jump{
	{table: tableNAT, from: "PREROUTING", to: ChainPortalsContainer, prepend: true, comment: jumpPortalsComment},
	{table: tableNAT, from: "OUTPUT", to: ChainPortalsHost, prepend: true, comment: jumpPortalsComment},
	{table: tableNAT, from: "PREROUTING", to: ChainNodePortContainer, match: localOnly, comment: jumpNodePortComment},
	{table: tableNAT, from: "OUTPUT", to: ChainNodePortHost, match: localOnly, comment: jumpNodePortComment},
	{table: tableFilter, from: "INPUT", to: ChainNodePortNonLocal, prepend: true, comment: jumpNonLocalComment},
	// Traffic the portals did not redirect keeps its load-balancer IP as
	// destination: it is for this host (INPUT), routed through it
	// (FORWARD) or sent by it (OUTPUT).
	{table: tableFilter, from: "INPUT", to: ChainFirewall, prepend: true, match: newOnly, comment: jumpFirewallComment},
	{table: tableFilter, from: "FORWARD", to: ChainFirewall, prepend: true, match: newOnly, comment: jumpFirewallComment},
	{table: tableFilter, from: "OUTPUT", to: ChainFirewall, prepend: true, match: newOnly, comment: jumpFirewallComment},
}

// ownedChains lists every chain we own, by table.
var ownedChains = map[string][]string{
	tableNAT:    natChains,
	tableFilter: {ChainNodePortNonLocal, ChainFirewall},
}

// validate reports why a portal cannot be written as a rule.
func (p Portal) validate() error {
	switch p.Protocol() {
	case state.TCP, state.UDP, state.SCTP:
	default:
		return fmt.Errorf("unknown protocol %q", p.Protocol())
	}
	if p.Port == 0 {
		return fmt.Errorf("no port")
	}
	if p.Family != IPv4 && p.Family != IPv6 {
		return fmt.Errorf("unknown IP family %d", p.Family)
	}
	switch p.Kind {
	case NodePort:
		if p.IP.IsValid() {
			return fmt.Errorf("a node port has no frontend address")
		}
	case ClusterIP, ExternalIP, LoadBalancerIP:
		if !p.IP.IsValid() || p.IP.IsUnspecified() {
			return fmt.Errorf("no frontend address")
		}
		if FamilyOf(p.IP) != p.Family {
			return fmt.Errorf("address %s is not %s", p.IP, p.Family)
		}
	default:
		return fmt.Errorf("unknown kind %q", p.Kind)
	}
	return nil
}

// rules is what one family's restore writes: the text for each table.
type rules struct {
	nat, filter []byte
	count       int // rules written
}

// render writes the iptables-restore input of our chains for one family.
// Portals of the other family, without a proxy port or invalid are left
// out (Sync reports the invalid ones); one without a proxy port still has
// its health-check node port accepted, which the proxy serves without a
// redirect. Rules follow iptables-save's argument order so that a save of
// our chains reads the same.
func render(portals []Portal, fam Family, cfg IPTablesConfig) rules {
	var dnat netip.Addr
	if cfg.DNAT != nil {
		if a := cfg.DNAT(fam); a.IsValid() && FamilyOf(a) == fam {
			dnat = a
		}
	}
	var chains [4]bytes.Buffer // natChains order
	var filter, health, firewall bytes.Buffer
	var r rules
	accepted := make(map[string]bool)
	guardLoopback := false // the container node-port chain may match loopback
	guardPortals := false  // a frontend is a loopback address
	for _, p := range portals {
		if p.Family != fam || p.validate() != nil {
			continue
		}
		if hc := p.HealthCheckNodePort; hc != 0 {
			// The health-check node port is served by the proxy itself,
			// whatever its proxy ports: a cloud load balancer's checks
			// must get through an INPUT policy that drops, as kube-proxy
			// accepts them ("ns/svc health check node port", whether or
			// not the node has local endpoints).
			comment := strings.TrimSuffix(quoteComment(p.Service.Namespace+"/"+p.Service.Name), `"`) + ` health check node port"`
			if key := "hc/" + strconv.Itoa(int(hc)) + "/" + comment; !accepted[key] {
				accepted[key] = true
				fmt.Fprintf(&health, "-A %s -p tcp -m comment --comment %s -m tcp --dport %d -j ACCEPT\n", ChainNodePortNonLocal, comment, hc)
				r.count++
			}
		}
		if p.ProxyPort == 0 {
			continue
		}
		proto := strings.ToLower(string(p.Protocol()))
		comment := quoteComment(p.Service.Comment())
		target := "-j REDIRECT --to-ports " + strconv.Itoa(int(p.ProxyPort))
		if dnat.IsValid() {
			target = "-j DNAT --to-destination " + netip.AddrPortFrom(dnat, p.ProxyPort).String()
		}
		match := func(src, dst string) string {
			s := ""
			if src != "" {
				s = "-s " + src + " "
			}
			if dst != "" {
				s += "-d " + dst + " "
			}
			return s + "-p " + proto + " -m comment --comment " + comment +
				" -m " + proto + " --dport " + strconv.Itoa(int(p.Port)) + " " + target + "\n"
		}
		if p.Kind == NodePort {
			// Per family, as kube-proxy reads --nodeport-addresses: a
			// family none of the CIDRs is in (or with a zero CIDR) has
			// its node ports on every local address.
			dsts := []string{""}
			if !state.NodePortsEverywhere(cfg.NodePortAddresses, fam == IPv6) {
				dsts = dsts[:0]
				for _, pfx := range cfg.NodePortAddresses {
					if FamilyOf(pfx.Addr()) == fam {
						dsts = append(dsts, pfx.Masked().String())
					}
				}
			}
			// Loopback destinations are this host's alone: only its own
			// traffic (OUTPUT, the host chain) is redirected there. From
			// PREROUTING a packet to 127.0.0.1 comes from another host
			// (one with route_localnet), and a REDIRECT would rewrite
			// that martian destination before routing could drop it
			// (CVE-2020-8558): the container chain returns on them.
			for _, d := range dsts {
				lo, inLoopback := loopbackPart(d, fam)
				if lo != "" && !cfg.NoLocalhostNodePorts {
					chains[3].WriteString("-A " + ChainNodePortHost + " " + match("", lo))
					r.count++
				}
				if inLoopback {
					continue
				}
				guardLoopback = guardLoopback || lo != "" || d == ""
				chains[2].WriteString("-A " + ChainNodePortContainer + " " + match("", d))
				r.count++
			}
			// With no rule (no --nodeport-addresses address of fam, or
			// only loopback ones and NoLocalhostNodePorts) the proxy
			// port still gets its filter rules below: it listens all the
			// same, and a Local policy's external proxy port serves no
			// other portal that would give it them.
		} else {
			dst := netip.PrefixFrom(p.IP, p.IP.BitLen()).String()
			// A loopback frontend (an external or load-balancer IP in
			// 127.0.0.0/8 or ::1, which manifests may give) is this
			// host's alone, as loopback node ports are: its rule goes in
			// the host chain (OUTPUT), ahead of the jump into the
			// container chain, which returns on loopback destinations
			// (CVE-2020-8558, see loopbackGuardComment).
			ci, chain := 0, ChainPortalsContainer
			if p.IP.IsLoopback() {
				ci, chain, guardPortals = 1, ChainPortalsHost, true
			}
			if p.Kind == LoadBalancerIP && p.SourceRanges != nil {
				// Only the admitted sources are redirected; the firewall
				// chain drops the rest, as kube-proxy drops them.
				for _, src := range p.SourceRanges {
					if FamilyOf(src.Addr()) == fam {
						chains[ci].WriteString("-A " + chain + " " + match(src.Masked().String(), dst))
						r.count++
					}
				}
				fmt.Fprintf(&firewall, "-A %s -d %s -p %s -m comment --comment %s -m %s --dport %d -j DROP\n",
					ChainFirewall, dst, proto, strings.TrimSuffix(comment, `"`)+` source not in loadBalancerSourceRanges"`, proto, p.Port)
				r.count++
			} else {
				chains[ci].WriteString("-A " + chain + " " + match("", dst))
				r.count++
			}
		}
		// INPUT sees the packet after REDIRECT, so the filter rules match
		// the proxy port. The first rule accepts what a portal redirected
		// (conntrack's DNAT state), for hosts whose INPUT policy drops;
		// the second drops new connections straight to the proxy port,
		// which would get round loadBalancerSourceRanges and Local
		// traffic policies. A service port without endpoints has all its
		// new connections refused instead, as kube-proxy's REJECT rules
		// refuse them (see rejectTarget for how); one with endpoints,
		// but none on this node for a Local policy, has them dropped, as
		// kube-proxy's DROP rules drop them, except (external traffic)
		// those from this host or a pod, which go to every endpoint.
		key := proto + "/" + strconv.Itoa(int(p.ProxyPort)) + "/" + comment
		if !accepted[key] {
			accepted[key] = true
			// accept takes redirected connections (from src, matching
			// match, if given); refuse turns away every other new one.
			accept := func(src, match string) {
				if src != "" {
					src = "-s " + src + " "
				}
				fmt.Fprintf(&filter, "-A %s %s-p %s -m comment --comment %s %s-m conntrack --ctstate DNAT -m %s --dport %d -j ACCEPT\n",
					ChainNodePortNonLocal, src, proto, comment, match, proto, p.ProxyPort)
				r.count++
			}
			refuse := func(why, target string) {
				fmt.Fprintf(&filter, "-A %s -p %s -m comment --comment %s -m conntrack --ctstate NEW -m %s --dport %d -j %s\n",
					ChainNodePortNonLocal, proto, strings.TrimSuffix(comment, `"`)+" "+why+`"`, proto, p.ProxyPort, target)
				r.count++
			}
			switch {
			case p.Reject:
				refuse("has no endpoints", rejectTarget(p.Protocol()))
			case p.NoLocal && p.Kind == ClusterIP:
				refuse("has no local endpoints", "DROP")
			case p.NoLocal:
				accept("", "-m addrtype --src-type LOCAL ")
				for _, pods := range cfg.ClusterCIDRs {
					if FamilyOf(pods.Addr()) == fam {
						accept(pods.Masked().String(), "")
					}
				}
				refuse("has no local endpoints", "DROP")
			default:
				accept("", "")
				refuse("proxy port: only through its portals", "DROP")
			}
		}
	}
	for _, g := range []struct {
		on      bool
		chain   int // natChains index
		comment string
	}{{guardPortals, 0, loopbackFrontendsComment}, {guardLoopback, 2, loopbackGuardComment}} {
		if !g.on {
			continue
		}
		lo := loopback(fam).String()
		guard := "-A " + natChains[g.chain] + " -d " + lo + " -m comment --comment \"" + g.comment + "\" -j RETURN\n"
		rest := slices.Clone(chains[g.chain].Bytes())
		chains[g.chain].Reset()
		chains[g.chain].WriteString(guard)
		chains[g.chain].Write(rest)
		r.count++
	}
	// Locally generated traffic takes the same REDIRECTs (in OUTPUT they
	// land on the loopback address): each host chain is one jump into its
	// container chain, which halves the rules a sync writes. (The host
	// chains redirect loopback destinations first, which the container
	// chains leave alone.)
	for _, host := range []int{1, 3} { // each host chain follows its container chain in natChains
		if chains[host-1].Len() > 0 {
			chains[host].WriteString("-A " + natChains[host] + " -m comment --comment \"" + hostJumpComment + "\" -j " + natChains[host-1] + "\n")
			r.count++
		}
	}
	var nat bytes.Buffer
	nat.WriteString("*nat\n")
	for _, c := range natChains {
		nat.WriteString(":" + c + " - [0:0]\n")
	}
	for i := range chains {
		nat.Write(chains[i].Bytes())
	}
	nat.WriteString("COMMIT\n")
	r.nat = nat.Bytes()
	r.filter = slices.Concat([]byte("*filter\n:"+ChainNodePortNonLocal+" - [0:0]\n:"+ChainFirewall+" - [0:0]\n"),
		filter.Bytes(), health.Bytes(), firewall.Bytes(), []byte("COMMIT\n"))
	return r
}

// rejectTarget is the target that refuses a new connection of proto. TCP
// gets a reset (iptables-save prints it back as written, in both
// families): the client's connect fails with ECONNREFUSED at once, as it
// does on a host with nothing listening. The default reply, an ICMP port
// unreachable, is rate-limited by the kernel per client address
// (net.ipv4.icmp_ratelimit, one a second, net.ipv6.icmp.ratelimit, ten,
// each after a burst of six) and in all (icmp_msgs_per_sec): a client
// opening connections faster than that had most of its SYNs go without
// a reply and waited out its connect timeout, retransmitting, instead of
// being refused (xa57: at 100 connections/s from one client, 14 were
// refused and 196 timed out at a 5 s timeout). kube-proxy's plain REJECT
// has the same limit. UDP and SCTP keep the ICMP reply, which is what
// refuses them (a connected UDP socket reads ECONNREFUSED); tcp-reset is
// valid only with -p tcp.
func rejectTarget(proto state.Protocol) string {
	if proto == state.TCP {
		return "REJECT --reject-with tcp-reset"
	}
	return "REJECT"
}

// loopbackGuardComment is the comment of a container chain's first rule,
// which leaves loopback destinations alone: a packet to one in PREROUTING
// came from another host (one with route_localnet that routes 127.0.0.0/8
// through this one), and a REDIRECT would rewrite that martian destination
// before routing could drop it (CVE-2020-8558).
const (
	loopbackGuardComment     = "kube-userspace-proxy: loopback node ports are for this host alone"
	loopbackFrontendsComment = "kube-userspace-proxy: loopback frontends are for this host alone"
)

// loopback is the loopback range of fam: 127.0.0.0/8 or ::1/128.
func loopback(fam Family) netip.Prefix {
	if fam == IPv6 {
		return netip.PrefixFrom(netip.IPv6Loopback(), 128)
	}
	return netip.MustParsePrefix("127.0.0.0/8")
}

// loopbackPart returns the loopback destinations a node-port destination
// of the container chain (a CIDR, or "" for every local address) covers,
// as a CIDR ("" if none), and whether it covers nothing else.
func loopbackPart(dst string, fam Family) (lo string, only bool) {
	l := loopback(fam)
	if dst == "" {
		return l.String(), false
	}
	d, err := netip.ParsePrefix(dst)
	if err != nil || !d.Overlaps(l) {
		return "", false
	}
	if d.Bits() >= l.Bits() {
		return d.String(), true
	}
	return l.String(), false
}

// quoteComment quotes a rule comment for iptables-restore. Anything but
// the characters of Kubernetes names and our separators becomes '_', so a
// name can never end the quote and smuggle in a rule.
func quoteComment(s string) string {
	b := []byte(s)
	for i, c := range b {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case c == '-', c == '.', c == '_', c == '/', c == ':':
		default:
			b[i] = '_'
		}
	}
	if len(b) > 250 { // the comment match holds at most 255 bytes
		b = b[:250]
	}
	return `"` + string(b) + `"`
}

// Render returns the iptables-restore input the iptables portal writes for
// portals in family fam, nat table then filter table. It is what Sync
// feeds to iptables-restore --noflush, for golden tests and debugging.
func Render(portals []Portal, fam Family, cfg IPTablesConfig) string {
	r := render(portals, fam, cfg)
	return string(r.nat) + string(r.filter)
}
