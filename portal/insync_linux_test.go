package portal

import (
	"context"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"k8s.io/klog/v2"
)

// TestIPTablesInSync: after a Sync, the rules read back are exactly what
// Sync would write, and a resync may skip the restore; anything missing,
// extra or different, in any family, table, chain or jump, is not, nor is
// a failure to read them back. A Sync puts it right again.
func TestIPTablesInSync(t *testing.T) {
	ctx := t.Context()
	ps := fixedPortals() // with a REJECT, which iptables-save prints with its default reply
	rule := func(f *fakeIPT, chain string, i int) string { return f.chains[chain][i] }
	tests := []struct {
		name   string
		change func(p *IPTables, rl *restoreLog, f map[Family]*fakeIPT) []Portal // the portals to check; nil: ps
		err    bool
	}{
		{name: "a portal rule deleted", change: func(_ *IPTables, _ *restoreLog, f map[Family]*fakeIPT) []Portal {
			f[IPv6].chains["nat/"+ChainPortalsContainer] = f[IPv6].chains["nat/"+ChainPortalsContainer][1:]
			return nil
		}},
		{name: "a portal rule edited", change: func(_ *IPTables, _ *restoreLog, f map[Family]*fakeIPT) []Portal {
			r := rule(f[IPv4], "nat/"+ChainNodePortContainer, 1)
			f[IPv4].chains["nat/"+ChainNodePortContainer][1] = strings.Replace(r, "--to-ports 4123", "--to-ports 4223", 1)
			return nil
		}},
		{name: "a rule added to our filter chain", change: func(_ *IPTables, _ *restoreLog, f map[Family]*fakeIPT) []Portal {
			f[IPv4].Append(tableFilter, ChainNodePortNonLocal, "-p", "tcp", "-j", "ACCEPT")
			return nil
		}},
		{name: "two rules swapped", change: func(_ *IPTables, _ *restoreLog, f map[Family]*fakeIPT) []Portal {
			c := f[IPv4].chains["filter/"+ChainNodePortNonLocal]
			c[0], c[1] = c[1], c[0]
			return nil
		}},
		{name: "a REJECT with another reply", change: func(_ *IPTables, _ *restoreLog, f map[Family]*fakeIPT) []Portal {
			c := f[IPv4].chains["filter/"+ChainNodePortNonLocal]
			i := slices.IndexFunc(c, func(r string) bool { return strings.HasSuffix(r, " -j REJECT") })
			c[i] += " --reject-with icmp-host-prohibited"
			return nil
		}},
		{name: "a filter chain gone", change: func(_ *IPTables, _ *restoreLog, f map[Family]*fakeIPT) []Portal {
			delete(f[IPv6].chains, "filter/"+ChainFirewall)
			return nil
		}},
		{name: "a nat chain flushed", change: func(_ *IPTables, _ *restoreLog, f map[Family]*fakeIPT) []Portal {
			f[IPv4].chains["nat/"+ChainPortalsHost] = nil
			return nil
		}},
		{name: "a nat jump gone", change: func(_ *IPTables, _ *restoreLog, f map[Family]*fakeIPT) []Portal {
			j := jumps[2] // PREROUTING -> KUBE-NODEPORT-CONTAINER
			f[IPv6].DeleteIfExists(j.table, j.from, j.spec()...)
			return nil
		}},
		{name: "a filter jump gone", change: func(_ *IPTables, _ *restoreLog, f map[Family]*fakeIPT) []Portal {
			f[IPv4].chains["filter/FORWARD"] = nil
			return nil
		}},
		{name: "a jump with another comment", change: func(_ *IPTables, _ *restoreLog, f map[Family]*fakeIPT) []Portal {
			f[IPv4].chains["nat/OUTPUT"][0] = strings.Replace(f[IPv4].chains["nat/OUTPUT"][0], "service portals", "portals", 1)
			return nil
		}},
		{name: "other portals", change: func(*IPTables, *restoreLog, map[Family]*fakeIPT) []Portal {
			return ps[1:]
		}},
		{name: "an invalid portal", change: func(*IPTables, *restoreLog, map[Family]*fakeIPT) []Portal {
			return append(slices.Clone(ps), Portal{Service: webHTTP, Kind: ClusterIP, Family: IPv4, Port: 80, ProxyPort: 1})
		}},
		{name: "our chains still to remove from the other backend", change: func(p *IPTables, _ *restoreLog, _ map[Family]*fakeIPT) []Portal {
			p.leftover = []*famTables{{fam: IPv4, ipt: newFakeIPT(), bin: "iptables-legacy", save: "iptables-legacy-save"}}
			return nil
		}},
		{name: "the last sync failed in a family", change: func(p *IPTables, _ *restoreLog, _ map[Family]*fakeIPT) []Portal {
			p.fams[1].wrote = nil
			return nil
		}},
		{name: "the rules cannot be read", err: true, change: func(_ *IPTables, rl *restoreLog, _ map[Family]*fakeIPT) []Portal {
			rl.fail["ip6tables-nft-save"] = true
			return nil
		}},
		{name: "the rules cannot be parsed", err: true, change: func(p *IPTables, _ *restoreLog, _ map[Family]*fakeIPT) []Portal {
			p.run = func(context.Context, []byte, string, ...string) ([]byte, error) {
				return []byte("*nat\n-A\nCOMMIT\n"), nil
			}
			return nil
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p, rl, fakes := newTestIPTables(IPTablesConfig{})
			if in, err := p.InSync(ctx, ps); in || err != nil {
				t.Fatalf("before any Sync: InSync = %v, %v; want false: nothing written yet", in, err)
			}
			if err := p.Sync(ctx, ps); err != nil {
				t.Fatal(err)
			}
			restores, saves := rl.restores(), rl.saves
			if in, err := p.InSync(ctx, ps); !in || err != nil {
				t.Fatalf("after the Sync: InSync = %v, %v; want true", in, err)
			}
			if got := rl.saves - saves; got != 2 {
				t.Errorf("InSync ran %d saves, want one per family (every table at once)", got)
			}
			if rl.restores() != restores {
				t.Errorf("InSync ran iptables-restore")
			}
			check := tc.change(p, rl, fakes)
			if check == nil {
				check = ps
			}
			in, err := p.InSync(ctx, check)
			if in || (err != nil) != tc.err {
				t.Fatalf("InSync = %v, %v; want false, error %v", in, err, tc.err)
			}
			if rl.restores() != restores {
				t.Errorf("InSync ran iptables-restore")
			}
			if tc.name == "the rules cannot be read" || tc.name == "the rules cannot be parsed" || tc.name == "an invalid portal" {
				return
			}
			// What Sync does about it, it does all: then the rules are
			// in place again.
			if err := p.Sync(ctx, check); err != nil {
				t.Fatal(err)
			}
			if in, err := p.InSync(ctx, check); !in || err != nil {
				t.Errorf("after the next Sync: InSync = %v, %v; want true", in, err)
			}
		})
	}
}

// TestIPTablesInSyncDNAT: the rules are compared with what render writes
// now, so a DNAT target that moved is a difference.
func TestIPTablesInSyncDNAT(t *testing.T) {
	to := netip.MustParseAddr("198.18.10.1")
	p, _, _ := newTestIPTables(IPTablesConfig{DNAT: func(f Family) netip.Addr {
		if f == IPv4 {
			return to
		}
		return netip.Addr{}
	}})
	if err := p.Sync(t.Context(), fixedPortals()); err != nil {
		t.Fatal(err)
	}
	if in, err := p.InSync(t.Context(), fixedPortals()); !in || err != nil {
		t.Fatalf("InSync = %v, %v; want true", in, err)
	}
	to = netip.MustParseAddr("198.18.10.9")
	if in, err := p.InSync(t.Context(), fixedPortals()); in || err != nil {
		t.Errorf("with the DNAT target moved: InSync = %v, %v; want false", in, err)
	}
}

// TestIPTablesInSyncReportsKubeProxy: a resync that writes nothing still
// says when kube-proxy's jumps and tables appear, once, as Sync does.
func TestIPTablesInSyncReportsKubeProxy(t *testing.T) {
	p, _, fakes := newTestIPTables(IPTablesConfig{})
	var tables []string
	p.nftTables = func() ([]string, error) { return tables, nil }
	if err := p.Sync(t.Context(), fixedPortals()); err != nil {
		t.Fatal(err)
	}
	buf := captureLog(t)
	fakes[IPv4].chains["nat/PREROUTING"] = slices.Insert(fakes[IPv4].chains["nat/PREROUTING"], 0, `-m comment --comment "kubernetes service portals" -j KUBE-SERVICES`)
	tables = []string{"ip kube-proxy"}
	for range 2 {
		if in, err := p.InSync(t.Context(), fixedPortals()); !in || err != nil {
			t.Fatalf("InSync = %v, %v; want true: another program's jump is not ours to judge", in, err)
		}
	}
	klog.Flush()
	if n := strings.Count(buf.String(), "kube-proxy's iptables rules are in effect"); n != 1 || !strings.Contains(buf.String(), `family="IPv4" table="nat" jumps=["PREROUTING -j KUBE-SERVICES"]`) {
		t.Errorf("kube-proxy's jump said %d times, want once for IPv4:\n%s", n, buf)
	}
	if n := strings.Count(buf.String(), "kube-proxy's nftables tables are on this host"); n != 1 {
		t.Errorf("kube-proxy's table said %d times, want once:\n%s", n, buf)
	}
}

// TestIPTablesInSyncFindsOursInTheOtherBackend: a resync looks for our
// chains in the other backend, reading it only where peek says they may
// be; found there (put there after the start), they make the rules not in
// sync, are said once, and the Sync removes them, handing on what they
// held, as it does with those the start found.
func TestIPTablesInSyncFindsOursInTheOtherBackend(t *testing.T) {
	ctx := t.Context()
	p, _, _ := newTestIPTables(IPTablesConfig{})
	legacy := map[Family]*fakeIPT{IPv4: newFakeIPT(), IPv6: newFakeIPT()}
	may := map[Family]bool{}
	peeked := 0
	p.peek = func(ot *famTables) (bool, error) {
		peeked++
		return may[ot.fam], nil
	}
	legacySaves := 0
	run := p.run
	p.run = func(ctx context.Context, stdin []byte, name string, args ...string) ([]byte, error) {
		for fam, bin := range map[Family]string{IPv4: "iptables-legacy-save", IPv6: "ip6tables-legacy-save"} {
			if name != bin {
				continue
			}
			legacySaves++
			if len(args) == 2 && args[0] == "-t" {
				return []byte(legacy[fam].save(args[1])), nil
			}
			return []byte(legacy[fam].save(tableFilter) + legacy[fam].save(tableNAT)), nil
		}
		return run(ctx, stdin, name, args...)
	}
	for _, fam := range []Family{IPv4, IPv6} {
		bin := map[Family]string{IPv4: "iptables-legacy", IPv6: "ip6tables-legacy"}[fam]
		p.others = append(p.others, &famTables{fam: fam, backend: BackendLegacy, ipt: legacy[fam], bin: bin, save: bin + "-save"})
	}
	ps := fixedPortals()
	if err := p.Sync(ctx, ps); err != nil {
		t.Fatal(err)
	}
	inSync := func(want bool) {
		t.Helper()
		if in, err := p.InSync(ctx, ps); in != want || err != nil {
			t.Fatalf("InSync = %v, %v; want %v", in, err, want)
		}
	}

	// No legacy table in use: nothing read.
	inSync(true)
	if peeked != 2 || legacySaves != 0 {
		t.Errorf("peeked %d times and read legacy %d times, want 2 and none", peeked, legacySaves)
	}
	// In use, with nothing of ours: read, and in sync.
	may[IPv4] = true
	inSync(true)
	if legacySaves != 1 {
		t.Errorf("legacy read %d times, want once (IPv4)", legacySaves)
	}

	// An older proxy's portal appears in legacy IPv4.
	buf := captureLog(t)
	legacy[IPv4].chains["nat/"+ChainPortalsContainer] = []string{`-d 198.18.0.77/32 -p tcp -m comment --comment "e2e/gone:http" -m tcp --dport 80 -j REDIRECT --to-ports 40077`}
	legacy[IPv4].Insert(tableNAT, "PREROUTING", 1, jumps[0].spec()...)
	inSync(false)
	inSync(false) // still there: not said again
	klog.Flush()
	if n := strings.Count(buf.String(), "Found the portal's chains in the other iptables backend since the proxy started"); n != 1 || !strings.Contains(buf.String(), `command="iptables-legacy" family="IPv4"`) {
		t.Errorf("said %d times, want once for iptables-legacy IPv4:\n%s", n, buf)
	}
	if err := p.Sync(ctx, ps); err != nil {
		t.Fatal(err)
	}
	if _, ok := legacy[IPv4].chains["nat/"+ChainPortalsContainer]; ok || len(legacy[IPv4].chains["nat/PREROUTING"]) > 0 {
		t.Errorf("legacy IPv4 keeps ours after the Sync: %q", legacy[IPv4].chains)
	}
	if got := p.Removed(); len(got) != 1 || got[0].Port != 80 || got[0].ProxyPort != 40077 {
		t.Errorf("Removed = %v, want the stale portal", got)
	}
	inSync(true)
}
