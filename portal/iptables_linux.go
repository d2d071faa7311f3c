package portal

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/coreos/go-iptables/iptables"
	"github.com/hashicorp/go-multierror"
	"k8s.io/klog/v2"
)

// iptablesCmd is the part of go-iptables the portal calls, so tests can
// fake it.
type iptablesCmd interface {
	Exists(table, chain string, rulespec ...string) (bool, error)
	List(table, chain string) ([]string, error)
	Insert(table, chain string, pos int, rulespec ...string) error
	Append(table, chain string, rulespec ...string) error
	DeleteIfExists(table, chain string, rulespec ...string) error
	ChainExists(table, chain string) (bool, error)
	ClearAndDeleteChain(table, chain string) error
}

// runFunc runs a program with stdin and returns its stdout; the error
// carries its stderr.
type runFunc func(ctx context.Context, stdin []byte, name string, args ...string) ([]byte, error)

// famTables drives one IP family of one backend.
type famTables struct {
	fam     Family
	backend Backend
	ipt     iptablesCmd
	bin     string // iptables binary
	restore string // iptables-restore binary
	save    string // iptables-save binary
	failed  string // the last failure to remove leftovers, logged once
	// readErr is why this family of the other backend could not be read
	// when the portal was made (see IPTables.unreadable).
	readErr error
	// jumped says the jumps into our chains were all in place after a
	// Sync: one that finds some missing again reports it.
	jumped bool
	// kubeProxy are kube-proxy's jumps the built-in nat chains held at
	// the last look (see kubeProxyJumps), reported when they appear.
	kubeProxy []string
	// wrote is what the last successful Sync wrote to our nat chains
	// (nil before one, or after a failure), read back only when Drift
	// compares it with the kernel's: a sync need not parse its own rules.
	wrote []byte
}

// IPTables is the iptables portal: nat REDIRECT rules to the proxy ports in
// the legacy userspace chains, for IPv4 through iptables and IPv6 through
// ip6tables, in the backend (nft or legacy) the host uses.
type IPTables struct {
	cfg      IPTablesConfig
	backend  Backend
	run      runFunc
	lookPath func(string) (string, error)

	mu       sync.Mutex   // serializes Sync and Cleanup; guards the fields below
	fams     []*famTables // the chosen backend, one per family
	leftover []*famTables // the other backend, where our chains are still to remove
	// others are the other backend's families that could be read at
	// start, where its tools are installed: a resync looks there for our
	// chains appearing later (otherHolds), when peek says they may.
	others []*famTables
	// peek tells, without running a program, whether a family of the
	// other backend may hold our chains (mayHoldOurs); nil looks for none.
	peek func(*famTables) (bool, error)
	// unreadable are the families of the other backend whose rules could
	// not be read (iptables-legacy without CAP_NET_RAW): whether our
	// chains are there is unknown, so Cleanup cannot call them removed.
	unreadable []*famTables
	// nftTables lists the nftables tables, to find kube-proxy's; nil
	// looks for none.
	nftTables    func() ([]string, error)
	nftKubeProxy []string // kube-proxy's nftables tables at the last look
	removed      []Portal // what removed rules held, until Removed hands it on
	// movedFrom and movedTo are the node ports whose rules' destinations
	// changed, as the rules were and are now, until MovedNodePorts hands
	// them on.
	movedFrom, movedTo []Portal
}

var _ Interface = (*IPTables)(nil)

// NewIPTables detects the iptables backend and returns the portal. It
// changes nothing in the kernel: the first Sync reconciles whatever an
// earlier run left, so a restart keeps serving until then, and removes our
// chains from the other backend where an earlier run left them.
func NewIPTables(ctx context.Context, cfg IPTablesConfig) (*IPTables, error) {
	if cfg.LockWaitSeconds <= 0 {
		cfg.LockWaitSeconds = 5
	}
	explicit := cfg.Families != nil
	if !explicit {
		cfg.Families = []Family{IPv4}
		if _, err := os.Stat("/proc/net/if_inet6"); err == nil {
			cfg.Families = append(cfg.Families, IPv6)
		} else {
			klog.InfoS("IPv6 is not available; programming IPv4 portals only")
		}
	}
	p := &IPTables{cfg: cfg, run: execRun, lookPath: exec.LookPath, nftTables: nftTables, peek: mayHoldOurs}
	d := p.detect(ctx)
	backend := d.backend
	p.backend = backend
	other := otherBackend(backend)
	var errs []error // one line each, without multierror's header
	var families []Family
	var noIPv6 error // said only once IPv4 is known to work
	for _, fam := range cfg.Families {
		rerr := d.unreadable[other][fam]
		var ot *famTables // the other backend's, where its tools are installed
		if bin, _, _ := p.binaries(other, fam); strings.HasSuffix(bin, "-"+string(other)) && (d.leftovers[fam] || rerr != nil || !cfg.ForCleanup) {
			ot, _ = p.newFamTables(other, fam)
		}
		switch {
		case ot == nil:
		case d.leftovers[fam]:
			// Even where this family of the chosen backend is unusable:
			// the kernel still runs the other's rules.
			p.leftover = append(p.leftover, ot)
		case rerr != nil:
			ot.readErr = rerr
			p.unreadable = append(p.unreadable, ot)
		}
		if ot != nil && rerr == nil && !cfg.ForCleanup {
			p.others = append(p.others, ot)
		}
		ft, err := p.newFamTables(backend, fam)
		if err == nil {
			// Usable means we may read the nat table: no netfilter, no
			// nat support or no privilege all fail here, not at Sync.
			if _, lerr := ft.ipt.List(tableNAT, "PREROUTING"); lerr != nil {
				err = fmt.Errorf("%s cannot read the nat table: %w", ft.bin, lerr)
			}
		}
		if err != nil {
			if fam == IPv6 && !explicit && len(cfg.Families) > 1 {
				noIPv6 = err
				continue
			}
			errs = append(errs, err)
			continue
		}
		p.fams = append(p.fams, ft)
		families = append(families, fam)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("portal: iptables: %w", err)
	}
	if noIPv6 != nil && !cfg.ForCleanup {
		klog.InfoS("ip6tables is not usable; programming IPv4 portals only", "err", noIPv6)
	}
	p.cfg.Families = families
	if cfg.ForCleanup {
		// Cleanup says it, as its error.
		for _, ut := range p.unreadable {
			klog.V(2).InfoS("Cannot read the rules of the other iptables backend", "command", ut.save, "err", ut.readErr)
		}
		return p, nil
	}
	klog.InfoS("Using iptables portal", "backend", backend, "reason", d.reason, "families", families)
	for _, ot := range p.leftover {
		klog.InfoS("Found the portal's chains in the other iptables backend, where the kernel still runs them; the first sync removes them", "command", ot.bin)
	}
	for _, ut := range p.unreadable {
		// Worth saying where the portal could work at all.
		v := klog.Level(2)
		if CheckNetAdmin() == nil {
			v = 0
		}
		klog.V(v).ErrorS(ut.readErr, "Cannot read the rules of the other iptables backend, so the backend was chosen without them, and whatever rules are there stay in effect unseen (the kernel runs both backends' rules): the portal's chains an earlier run left there, or kube-proxy's, may still redirect traffic; this proxy cannot remove them, nor can --cleanup run with the same privileges"+readHint(ut.backend, ut.readErr), "command", ut.save, "family", ut.fam)
	}
	p.reportKubeProxy(d.saves)
	return p, nil
}

// readHint adds why a backend's rules may be unreadable, for the log.
func readHint(b Backend, err error) string {
	if b == BackendLegacy && strings.Contains(err.Error(), "Permission denied") {
		return " (iptables-legacy needs CAP_NET_RAW as well as CAP_NET_ADMIN)"
	}
	return ""
}

func otherBackend(b Backend) Backend {
	if b == BackendNFT {
		return BackendLegacy
	}
	return BackendNFT
}

// Backend reports the backend in use.
func (p *IPTables) Backend() Backend { return p.backend }

// binaries returns the program names of a backend and family: the
// backend-specific ones when installed, else the plain names.
func (p *IPTables) binaries(b Backend, fam Family) (ipt, restore, save string) {
	base := "iptables"
	if fam == IPv6 {
		base = "ip6tables"
	}
	suffix := "-" + string(b)
	if _, err := p.lookPath(base + suffix); err != nil {
		return base, base + "-restore", base + "-save"
	}
	return base + suffix, base + suffix + "-restore", base + suffix + "-save"
}

func (p *IPTables) newFamTables(b Backend, fam Family) (*famTables, error) {
	bin, restore, save := p.binaries(b, fam)
	proto := iptables.ProtocolIPv4
	if fam == IPv6 {
		proto = iptables.ProtocolIPv6
	}
	ipt, err := iptables.New(iptables.IPFamily(proto), iptables.Path(bin), iptables.Timeout(5))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", bin, err)
	}
	return &famTables{fam: fam, backend: b, ipt: ipt, bin: bin, restore: restore, save: save}, nil
}

// detection is what detect found.
type detection struct {
	backend   Backend
	reason    string                        // why, for the log
	leftovers map[Family]bool               // families whose other backend holds our chains
	saves     map[Backend]map[Family]string // the rules each backend showed
	// unreadable are the saves that failed, by backend: their rules are
	// unknown, not absent.
	unreadable map[Backend]map[Family]error
}

// detect picks the backend holding the host's rules, the way
// kubernetes-sigs/iptables-wrappers does: count the rules each one shows.
// It also reports the families whose other backend holds our chains, and
// those of a backend whose rules it could not read (counted as empty for
// the choice, which may then miss the host's rules).
func (p *IPTables) detect(ctx context.Context) detection {
	saves := map[Backend]map[Family]string{BackendLegacy: {}, BackendNFT: {}}
	unreadable := map[Backend]map[Family]error{BackendLegacy: {}, BackendNFT: {}}
	for b := range saves {
		for _, fam := range p.cfg.Families {
			_, _, save := p.binaries(b, fam)
			if !strings.HasSuffix(save, "-"+string(b)+"-save") {
				continue // this backend's tools are not installed
			}
			out, err := p.run(ctx, nil, save)
			if err != nil {
				unreadable[b][fam] = err
				continue
			}
			saves[b][fam] = string(out)
		}
	}
	join := func(m map[Family]string) string { return m[IPv4] + m[IPv6] }
	backend, reason := p.cfg.Backend, "set by configuration"
	if backend == "" {
		backend, reason = chooseBackend(join(saves[BackendLegacy]), join(saves[BackendNFT]))
		if _, _, save := p.binaries(backend, IPv4); !strings.HasSuffix(save, "-"+string(backend)+"-save") {
			backend, reason = plainBackend(ctx, p.run), "the only iptables installed"
		}
	}
	other := otherBackend(backend)
	if len(unreadable[other]) > 0 {
		reason += fmt.Sprintf("; the %s backend could not be read", other)
	}
	leftovers := make(map[Family]bool)
	for fam, save := range saves[other] {
		leftovers[fam] = ownsAnything(save)
	}
	return detection{backend: backend, reason: reason, leftovers: leftovers, saves: saves, unreadable: unreadable}
}

// plainBackend reads the backend of the plain iptables binary from its
// version ("iptables v1.8.9 (nf_tables)").
func plainBackend(ctx context.Context, run runFunc) Backend {
	out, err := run(ctx, nil, "iptables", "--version")
	if err == nil && strings.Contains(string(out), "legacy") {
		return BackendLegacy
	}
	if err == nil && !strings.Contains(string(out), "nf_tables") {
		return BackendLegacy // iptables before 1.8 knows only legacy
	}
	return BackendNFT
}

func execRun(ctx context.Context, stdin []byte, name string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.Bytes(), fmt.Errorf("%s: %w: %s", name, err, strings.TrimSpace(stderr.String()))
	}
	return stdout.Bytes(), nil
}

// Sync writes our chains so they hold exactly the rules of portals: one
// iptables-restore --noflush per table and family, which replaces our
// chains atomically and touches nothing else, then makes sure the jumps
// into them are in place. Invalid portals are reported and left out. Our
// chains in the other backend, where an earlier run left them, go too
// (see removeLeftovers).
func (p *IPTables) Sync(ctx context.Context, portals []Portal) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	var errs *multierror.Error
	valid := portals[:0:0]
	for _, pt := range portals {
		if err := pt.validate(); err != nil {
			errs = multierror.Append(errs, fmt.Errorf("portal: iptables: %s %s: %w", pt.Service, pt.Kind, err))
			continue
		}
		valid = append(valid, pt)
	}
	for _, ft := range p.fams {
		start := time.Now()
		r := render(valid, ft.fam, p.cfg)
		prev := ft.wrote
		if prev == nil {
			// The first sync (or the first after a failure): the rules
			// are as an earlier run (or a failed restore) left them.
			// Unreadable, they tell nothing to compare.
			prev, _ = p.run(ctx, nil, ft.save, "-t", tableNAT)
		}
		failed := false
		for _, tbl := range []struct {
			name string
			data []byte
		}{{tableNAT, r.nat}, {tableFilter, r.filter}} {
			if err := p.restore(ctx, ft, tbl.data); err != nil {
				errs = multierror.Append(errs, fmt.Errorf("portal: iptables: restore %s table (%s): %w", tbl.name, ft.fam, err))
				failed = true
			}
		}
		added, listed, err := ensureJumps(ft.ipt)
		if err != nil {
			errs = multierror.Append(errs, fmt.Errorf("portal: iptables: jumps (%s): %w", ft.fam, err))
			failed = true
		}
		switch {
		case len(added) == 0:
		case ft.jumped || len(added) < len(jumps):
			// They were in place (ours, or an earlier run's): something
			// took them out, and until now what they lead to took no
			// traffic. Our chains rewritten are the caller's to report
			// (Drift); the jumps are in chains that are not ours.
			klog.ErrorS(nil, "Jumps into the portal's chains were missing from the built-in chains (a firewall reload that flushed them?): until now the traffic they lead to the portal's chains was not redirected (or filtered); added them again", "command", ft.bin, "family", ft.fam, "restored", added)
		default:
			klog.V(2).InfoS("Added the jumps into the portal's chains", "command", ft.bin, "family", ft.fam, "jumps", added)
		}
		ft.jumped = ft.jumped || err == nil
		_, pre := listed["PREROUTING"]
		if _, out := listed["OUTPUT"]; pre && out {
			noteKubeProxy(ft, kubeProxyJumpsListed(listed))
		}
		if !failed { // a failure is the caller's to report
			klog.V(2).InfoS("Synced iptables portals", "family", ft.fam, "rules", r.count, "took", time.Since(start))
			from, to := movedNodePorts(prev, r.nat, ft.fam)
			p.movedFrom, p.movedTo = append(p.movedFrom, from...), append(p.movedTo, to...)
			ft.wrote = r.nat
		} else {
			ft.wrote = nil
		}
	}
	p.removeLeftovers(ctx)
	p.noteKubeProxyNFT()
	return errs.ErrorOrNil()
}

// removeLeftovers removes our jumps and chains from the other backend,
// where NewIPTables found them (an earlier run chose that backend, and
// another tool's rules have since tipped the choice). Both backends'
// rules run in the kernel, so theirs would keep redirecting frontends
// that are gone to proxy ports nobody serves, and keep dropping or
// accepting for old proxy ports. The chain names are ours alone (an old
// kube-proxy in userspace mode used them too; it is long gone). A failure
// is logged, not returned: our rules in the chosen backend are in place,
// and a sync error would make the proxy unhealthy. It is tried again at
// the next Sync.
func (p *IPTables) removeLeftovers(ctx context.Context) {
	kept := p.leftover[:0]
	for _, ot := range p.leftover {
		held := p.held(ctx, ot)
		jumps, chains, err := cleanupFamily(ot.ipt)
		if jumps+chains > 0 {
			klog.InfoS("Removed the portal's chains from the other iptables backend", "command", ot.bin, "jumps", jumps, "chains", chains)
		}
		if err == nil {
			// Gone for good: the UDP entries their rules made are stale
			// (while they stay, they would make them again).
			p.removed = append(p.removed, held...)
			continue
		}
		kept = append(kept, ot)
		v := klog.Level(0)
		if msg := err.Error(); msg == ot.failed {
			v = 2 // said already
		} else {
			ot.failed = msg
		}
		klog.V(v).ErrorS(err, "Could not remove the portal's chains from the other iptables backend, where the kernel still runs them and they may catch removed frontends; retrying at the next sync (--cleanup removes them too)", "command", ot.bin)
	}
	clear(p.leftover[len(kept):])
	p.leftover = kept
}

func (p *IPTables) restore(ctx context.Context, ft *famTables, data []byte) error {
	_, err := p.run(ctx, data, ft.restore, "--noflush", "--wait="+strconv.Itoa(p.cfg.LockWaitSeconds))
	return err
}

// ensureJumps adds each missing jump into our chains, and returns those it
// added ("nat PREROUTING -j KUBE-PORTALS-CONTAINER") and the listings of
// the built-in nat chains it read, by chain ("PREROUTING"). A jump that is
// already there stays where it is. It lists each built-in chain once
// ("-S", a few ms even next to thousands of rules in nft) rather than
// checking each jump with "-C", which makes iptables-nft load the whole
// table (60 ms each at 17,000 rules); "-C" is the fallback when the listing
// prints a jump in a form we do not recognise, so it is never duplicated.
func ensureJumps(ipt iptablesCmd) (added []string, nat map[string][]string, errs error) {
	listed := make(map[string][]string)
	for _, j := range jumps {
		key := j.table + "/" + j.from
		rules, ok := listed[key]
		if !ok {
			var err error
			if rules, err = ipt.List(j.table, j.from); err != nil {
				errs = errors.Join(errs, fmt.Errorf("list %s: %w", j.from, err))
				continue
			}
			listed[key] = rules
		}
		if hasRule(rules, j.from, j.spec()) {
			continue
		}
		if ok, err := ipt.Exists(j.table, j.from, j.spec()...); err != nil {
			errs = errors.Join(errs, fmt.Errorf("check %s -> %s: %w", j.from, j.to, err))
			continue
		} else if ok {
			continue
		}
		var err error
		if j.prepend {
			err = ipt.Insert(j.table, j.from, 1, j.spec()...)
		} else {
			err = ipt.Append(j.table, j.from, j.spec()...)
		}
		if err != nil {
			errs = errors.Join(errs, fmt.Errorf("add %s -> %s: %w", j.from, j.to, err))
		} else {
			added = append(added, j.table+" "+j.from+" -j "+j.to)
		}
	}
	nat = make(map[string][]string)
	for key, rules := range listed {
		if from, ok := strings.CutPrefix(key, tableNAT+"/"); ok {
			nat[from] = rules
		}
	}
	return added, nat, errs
}

// hasRule reports whether "iptables -S chain" output holds the rule spec.
func hasRule(lines []string, chain string, spec []string) bool {
	for _, l := range lines {
		args, ok := strings.CutPrefix(l, "-A "+chain+" ")
		if !ok {
			continue
		}
		if words, err := splitArgs(args); err == nil && slices.Equal(words, spec) {
			return true
		}
	}
	return false
}

// Cleanup removes every jump and chain we own, in both families, and in
// the other backend where NewIPTables found our chains there too.
func (p *IPTables) Cleanup(ctx context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	var errs *multierror.Error
	all := append(p.fams[:len(p.fams):len(p.fams)], p.leftover...)
	for _, ut := range p.unreadable {
		// Unread is not empty: "done" would be a false all-clear while
		// the kernel still runs whatever of ours is there.
		out, err := p.run(ctx, nil, ut.save)
		if err != nil {
			errs = multierror.Append(errs, fmt.Errorf("portal: iptables: cleanup (%s): cannot read the %s backend's rules, so the portal's rules there, if any, stay in effect%s: %w", ut.bin, ut.backend, readHint(ut.backend, err), err))
			continue
		}
		if ownsAnything(string(out)) {
			all = append(all, ut)
		}
	}
	for _, ft := range all {
		if err := ctx.Err(); err != nil {
			return err
		}
		p.removed = append(p.removed, p.held(ctx, ft)...)
		jumps, chains, err := cleanupFamily(ft.ipt)
		if err != nil {
			errs = multierror.Append(errs, fmt.Errorf("portal: iptables: cleanup (%s): %w", ft.bin, err))
		}
		if jumps+chains > 0 {
			klog.InfoS("Removed the iptables portal's rules", "command", ft.bin, "jumps", jumps, "chains", chains)
		}
	}
	return errs.ErrorOrNil()
}

// cleanupFamily deletes every rule of the built-in chains that jumps into
// one of ours, whatever its comment (an old kube-proxy in userspace mode
// used the same chain names), then our chains. It returns how many of
// each it deleted.
func cleanupFamily(ipt iptablesCmd) (jumpsDeleted, chainsDeleted int, errs error) {
	done := make(map[string]bool)
	for _, j := range jumps {
		key := j.table + "/" + j.from
		if done[key] {
			continue
		}
		done[key] = true
		lines, err := ipt.List(j.table, j.from)
		if err != nil {
			if !isNotExist(err) {
				errs = errors.Join(errs, fmt.Errorf("list %s: %w", j.from, err))
			}
			continue
		}
		for _, l := range lines {
			args, ok := strings.CutPrefix(l, "-A "+j.from+" ")
			if !ok {
				continue
			}
			words, err := splitArgs(args)
			if err != nil || len(words) < 2 || words[len(words)-2] != "-j" || !slices.Contains(ownedChains[j.table], words[len(words)-1]) {
				continue
			}
			if err := ipt.DeleteIfExists(j.table, j.from, words...); err != nil {
				errs = errors.Join(errs, fmt.Errorf("delete %s -> %s: %w", j.from, words[len(words)-1], err))
			} else {
				jumpsDeleted++
			}
		}
	}
	for _, table := range []string{tableNAT, tableFilter} {
		// Backward: the host chains jump into the container chains, and a
		// chain cannot go while a rule refers to it.
		for _, c := range slices.Backward(ownedChains[table]) {
			ok, err := ipt.ChainExists(table, c)
			if err != nil {
				errs = errors.Join(errs, fmt.Errorf("check chain %s: %w", c, err))
				continue
			}
			if !ok {
				continue
			}
			if err := ipt.ClearAndDeleteChain(table, c); err != nil {
				errs = errors.Join(errs, fmt.Errorf("delete chain %s: %w", c, err))
			} else {
				chainsDeleted++
			}
		}
	}
	return jumpsDeleted, chainsDeleted, errs
}

func isNotExist(err error) bool {
	var e *iptables.Error
	return errors.As(err, &e) && e.IsNotExist()
}

// Removed returns the portals whose rules Cleanup, or a Sync removing our
// chains from the other backend, took away since the last call, as they
// read just before, and forgets them. The UDP conntrack entries those
// rules made still carry their NAT, to proxy ports that may be closed or
// reused, and a client that keeps its source port refreshes its entry
// with every datagram: the caller deletes them (conntrack.RemovedUDP).
func (p *IPTables) Removed() []Portal {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := p.removed
	p.removed = nil
	return out
}

// MovedNodePorts returns, and forgets, the node ports whose rules' set of
// destinations (--nodeport-addresses, --iptables-localhost-nodeports,
// and the loopback guards) changed in the syncs since the last call, as
// their rules were (from) and are (to); a restart with other flags is such
// a change, against the rules the earlier run left. Each UDP client
// keeps the mapping its entry holds: one narrowed out stays served
// through the old REDIRECT, one widened in stays on its unredirected
// entry. The caller deletes both (conntrack.StaleUDP(from, nil) and
// StaleUDP(nil, to)).
func (p *IPTables) MovedNodePorts() (from, to []Portal) {
	p.mu.Lock()
	defer p.mu.Unlock()
	from, to = p.movedFrom, p.movedTo
	p.movedFrom, p.movedTo = nil, nil
	return from, to
}

// held returns the portals the nat chains of ft hold, for Removed; none
// when they cannot be read (said at -v=2: the removal goes on).
func (p *IPTables) held(ctx context.Context, ft *famTables) []Portal {
	save, err := p.run(ctx, nil, ft.save, "-t", tableNAT)
	if err == nil {
		var tables map[string]*savedTable
		if tables, err = parseSave(string(save)); err == nil {
			got, _ := portalsInSave(tables, ft.fam)
			return got
		}
	}
	klog.V(2).InfoS("Cannot read the portal's rules before removing them; their UDP conntrack entries stay until they time out", "command", ft.save, "err", err)
	return nil
}

// Existing returns the portals our chains hold now, as an earlier run left
// them: the proxy ports a restarted proxy may keep, and the old mappings
// whose conntrack entries a change makes stale. Address portals come back
// as ClusterIP; rules that are not ours are skipped.
func (p *IPTables) Existing(ctx context.Context) ([]Portal, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	ps, err := p.existing(ctx)
	return withoutDsts(ps), err
}

// withoutDsts returns ps with one portal per node port, whatever its rules'
// destinations (NodePortDst), sorted.
func withoutDsts(ps []Portal) []Portal {
	out := slices.Clone(ps)
	for i := range out {
		out[i].NodePortDst = netip.Prefix{}
	}
	return sortedPortals(out)
}

// ExistingTargets is Existing with, for each family that has rules, where
// they send traffic: each address they DNAT to, and the zero Addr where
// they REDIRECT. After a restart, a family whose rules sent traffic
// anywhere but where the new rules send it left UDP conntrack entries on
// the old mapping (conntrack.RetargetedUDP), whose address may no longer
// be this host's.
func (p *IPTables) ExistingTargets(ctx context.Context) ([]Portal, map[Family][]netip.Addr, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	ps, to, err := p.existingTargets(ctx)
	return withoutDsts(ps), parseTargets(to), err
}

// Drift reads our nat chains back and reports whether they still redirect
// what the last Sync wrote in every family it wrote; if not, something else
// rewrote them (another kube-userspace-proxy on this host, say), and held
// is what they redirect now, as Existing reads it.
func (p *IPTables) Drift(ctx context.Context) (held []Portal, drifted bool, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var wrote []Portal
	var wroteTo []string
	for _, ft := range p.fams {
		if ft.wrote == nil {
			return nil, false, nil // nothing to compare with
		}
		tables, err := parseSave(string(ft.wrote))
		if err != nil {
			return nil, false, err
		}
		got, _ := portalsInSave(tables, ft.fam)
		wrote = append(wrote, got...) // none is something to compare with too
		wroteTo = append(wroteTo, targetsInSave(tables, ft.fam)...)
	}
	held, heldTo, err := p.existingTargets(ctx)
	if err != nil {
		return nil, false, err
	}
	return held, !slices.EqualFunc(sortedPortals(held), sortedPortals(wrote), Portal.Equal) || !slices.Equal(heldTo, wroteTo), nil
}

// sortedPortals returns ps sorted, without duplicates (a node port has a
// rule per --nodeport-addresses prefix).
func sortedPortals(ps []Portal) []Portal {
	out := slices.Clone(ps)
	slices.SortFunc(out, Portal.Compare)
	return slices.CompactFunc(out, Portal.Equal)
}

func (p *IPTables) existing(ctx context.Context) ([]Portal, error) {
	out, _, err := p.existingTargets(ctx)
	return out, err
}

// existingTargets is existing, with where our rules send traffic (see
// targetsInSave), family by family.
func (p *IPTables) existingTargets(ctx context.Context) ([]Portal, []string, error) {
	var out []Portal
	var targets []string
	var errs *multierror.Error
	for _, ft := range p.fams {
		save, err := p.run(ctx, nil, ft.save, "-t", tableNAT)
		if err != nil {
			errs = multierror.Append(errs, fmt.Errorf("portal: iptables: read rules (%s): %w", ft.fam, err))
			continue
		}
		tables, err := parseSave(string(save))
		if err != nil {
			errs = multierror.Append(errs, fmt.Errorf("portal: iptables: parse %s: %w", ft.save, err))
			continue
		}
		got, bad := portalsInSave(tables, ft.fam)
		if bad > 0 {
			klog.InfoS("Skipped unreadable rules in portal chains", "family", ft.fam, "count", bad)
		}
		out = append(out, got...)
		targets = append(targets, targetsInSave(tables, ft.fam)...)
	}
	return out, targets, errs.ErrorOrNil()
}
