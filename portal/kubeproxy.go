package portal

import (
	"slices"
	"strings"
)

// kubeProxyChains are the nat chains of kube-proxy's iptables and ipvs
// modes that PREROUTING and OUTPUT jump to: KUBE-SERVICES, and
// KUBE-NODEPORTS at its end. What a kube-proxy leaves when it is removed
// without "kube-proxy --cleanup" keeps running: its jumps are inserted
// first and ours to the node port chains are appended, so its stale DNATs
// take a node port both serve (and a service address, where its jump
// comes before ours). The portal reports them and leaves them alone.
var kubeProxyChains = []string{"KUBE-SERVICES", "KUBE-NODEPORTS"}

// kubeProxyNFTables are the tables of kube-proxy's nftables mode, as nft
// names them (family and name).
var kubeProxyNFTables = []string{"ip kube-proxy", "ip6 kube-proxy"}

// kubeProxyJumps returns the jumps of the built-in nat chains into
// kube-proxy's chains ("PREROUTING -j KUBE-SERVICES"), sorted, from rules
// by chain (each rule's arguments after "-A CHAIN ").
func kubeProxyJumps(rules map[string][]string) []string {
	var out []string
	for _, from := range []string{"PREROUTING", "OUTPUT"} {
		for _, r := range rules[from] {
			words, err := splitArgs(r)
			if err != nil || len(words) < 2 || words[len(words)-2] != "-j" {
				continue
			}
			if to := words[len(words)-1]; slices.Contains(kubeProxyChains, to) {
				out = append(out, from+" -j "+to)
			}
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// kubeProxyInSave returns kube-proxy's chains that the nat table of
// iptables-save output declares, and the jumps into them (kubeProxyJumps).
// Output it cannot parse holds none.
func kubeProxyInSave(save string) (chains, jumps []string) {
	tables, err := parseSave(save)
	if err != nil || tables[tableNAT] == nil {
		return nil, nil
	}
	nat := tables[tableNAT]
	for _, c := range kubeProxyChains {
		if slices.Contains(nat.chains, c) {
			chains = append(chains, c)
		}
	}
	return chains, kubeProxyJumps(nat.rules)
}

// kubeProxyJumpsListed is kubeProxyJumps of "iptables -S CHAIN" listings
// of the built-in nat chains, by chain.
func kubeProxyJumpsListed(listed map[string][]string) []string {
	rules := make(map[string][]string)
	for from, lines := range listed {
		for _, l := range lines {
			if args, ok := strings.CutPrefix(l, "-A "+from+" "); ok {
				rules[from] = append(rules[from], args)
			}
		}
	}
	return kubeProxyJumps(rules)
}

// The log lines about kube-proxy's rules, kept together so they read
// alike wherever they are found.
const (
	msgKubeProxyIPTables = "kube-proxy's iptables rules are in effect on this host (left by a kube-proxy removed without `kube-proxy --cleanup`, or one still running): " +
		"the built-in nat chains jump to them before this proxy's node port chains, so they take precedence over its node ports " +
		"(and over its service addresses where their jump comes first) and send that traffic to kube-proxy's endpoints, which may be stale. " +
		"This proxy leaves them alone; `kube-proxy --cleanup` on this node removes them"
	msgKubeProxyIPTablesGone = "kube-proxy's iptables rules no longer take traffic: the built-in nat chains do not jump to them any more"
	msgKubeProxyNFTables     = "kube-proxy's nftables tables are on this host (its nftables mode, left by a kube-proxy removed without `kube-proxy --cleanup`, or one still running): " +
		"their nat chains hook in at the same priority as iptables' nat table and may take precedence over this proxy's rules, " +
		"sending Service traffic to kube-proxy's endpoints, which may be stale. This proxy leaves them alone; `kube-proxy --cleanup` on this node removes them"
	msgKubeProxyNFTablesGone = "kube-proxy's nftables tables are gone from this host"
)
