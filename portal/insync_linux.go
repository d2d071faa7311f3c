package portal

import (
	"context"
	"fmt"
	"slices"

	"k8s.io/klog/v2"
)

// InSync reads our chains back, in every family and table, with the
// built-in chains that jump into them, and reports whether the kernel
// holds exactly what Sync(portals) would write: each of our chains with
// the rules render gives, in order, and each jump into them. Then a Sync
// would change nothing, and a periodic resync can skip it, as
// kube-proxy's iptables mode skips an unchanged one, rather than replace
// thousands of rules every period (with nft, a new generation of the
// whole ruleset).
//
// Anything else is false: a rule missing, extra or edited, a chain or
// jump gone, an invalid portal (Sync reports it), a family whose last
// Sync failed, our chains still to remove from the other backend, or
// found there now (otherHolds: an older proxy build, or rules restored by
// hand, may put them there while the proxy runs). The
// error is a failure to read or parse the rules back, also to be taken
// as "write them". It reports kube-proxy's jumps and tables as Sync does,
// when they appear or go.
func (p *IPTables) InSync(ctx context.Context, portals []Portal) (bool, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.leftover) > 0 || p.otherHolds(ctx) {
		return false, nil // Sync removes them
	}
	for _, pt := range portals {
		if pt.validate() != nil {
			return false, nil
		}
	}
	for _, ft := range p.fams {
		if ft.wrote == nil || !ft.jumped {
			return false, nil // not (all) written by a Sync that worked
		}
		r := render(portals, ft.fam, p.cfg)
		// One iptables-save of every table, not one per table: it takes
		// a single -t (the last one given), and with nft each run reads
		// the whole ruleset whatever it prints (140-170 ms for nat
		// alone, for filter alone, or for every table, with 4,000 rules
		// in each of ours). Both backends print each table as "-t" alone
		// does; legacy prints only the tables in use, and ours are.
		save, err := p.run(ctx, nil, ft.save)
		if err != nil {
			return false, fmt.Errorf("portal: iptables: read the rules (%s): %w", ft.fam, err)
		}
		got, err := parseSave(string(save))
		if err != nil {
			return false, fmt.Errorf("portal: iptables: parse %s: %w", ft.save, err)
		}
		for _, tbl := range []struct {
			name string
			data []byte
		}{{tableNAT, r.nat}, {tableFilter, r.filter}} {
			want, err := parseSave(string(tbl.data))
			if err != nil {
				return false, fmt.Errorf("portal: iptables: parse the %s rules (%s): %w", tbl.name, ft.fam, err)
			}
			if d := tableDiff(tbl.name, got[tbl.name], want[tbl.name], ft.fam); d != "" {
				klog.V(2).InfoS("The portal's rules are not as this proxy writes them; writing them again", "command", ft.save, "family", ft.fam, "table", tbl.name, "difference", d)
				return false, nil
			}
		}
		noteKubeProxy(ft, kubeProxyJumps(got[tableNAT].rules))
	}
	p.noteKubeProxyNFT()
	return true, nil
}

// tableDiff compares one table of iptables-save output (got, nil when the
// save had none) with what render writes there (want), in family fam: our
// chains of the table, rule by rule (chainDiff), and the jumps into them
// from the built-in chains, which must be there as ensureJumps looks for
// them (where they are is left as it is: Sync leaves it too). It returns
// "" when they are the same, else what differs first, for the log.
func tableDiff(table string, got, want *savedTable, fam Family) string {
	if got == nil {
		return "no " + table + " table"
	}
	for _, c := range ownedChains[table] {
		if !slices.Contains(got.chains, c) {
			return "chain " + c + " missing"
		}
		if d := chainDiff(got.rules[c], want.rules[c], fam); d != "" {
			return c + " " + d
		}
	}
	for _, j := range jumps {
		if j.table != table {
			continue
		}
		lines := make([]string, 0, len(got.rules[j.from]))
		for _, args := range got.rules[j.from] {
			lines = append(lines, "-A "+j.from+" "+args)
		}
		if !hasRule(lines, j.from, j.spec()) {
			return "jump " + j.from + " -j " + j.to + " missing"
		}
	}
	return ""
}

// otherHolds looks for our chains in the other backend, as NewIPTables
// does at start, and reports whether it found some, which are then
// leftovers for Sync to remove. Both backends' rules run in the kernel:
// a chain of ours there that a built-in chain jumps to redirects (or
// drops) traffic whatever this proxy writes, to proxy ports it may not
// serve, while the resync would say its portals are in place. It reads
// a family only where peek says our chains may be (no program runs on a
// host whose other backend is unused), and says at -v=4 why it could not.
func (p *IPTables) otherHolds(ctx context.Context) bool {
	if p.peek == nil {
		return false
	}
	found := false
	for _, ot := range p.others {
		if slices.Contains(p.leftover, ot) {
			continue
		}
		may, err := p.peek(ot)
		if err != nil {
			klog.V(4).InfoS("Cannot tell whether the other iptables backend holds the portal's chains", "command", ot.bin, "err", err)
			continue
		}
		if !may {
			continue
		}
		save, err := p.run(ctx, nil, ot.save)
		if err != nil {
			klog.V(4).InfoS("Cannot read the rules of the other iptables backend", "command", ot.save, "err", err)
			continue
		}
		if !ownsAnything(string(save)) {
			continue
		}
		klog.ErrorS(nil, "Found the portal's chains in the other iptables backend since the proxy started (an older proxy build, or rules restored by hand?): the kernel runs them beside this proxy's rules, and they may redirect traffic to ports it does not serve; this sync removes them", "command", ot.bin, "family", ot.fam)
		p.leftover = append(p.leftover, ot)
		found = true
	}
	return found
}
