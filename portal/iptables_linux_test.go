package portal

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"testing"

	"k8s.io/klog/v2"
)

// fakeIPT is an in-memory iptables for one family: chains with rules kept
// as joined arguments.
type fakeIPT struct {
	mu     sync.Mutex
	fam    Family              // how save prints a REJECT; zero is IPv4
	chains map[string][]string // "table/chain" -> rules
	calls  []string
}

func newFakeIPT() *fakeIPT {
	f := &fakeIPT{chains: make(map[string][]string)}
	for _, c := range []string{"nat/PREROUTING", "nat/OUTPUT", "filter/INPUT", "filter/FORWARD", "filter/OUTPUT"} {
		f.chains[c] = nil
	}
	return f
}

func (f *fakeIPT) record(format string, args ...any) {
	f.calls = append(f.calls, fmt.Sprintf(format, args...))
}

func (f *fakeIPT) Exists(table, chain string, spec ...string) (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	rules, ok := f.chains[table+"/"+chain]
	if !ok {
		return false, fmt.Errorf("no chain %s", chain)
	}
	return slices.Contains(rules, quoteSpec(spec)), nil
}

func (f *fakeIPT) List(table, chain string) ([]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.record("list %s %s", table, chain)
	rules, ok := f.chains[table+"/"+chain]
	if !ok {
		return nil, fmt.Errorf("no chain %s", chain)
	}
	out := []string{"-P " + chain + " ACCEPT"}
	for _, r := range rules {
		out = append(out, "-A "+chain+" "+r)
	}
	return out, nil
}

// quoteSpec joins a rule as iptables -S prints it.
func quoteSpec(spec []string) string {
	var b []string
	for _, s := range spec {
		if strings.ContainsAny(s, " ;") {
			s = `"` + s + `"`
		}
		b = append(b, s)
	}
	return strings.Join(b, " ")
}

func (f *fakeIPT) Insert(table, chain string, pos int, spec ...string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.record("insert %s %s %d %s", table, chain, pos, spec[len(spec)-1])
	k := table + "/" + chain
	f.chains[k] = slices.Insert(f.chains[k], pos-1, quoteSpec(spec))
	return nil
}

func (f *fakeIPT) Append(table, chain string, spec ...string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.record("append %s %s %s", table, chain, spec[len(spec)-1])
	k := table + "/" + chain
	f.chains[k] = append(f.chains[k], quoteSpec(spec))
	return nil
}

func (f *fakeIPT) DeleteIfExists(table, chain string, spec ...string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.record("delete %s %s %s", table, chain, spec[len(spec)-1])
	k := table + "/" + chain
	if i := slices.Index(f.chains[k], quoteSpec(spec)); i >= 0 {
		f.chains[k] = slices.Delete(f.chains[k], i, i+1)
	}
	return nil
}

func (f *fakeIPT) ChainExists(table, chain string) (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	_, ok := f.chains[table+"/"+chain]
	return ok, nil
}

func (f *fakeIPT) ClearAndDeleteChain(table, chain string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.record("delete-chain %s %s", table, chain)
	delete(f.chains, table+"/"+chain)
	return nil
}

// restoreLog records iptables-restore input and writes the declared
// chains, with their rules, into the family's fakeIPT, as the real one
// does; iptables-save ("-t table", or every table) reads them back.
type restoreLog struct {
	mu     sync.Mutex
	inputs map[string][]string // binary -> inputs
	fail   map[string]bool     // binary -> fail
	byBin  map[string]*fakeIPT // restore binary -> its rules
	saves  int                 // iptables-save runs
}

func (r *restoreLog) run(_ context.Context, stdin []byte, name string, args ...string) ([]byte, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.fail[name] {
		return nil, errors.New("exit status 1: iptables-restore: line 7 failed")
	}
	if restore, ok := strings.CutSuffix(name, "-save"); ok && r.byBin[restore+"-restore"] != nil {
		r.saves++
		ipt := r.byBin[restore+"-restore"]
		if len(args) == 0 { // every table
			return []byte(ipt.save(tableFilter) + ipt.save(tableNAT)), nil
		}
		if len(args) != 2 || args[0] != "-t" {
			return nil, fmt.Errorf("save with %v", args)
		}
		return []byte(ipt.save(args[1])), nil
	}
	if !slices.Contains(args, "--noflush") {
		return nil, fmt.Errorf("restore without --noflush: %v", args)
	}
	r.inputs[name] = append(r.inputs[name], string(stdin))
	if ipt := r.byBin[name]; ipt != nil {
		tables, err := parseSave(string(stdin))
		if err != nil {
			return nil, err
		}
		ipt.mu.Lock()
		defer ipt.mu.Unlock()
		for tn, tbl := range tables {
			for _, c := range tbl.chains {
				ipt.chains[tn+"/"+c] = slices.Clone(tbl.rules[c])
			}
		}
	}
	return nil, nil
}

// restores counts the iptables-restore runs.
func (r *restoreLog) restores() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, in := range r.inputs {
		n += len(in)
	}
	return n
}

// save prints table as iptables-save does: built-in chains first, then
// the others, each chain's rules in order, and a REJECT with the default
// reply it was given.
func (f *fakeIPT) save(table string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var chains []string
	for k := range f.chains {
		if c, ok := strings.CutPrefix(k, table+"/"); ok {
			chains = append(chains, c)
		}
	}
	builtin := func(c string) bool { return strings.ToUpper(c) == c && !strings.Contains(c, "-") }
	slices.SortFunc(chains, func(a, b string) int {
		if builtin(a) != builtin(b) {
			if builtin(a) {
				return -1
			}
			return 1
		}
		return strings.Compare(a, b)
	})
	reject := " --reject-with icmp-port-unreachable"
	if f.fam == IPv6 {
		reject = " --reject-with icmp6-port-unreachable"
	}
	var b strings.Builder
	b.WriteString("# Generated by fakeIPT\n*" + table + "\n")
	for _, c := range chains {
		if builtin(c) {
			b.WriteString(":" + c + " ACCEPT [0:0]\n")
		} else {
			b.WriteString(":" + c + " - [0:0]\n")
		}
	}
	for _, c := range chains {
		for _, r := range f.chains[table+"/"+c] {
			if strings.HasSuffix(r, " -j REJECT") {
				r += reject
			}
			b.WriteString("-A " + c + " " + r + "\n")
		}
	}
	b.WriteString("COMMIT\n# Completed\n")
	return b.String()
}

func newTestIPTables(cfg IPTablesConfig) (*IPTables, *restoreLog, map[Family]*fakeIPT) {
	rl := &restoreLog{inputs: map[string][]string{}, fail: map[string]bool{}, byBin: map[string]*fakeIPT{}}
	p := &IPTables{cfg: cfg, run: rl.run}
	fakes := map[Family]*fakeIPT{}
	for _, fam := range []Family{IPv4, IPv6} {
		f := newFakeIPT()
		f.fam = fam
		fakes[fam] = f
		bin := fmt.Sprintf("ip%stables-nft-restore", map[Family]string{IPv4: "", IPv6: "6"}[fam])
		rl.byBin[bin] = f
		p.fams = append(p.fams, &famTables{fam: fam, ipt: f, restore: bin, save: strings.Replace(bin, "restore", "save", 1)})
	}
	return p, rl, fakes
}

func TestIPTablesSync(t *testing.T) {
	p, rl, fakes := newTestIPTables(IPTablesConfig{LockWaitSeconds: 5})
	ctx := t.Context()
	if err := p.Sync(ctx, fixedPortals()); err != nil {
		t.Fatal(err)
	}
	r4 := render(fixedPortals(), IPv4, IPTablesConfig{})
	if got := rl.inputs["iptables-nft-restore"]; !slices.Equal(got, []string{string(r4.nat), string(r4.filter)}) {
		t.Errorf("IPv4 restores = %q", got)
	}
	if got := len(rl.inputs["ip6tables-nft-restore"]); got != 2 {
		t.Errorf("IPv6 restores = %d, want one per table", got)
	}
	wantCalls := []string{
		"insert nat PREROUTING 1 KUBE-PORTALS-CONTAINER",
		"insert nat OUTPUT 1 KUBE-PORTALS-HOST",
		"append nat PREROUTING KUBE-NODEPORT-CONTAINER",
		"append nat OUTPUT KUBE-NODEPORT-HOST",
		"insert filter INPUT 1 KUBE-NODEPORT-NON-LOCAL",
		"insert filter INPUT 1 KUBE-PORTALS-FIREWALL",
		"insert filter FORWARD 1 KUBE-PORTALS-FIREWALL",
		"insert filter OUTPUT 1 KUBE-PORTALS-FIREWALL",
	}
	if !slices.Equal(mutations(fakes[IPv4].calls), wantCalls) {
		t.Errorf("jump calls =\n%q\nwant\n%q", fakes[IPv4].calls, wantCalls)
	}
	// A second sync finds the jumps and adds none; the chains are
	// rewritten again (an empty set empties them).
	fakes[IPv4].calls = nil
	if err := p.Sync(ctx, nil); err != nil {
		t.Fatal(err)
	}
	if want := []string{"list nat PREROUTING", "list nat OUTPUT", "list filter INPUT", "list filter FORWARD", "list filter OUTPUT"}; !slices.Equal(fakes[IPv4].calls, want) {
		t.Errorf("second sync made calls %q, want only one listing per built-in chain", fakes[IPv4].calls)
	}
	if last := rl.inputs["iptables-nft-restore"][2]; strings.Contains(last, "-A ") {
		t.Errorf("empty sync wrote rules:\n%s", last)
	}
}

func mutations(calls []string) []string {
	return slices.DeleteFunc(slices.Clone(calls), func(c string) bool { return strings.HasPrefix(c, "list ") })
}

func TestIPTablesSyncCarriesOn(t *testing.T) {
	p, rl, _ := newTestIPTables(IPTablesConfig{})
	rl.fail["iptables-nft-restore"] = true
	bad := Portal{Service: webHTTP, Kind: ClusterIP, Family: IPv4, Port: 80, ProxyPort: 1} // no address
	err := p.Sync(t.Context(), append(fixedPortals(), bad))
	if err == nil {
		t.Fatal("Sync succeeded with a failing restore and an invalid portal")
	}
	for _, want := range []string{"no frontend address", "restore nat table (IPv4)", "restore filter table (IPv4)"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
	if got := rl.inputs["ip6tables-nft-restore"]; len(got) != 2 || !strings.Contains(got[0], "fd5e:b1b5::10/128") {
		t.Errorf("IPv6 was not programmed after the IPv4 failure: %q", got)
	}
}

func TestIPTablesCleanup(t *testing.T) {
	p, _, fakes := newTestIPTables(IPTablesConfig{})
	ctx := t.Context()
	// Nothing there: harmless.
	if err := p.Cleanup(ctx); err != nil {
		t.Fatalf("cleanup of nothing: %v", err)
	}
	if err := p.Sync(ctx, fixedPortals()); err != nil {
		t.Fatal(err)
	}
	// A duplicate jump, as a race or a hand might leave, and the legacy
	// kube-proxy's jump with its own comment.
	j := jumps[0]
	fakes[IPv4].Append(j.table, j.from, j.spec()...)
	fakes[IPv4].Append(j.table, j.from, "-m", "comment", "--comment", "handle ClusterIPs; NOTE: this must be before the NodePort rules", "-j", j.to)
	fakes[IPv4].Append(j.table, j.from, "-j", "SOMEONE-ELSE")
	if err := p.Cleanup(ctx); err != nil {
		t.Fatal(err)
	}
	for fam, f := range fakes {
		for k, rules := range f.chains {
			if strings.Contains(k, "KUBE-") {
				t.Errorf("%s: chain %s left", fam, k)
			}
			for _, r := range rules {
				if strings.Contains(r, "KUBE-") {
					t.Errorf("%s: jump %q left in %s", fam, r, k)
				}
			}
			if k == "nat/PREROUTING" && fam == IPv4 && !slices.Equal(rules, []string{"-j SOMEONE-ELSE"}) {
				t.Errorf("PREROUTING after cleanup = %q, want only the other tool's rule", rules)
			}
		}
	}
}

func TestDetect(t *testing.T) {
	saves := map[string]string{
		"iptables-legacy-save":  "*filter\n-A INPUT -j ACCEPT\n-A INPUT -j DROP\nCOMMIT\n",
		"ip6tables-legacy-save": "",
		"iptables-nft-save":     "*nat\n:KUBE-PORTALS-HOST - [0:0]\n-A OUTPUT -j KUBE-PORTALS-HOST\nCOMMIT\n",
		"ip6tables-nft-save":    "",
	}
	p := &IPTables{
		cfg: IPTablesConfig{Families: []Family{IPv4, IPv6}},
		run: func(_ context.Context, _ []byte, name string, _ ...string) ([]byte, error) {
			return []byte(saves[name]), nil
		},
		lookPath: func(s string) (string, error) { return "/usr/sbin/" + s, nil },
	}
	d := p.detect(t.Context())
	b, reason, leftovers := d.backend, d.reason, d.leftovers
	if b != BackendLegacy || !strings.Contains(reason, "2 legacy, 1 nft") {
		t.Errorf("detect = %s (%s), want legacy", b, reason)
	}
	if !leftovers[IPv4] || leftovers[IPv6] {
		t.Errorf("leftovers = %v, want our IPv4 chains found in nft", leftovers)
	}
	// Only plain iptables installed: its version decides.
	p.lookPath = func(s string) (string, error) { return "", errors.New("not found") }
	p.run = func(_ context.Context, _ []byte, name string, args ...string) ([]byte, error) {
		if name == "iptables" && slices.Equal(args, []string{"--version"}) {
			return []byte("iptables v1.8.9 (legacy)\n"), nil
		}
		return nil, errors.New("unexpected " + name)
	}
	if b := p.detect(t.Context()).backend; b != BackendLegacy {
		t.Errorf("plain legacy iptables detected as %s", b)
	}
}

// TestHasRule reads jumps as "iptables -S" prints them (nft and legacy
// print the same), so Sync needs no "-C" when they are in place.
func TestHasRule(t *testing.T) {
	listing := []string{
		"-P PREROUTING ACCEPT",
		`-A PREROUTING -m comment --comment "kube-userspace-proxy service portals; keep before the node port jump" -j KUBE-PORTALS-CONTAINER`,
		`-A PREROUTING -m addrtype --dst-type LOCAL -j DOCKER`,
		`-A PREROUTING -m addrtype --dst-type LOCAL -m comment --comment "kube-userspace-proxy node ports; keep as the last rule" -j KUBE-NODEPORT-CONTAINER`,
	}
	for _, j := range jumps[:4] {
		want := j.from == "PREROUTING"
		if got := hasRule(listing, j.from, j.spec()); got != want {
			t.Errorf("hasRule(%s -> %s) = %v, want %v", j.from, j.to, got, want)
		}
	}
	if hasRule([]string{`-A PREROUTING -m comment --comment "other" -j KUBE-PORTALS-CONTAINER`}, "PREROUTING", jumps[0].spec()) {
		t.Error("a jump with another comment counts as ours")
	}
}

// failingIPT is a fakeIPT whose chain deletions fail while fail is set.
type failingIPT struct {
	*fakeIPT
	fail bool
}

func (f *failingIPT) ClearAndDeleteChain(table, chain string) error {
	if f.fail {
		return errors.New("exit status 4: iptables: Resource temporarily unavailable")
	}
	return f.fakeIPT.ClearAndDeleteChain(table, chain)
}

// TestIPTablesSyncRemovesLeftovers: our chains in the other backend, where
// an earlier run left them, go at the first Sync (the kernel runs both
// backends' rules); a failure there does not fail the Sync and is retried
// by the next one, which then leaves the other backend alone.
func TestIPTablesSyncRemovesLeftovers(t *testing.T) {
	p, _, _ := newTestIPTables(IPTablesConfig{})
	ctx := t.Context()
	// The earlier run's rules, written into both legacy families by a
	// portal of their own, and another tool's rule beside them.
	stale := map[Family]*failingIPT{}
	for _, fam := range []Family{IPv4, IPv6} {
		old, rl, fakes := newTestIPTables(IPTablesConfig{})
		old.fams = slices.DeleteFunc(old.fams, func(ft *famTables) bool { return ft.fam != fam })
		if err := old.Sync(ctx, fixedPortals()); err != nil {
			t.Fatal(err)
		}
		if len(rl.inputs) == 0 {
			t.Fatal("the earlier run wrote nothing")
		}
		fakes[fam].Append(tableNAT, "PREROUTING", "-j", "SOMEONE-ELSE")
		stale[fam] = &failingIPT{fakeIPT: fakes[fam], fail: fam == IPv6}
		bin := map[Family]string{IPv4: "iptables-legacy", IPv6: "ip6tables-legacy"}[fam]
		p.leftover = append(p.leftover, &famTables{fam: fam, ipt: stale[fam], bin: bin, save: bin + "-save"})
	}
	// What they hold, as iptables-legacy-save reads it: what Removed
	// hands on once they are gone.
	restore := p.run
	p.run = func(ctx context.Context, stdin []byte, name string, args ...string) ([]byte, error) {
		switch name {
		case "iptables-legacy-save":
			return render(fixedPortals(), IPv4, IPTablesConfig{}).nat, nil
		case "ip6tables-legacy-save":
			return render(fixedPortals(), IPv6, IPTablesConfig{}).nat, nil
		}
		return restore(ctx, stdin, name, args...)
	}
	removedFamilies := func() []Family {
		var out []Family
		for _, pt := range p.Removed() {
			if !slices.Contains(out, pt.Family) {
				out = append(out, pt.Family)
			}
		}
		return out
	}
	ours := func(f *fakeIPT) []string {
		var out []string
		for k, rules := range f.chains {
			if strings.Contains(k, "KUBE-") {
				out = append(out, k)
			}
			for _, r := range rules {
				if strings.Contains(r, "KUBE-") {
					out = append(out, k+": "+r)
				}
			}
		}
		return out
	}
	if len(ours(stale[IPv4].fakeIPT)) == 0 || len(ours(stale[IPv6].fakeIPT)) == 0 {
		t.Fatal("no stale chains to remove")
	}

	if err := p.Sync(ctx, fixedPortals()); err != nil {
		t.Fatalf("Sync failed for the other backend's leftovers: %v", err)
	}
	if left := ours(stale[IPv4].fakeIPT); len(left) > 0 {
		t.Errorf("IPv4 legacy keeps ours after the first sync: %q", left)
	}
	if got := stale[IPv4].chains["nat/PREROUTING"]; !slices.Equal(got, []string{"-j SOMEONE-ELSE"}) {
		t.Errorf("IPv4 legacy PREROUTING = %q, want only the other tool's rule", got)
	}
	if len(p.leftover) != 1 || p.leftover[0].fam != IPv6 {
		t.Fatalf("leftovers still to remove = %v, want IPv6 only", p.leftover)
	}
	if got := removedFamilies(); !slices.Equal(got, []Family{IPv4}) {
		t.Errorf("Removed gives portals of %v, want IPv4's only (IPv6's rules are still there)", got)
	}

	// The next sync retries what failed.
	stale[IPv6].fail = false
	if err := p.Sync(ctx, fixedPortals()); err != nil {
		t.Fatal(err)
	}
	if left := ours(stale[IPv6].fakeIPT); len(left) > 0 {
		t.Errorf("IPv6 legacy keeps ours after the retry: %q", left)
	}
	if len(p.leftover) != 0 {
		t.Errorf("leftovers still to remove = %d, want none", len(p.leftover))
	}
	if got := removedFamilies(); !slices.Equal(got, []Family{IPv6}) {
		t.Errorf("Removed gives portals of %v after the retry, want IPv6's only", got)
	}

	// Done: later syncs leave the other backend alone.
	stale[IPv4].calls = nil
	if err := p.Sync(ctx, nil); err != nil {
		t.Fatal(err)
	}
	if len(stale[IPv4].calls) > 0 {
		t.Errorf("a later sync touched the other backend: %q", stale[IPv4].calls)
	}
}

// captureLog sends klog's output to a buffer for the rest of the test.
func captureLog(t *testing.T) *bytes.Buffer {
	var buf bytes.Buffer
	klog.LogToStderr(false)
	// INFO's output takes every line: an error line goes to the output of
	// each severity up to its own.
	klog.SetOutputBySeverity("INFO", &buf)
	klog.SetOutputBySeverity("WARNING", io.Discard)
	klog.SetOutputBySeverity("ERROR", io.Discard)
	klog.SetOutputBySeverity("FATAL", io.Discard)
	t.Cleanup(func() {
		klog.Flush()
		klog.LogToStderr(true)
	})
	return &buf
}

// TestDetectUnreadable: a backend whose rules cannot be read is not taken
// for an empty one: detect says which, and why.
func TestDetectUnreadable(t *testing.T) {
	denied := errors.New("iptables-legacy-save: exit status 1: iptables-save v1.8.9 (legacy): Cannot initialize: Permission denied (you must be root)")
	p := &IPTables{
		cfg: IPTablesConfig{Families: []Family{IPv4}},
		run: func(_ context.Context, _ []byte, name string, _ ...string) ([]byte, error) {
			if name == "iptables-legacy-save" {
				return nil, denied
			}
			return []byte("*filter\n-A INPUT -j ACCEPT\nCOMMIT\n"), nil
		},
		lookPath: func(s string) (string, error) { return "/usr/sbin/" + s, nil },
	}
	d := p.detect(t.Context())
	if d.backend != BackendNFT || !strings.Contains(d.reason, "the legacy backend could not be read") {
		t.Errorf("detect = %s (%s), want nft, saying legacy could not be read", d.backend, d.reason)
	}
	if d.unreadable[BackendLegacy][IPv4] != denied || len(d.unreadable[BackendNFT]) != 0 {
		t.Errorf("unreadable = %v, want legacy IPv4's error only", d.unreadable)
	}
	if _, ok := d.saves[BackendLegacy][IPv4]; ok {
		t.Error("the unreadable save counts as rules read")
	}
}

// TestIPTablesCleanupUnreadable: Cleanup fails, naming the backend and
// why, while the other backend cannot be read, since our rules may be
// there; once it can be read, it removes them there too.
func TestIPTablesCleanupUnreadable(t *testing.T) {
	p, _, _ := newTestIPTables(IPTablesConfig{})
	ctx := t.Context()
	old, _, fakes := newTestIPTables(IPTablesConfig{})
	if err := old.Sync(ctx, fixedPortals()); err != nil {
		t.Fatal(err)
	}
	legacy := fakes[IPv4]
	p.unreadable = []*famTables{{fam: IPv4, backend: BackendLegacy, ipt: legacy, bin: "iptables-legacy", save: "iptables-legacy-save"}}
	readable := false
	restore := p.run
	p.run = func(ctx context.Context, stdin []byte, name string, args ...string) ([]byte, error) {
		if name == "iptables-legacy-save" {
			if !readable {
				return nil, errors.New("iptables-legacy-save: exit status 1: iptables-save v1.8.9 (legacy): Cannot initialize: Permission denied (you must be root)")
			}
			return render(fixedPortals(), IPv4, IPTablesConfig{}).nat, nil
		}
		return restore(ctx, stdin, name, args...)
	}
	err := p.Cleanup(ctx)
	if err == nil {
		t.Fatal("Cleanup succeeded though the legacy backend, which holds our rules, could not be read")
	}
	for _, want := range []string{"cleanup (iptables-legacy): cannot read the legacy backend's rules", "CAP_NET_RAW", "Permission denied"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	if _, ok := legacy.chains["nat/"+ChainPortalsContainer]; !ok {
		t.Fatal("the unreadable backend was changed")
	}
	readable = true
	if err := p.Cleanup(ctx); err != nil {
		t.Fatal(err)
	}
	for k := range legacy.chains {
		if strings.Contains(k, "KUBE-") {
			t.Errorf("chain %s left in the backend that can now be read", k)
		}
	}
}

// TestIPTablesSyncReportsMissingJumps: jumps that something removed from
// the built-in chains (a firewall reload) are put back and named, as
// warnings; the first sync, which adds them all, says nothing of the
// kind. kube-proxy's jumps are reported when they appear, once, and when
// they go.
func TestIPTablesSyncReportsMissingJumps(t *testing.T) {
	p, _, fakes := newTestIPTables(IPTablesConfig{})
	ctx := t.Context()
	buf := captureLog(t)
	if err := p.Sync(ctx, fixedPortals()); err != nil {
		t.Fatal(err)
	}
	klog.Flush()
	if strings.Contains(buf.String(), "were missing") {
		t.Errorf("the first sync reports missing jumps:\n%s", buf)
	}
	fakes[IPv4].chains["nat/PREROUTING"] = nil
	fakes[IPv4].chains["filter/FORWARD"] = nil
	buf.Reset()
	if err := p.Sync(ctx, fixedPortals()); err != nil {
		t.Fatal(err)
	}
	klog.Flush()
	var warned []string
	for _, l := range strings.Split(buf.String(), "\n") {
		if strings.Contains(l, "Jumps into the portal's chains were missing") {
			warned = append(warned, l)
		}
	}
	if len(warned) != 1 || !strings.HasPrefix(warned[0], "E") ||
		!strings.Contains(warned[0], `family="IPv4" restored=["nat PREROUTING -j KUBE-PORTALS-CONTAINER","nat PREROUTING -j KUBE-NODEPORT-CONTAINER","filter FORWARD -j KUBE-PORTALS-FIREWALL"]`) {
		t.Errorf("after the flush, warnings %q, want one naming IPv4's three restored jumps", warned)
	}
	if got := fakes[IPv4].chains["nat/PREROUTING"]; len(got) != 2 {
		t.Errorf("PREROUTING after the sync = %q, want our two jumps back", got)
	}

	// kube-proxy's jump appears, stays, goes.
	kp := `-m comment --comment "kubernetes service portals" -j KUBE-SERVICES`
	fakes[IPv6].chains["nat/OUTPUT"] = slices.Insert(fakes[IPv6].chains["nat/OUTPUT"], 0, kp)
	buf.Reset()
	for range 2 {
		if err := p.Sync(ctx, fixedPortals()); err != nil {
			t.Fatal(err)
		}
	}
	klog.Flush()
	if n := strings.Count(buf.String(), "kube-proxy's iptables rules are in effect"); n != 1 ||
		!strings.Contains(buf.String(), `family="IPv6" table="nat" jumps=["OUTPUT -j KUBE-SERVICES"]`) {
		t.Errorf("kube-proxy's jump reported %d times, want once for IPv6:\n%s", n, buf)
	}
	fakes[IPv6].chains["nat/OUTPUT"] = slices.DeleteFunc(fakes[IPv6].chains["nat/OUTPUT"], func(r string) bool { return r == kp })
	buf.Reset()
	if err := p.Sync(ctx, fixedPortals()); err != nil {
		t.Fatal(err)
	}
	klog.Flush()
	if !strings.Contains(buf.String(), `"kube-proxy's iptables rules no longer take traffic: the built-in nat chains do not jump to them any more" command="" family="IPv6"`) {
		t.Errorf("kube-proxy's jump going is not said:\n%s", buf)
	}
}

// TestIPTablesKubeProxyNFTables: kube-proxy's nftables tables are named
// when they appear and when they go; other tables are not.
func TestIPTablesKubeProxyNFTables(t *testing.T) {
	p, _, _ := newTestIPTables(IPTablesConfig{})
	tables := []string{"inet filter"}
	p.nftTables = func() ([]string, error) { return tables, nil }
	buf := captureLog(t)
	sync := func() string {
		t.Helper()
		buf.Reset()
		if err := p.Sync(t.Context(), nil); err != nil {
			t.Fatal(err)
		}
		klog.Flush()
		return buf.String()
	}
	if out := sync(); strings.Contains(out, "nftables") {
		t.Errorf("another table reported:\n%s", out)
	}
	tables = []string{"inet filter", "ip6 kube-proxy", "ip kube-proxy"}
	if out := sync(); !strings.Contains(out, `on this node removes them" tables=["ip kube-proxy","ip6 kube-proxy"]`) {
		t.Errorf("kube-proxy's tables not named:\n%s", out)
	}
	if out := sync(); strings.Contains(out, "kube-proxy") {
		t.Errorf("said again:\n%s", out)
	}
	tables = nil
	if out := sync(); !strings.Contains(out, `"kube-proxy's nftables tables are gone from this host"`) {
		t.Errorf("their going is not said:\n%s", out)
	}
}

// TestIPTablesReportKubeProxyAtStart: kube-proxy's chains in either
// backend are named at start, with their jumps; the first Sync does not
// say it again for the chosen backend.
func TestIPTablesReportKubeProxyAtStart(t *testing.T) {
	p, _, fakes := newTestIPTables(IPTablesConfig{Families: []Family{IPv4, IPv6}})
	p.backend = BackendNFT
	p.lookPath = func(s string) (string, error) { return "/usr/sbin/" + s, nil }
	kp := `-m comment --comment "kubernetes service portals" -j KUBE-SERVICES`
	fakes[IPv4].chains["nat/PREROUTING"] = []string{kp}
	saves := map[Backend]map[Family]string{
		BackendNFT: {
			IPv4: "*nat\n:KUBE-SERVICES - [0:0]\n:KUBE-NODEPORTS - [0:0]\n-A PREROUTING " + kp + "\nCOMMIT\n",
			IPv6: "*filter\n-A INPUT -j ACCEPT\nCOMMIT\n",
		},
		BackendLegacy: {
			IPv4: "*nat\n:KUBE-SERVICES - [0:0]\nCOMMIT\n",
			IPv6: "*nat\n:KUBE-SERVICES - [0:0]\n-A OUTPUT " + kp + "\nCOMMIT\n",
		},
	}
	buf := captureLog(t)
	p.reportKubeProxy(saves)
	klog.Flush()
	out := buf.String()
	for _, want := range []string{
		`on this node removes them" command="iptables-nft" family="IPv4" table="nat" chains=["KUBE-SERVICES","KUBE-NODEPORTS"] jumps=["PREROUTING -j KUBE-SERVICES"]`,
		`on this node removes them" command="ip6tables-legacy" family="IPv6" table="nat" chains=["KUBE-SERVICES"] jumps=["OUTPUT -j KUBE-SERVICES"]`,
		`"kube-proxy's nat chains are on this host, but no built-in chain jumps to them, so they take no traffic; ` + "`kube-proxy --cleanup`" + ` on this node removes them" command="iptables-legacy" family="IPv4"`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("the log does not say\n%s\nlog:\n%s", want, out)
		}
	}
	if strings.Contains(out, `family="IPv6" table="nat" chains=["KUBE-SERVICES","KUBE-NODEPORTS"]`) || strings.Count(out, "\n") != 3 {
		t.Errorf("want three lines, got:\n%s", out)
	}
	buf.Reset()
	if err := p.Sync(t.Context(), fixedPortals()); err != nil {
		t.Fatal(err)
	}
	klog.Flush()
	if strings.Contains(buf.String(), "kube-proxy") {
		t.Errorf("the first sync says it again:\n%s", buf)
	}
}
