package proxyserver

import (
	"context"
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"

	"k8s.io/klog/v2"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/conntrack"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/portal"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/state"
)

func udpPortal(ip string, proxyPort uint16) portal.Portal {
	a := netip.MustParseAddr(ip)
	return portal.Portal{
		Service: state.ServicePortName{Namespace: "ns", Name: "dns", Protocol: state.UDP},
		Kind:    portal.ClusterIP, Family: portal.FamilyOf(a), IP: a, Port: 53, ProxyPort: proxyPort,
	}
}

func TestKernelSync(t *testing.T) {
	ctx := context.Background()
	pt := &portal.Fake{}
	ct := &conntrack.Fake{}
	k := &kernelSync{pt: pt, ct: ct, minPeriod: time.Hour, resync: 2 * time.Hour}
	one := []portal.Portal{udpPortal("198.18.0.10", 40000)}

	if err := k.sync(ctx, one); err != nil {
		t.Fatalf("first sync: %v", err)
	}
	if pt.Syncs() != 1 {
		t.Fatalf("%d portal syncs, want 1", pt.Syncs())
	}
	// Unchanged portals (an endpoint-only change) never touch the kernel.
	if err := k.sync(ctx, []portal.Portal{udpPortal("198.18.0.10", 40000)}); err != nil || pt.Syncs() != 1 {
		t.Fatalf("unchanged portals: err %v, %d syncs; want none", err, pt.Syncs())
	}
	// A change within minPeriod is deferred, not lost.
	moved := []portal.Portal{udpPortal("198.18.0.10", 40001)}
	var d errDeferred
	if err := k.sync(ctx, moved); !errors.As(err, &d) || d.after <= 0 || pt.Syncs() != 1 {
		t.Fatalf("change within the min period: err %v, %d syncs; want deferred", err, pt.Syncs())
	}
	// Once the period has passed it is written, and the moved UDP portal's
	// conntrack entries are cleared.
	k.lastTime = time.Now().Add(-2 * time.Hour)
	calls := len(ct.Calls())
	if err := k.sync(ctx, moved); err != nil || pt.Syncs() != 2 {
		t.Fatalf("change after the min period: err %v, %d syncs", err, pt.Syncs())
	}
	if got := ct.Calls(); len(got) != calls+1 || len(got[len(got)-1]) == 0 {
		t.Fatalf("conntrack calls %v: want a ClearUDP for the moved portal", got)
	}
	// A failed portal sync is retried even with the same portals.
	pt.SetError(errors.New("iptables-restore: boom"))
	k.lastTime = time.Now().Add(-2 * time.Hour)
	gone := []portal.Portal{}
	if err := k.sync(ctx, gone); err == nil {
		t.Fatal("a failing portal sync reported success")
	}
	pt.SetError(nil)
	k.lastTime = time.Now().Add(-2 * time.Hour)
	if err := k.sync(ctx, gone); err != nil {
		t.Fatalf("retry: %v", err)
	}
	if got := pt.Portals(); len(got) != 0 {
		t.Fatalf("after the retry the kernel holds %v, want nothing", got)
	}
}

// removingPortal is a portal that removed rules (our chains in the other
// iptables backend) while syncing.
type removingPortal struct {
	*portal.Fake
	removed []portal.Portal
}

func (r *removingPortal) Removed() []portal.Portal {
	out := r.removed
	r.removed = nil
	return out
}

// TestKernelSyncClearsWhatRemovedRulesMade: the UDP entries of rules the
// portal removed at a sync (our chains in the other backend) are deleted,
// even where the new rules catch the same frontend: an entry keeps the
// mapping of the rule that made it.
func TestKernelSyncClearsWhatRemovedRulesMade(t *testing.T) {
	ctx := context.Background()
	ct := &conntrack.Fake{}
	client := conntrack.Flow{Family: portal.IPv4, Protocol: conntrack.ProtocolUDP,
		OrigSrc: netip.MustParseAddrPort("198.18.10.2:45454"), OrigDst: netip.MustParseAddrPort("198.18.0.53:53"),
		ReplySrc: netip.MustParseAddrPort("198.18.10.1:39999"), ReplyDst: netip.MustParseAddrPort("198.18.10.2:45454")}
	other := client
	other.OrigDst = netip.MustParseAddrPort("198.18.0.54:53")
	ct.Add(client, other)
	now := []portal.Portal{udpPortal("198.18.0.53", 40000), udpPortal("198.18.0.54", 40001)}
	pt := &removingPortal{Fake: &portal.Fake{}, removed: []portal.Portal{udpPortal("198.18.0.53", 39999)}}
	// The restart's first sync keeps the chosen backend's rules as they
	// are: nothing stale there.
	k := &kernelSync{pt: pt, ct: ct, last: now, minPeriod: 0, resync: time.Hour}
	if err := k.sync(ctx, now); err != nil {
		t.Fatal(err)
	}
	if got := ct.Flows(); len(got) != 1 || got[0] != other {
		t.Errorf("conntrack holds %v after the sync that removed the rule of 198.18.0.53:53, want only %v", got, other)
	}
}

// TestNoPortalError: --portal=auto's refusal in cluster mode puts each
// portal's error on one line (iptables' stderr ends in a newline), and
// tells a root process without CAP_NET_ADMIN what it lacks, not to run
// as root.
func TestNoPortalError(t *testing.T) {
	iptErr := errors.New("iptables: running iptables -w -t nat -S: exit status 4: iptables v1.8.9 (nf_tables): Could not fetch rule set generation id: Permission denied (you must be root)\n")
	bindErr := errors.New("bind portal: changing the network configuration takes CAP_NET_ADMIN")
	for _, tc := range []struct {
		name      string
		root      bool
		want, not string
	}{
		{"unprivileged", false, "run with CAP_NET_ADMIN (as root", "runs as root but"},
		{"root without CAP_NET_ADMIN", true, "runs as root but without CAP_NET_ADMIN", "run with CAP_NET_ADMIN (as root"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			msg := noPortalError(iptErr, bindErr, tc.root).Error()
			if strings.Contains(msg, "\n") || !strings.Contains(msg, "(you must be root)) nor the bind portal") {
				t.Errorf("not on one line: %q", msg)
			}
			if !strings.Contains(msg, tc.want) || strings.Contains(msg, tc.not) || !strings.Contains(msg, "--portal=none") {
				t.Errorf("%q: want it to say %q, not %q", msg, tc.want, tc.not)
			}
		})
	}
}

// stalePortal is a portal whose Sync of the same portals would do more
// than the last one did (portal.Bind with IPv6 turned back on).
type stalePortal struct {
	*portal.Fake
	stale bool
}

func (s *stalePortal) Stale() bool { return s.stale }

// TestKernelSyncStalePortal: unchanged portals are synced again before the
// resync is due when the portal says it is stale, so a family the bind
// portal skipped is served at the next sync, not at the resync.
func TestKernelSyncStalePortal(t *testing.T) {
	ctx := context.Background()
	pt := &stalePortal{Fake: &portal.Fake{}}
	k := &kernelSync{pt: pt, minPeriod: 0, resync: time.Hour}
	one := []portal.Portal{udpPortal("fd5e:b1b5::10", 0)}
	if err := k.sync(ctx, one); err != nil || pt.Syncs() != 1 {
		t.Fatalf("first sync: err %v, %d syncs", err, pt.Syncs())
	}
	if err := k.sync(ctx, one); err != nil || pt.Syncs() != 1 {
		t.Fatalf("unchanged portals: err %v, %d syncs; want none", err, pt.Syncs())
	}
	pt.stale = true
	if err := k.sync(ctx, one); err != nil || pt.Syncs() != 2 {
		t.Fatalf("unchanged portals, stale portal: err %v, %d syncs; want 2", err, pt.Syncs())
	}
}

// checkingPortal is a portal that reads its rules back, as
// portal.IPTables does: InSync answers in and err, Drift drifted.
type checkingPortal struct {
	*portal.Fake
	in      bool
	err     error
	drifted bool
	checks  int
	drifts  int
}

func (c *checkingPortal) InSync(context.Context, []portal.Portal) (bool, error) {
	c.checks++
	return c.in, c.err
}

func (c *checkingPortal) Drift(context.Context) ([]portal.Portal, bool, error) {
	c.drifts++
	return nil, c.drifted, nil
}

// TestKernelSyncResyncInPlace: a full resync that finds the rules as a
// Sync would write them writes nothing and waits for the next resync;
// rules otherwise, or unreadable, are written as before, and rules that
// something else rewrote are said to be. A change is written without a
// look.
func TestKernelSyncResyncInPlace(t *testing.T) {
	ctx := context.Background()
	buf := captureLog(t)
	pt := &checkingPortal{Fake: &portal.Fake{}, in: true}
	k := &kernelSync{pt: pt, minPeriod: 0, resync: time.Hour}
	one := []portal.Portal{udpPortal("198.18.0.10", 40000)}
	due := func() { k.lastTime = time.Now().Add(-2 * time.Hour) }
	step := func(what string, ps []portal.Portal, syncs, checks, drifts int) {
		t.Helper()
		if err := k.sync(ctx, ps); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if pt.Syncs() != syncs || pt.checks != checks || pt.drifts != drifts {
			t.Fatalf("%s: %d syncs, %d checks, %d drift checks; want %d, %d, %d", what, pt.Syncs(), pt.checks, pt.drifts, syncs, checks, drifts)
		}
	}
	step("first sync", one, 1, 0, 0)
	due()
	step("resync, rules in place", one, 1, 1, 0)
	step("just after that resync", one, 1, 1, 0) // the next is a period away
	step("a change", []portal.Portal{udpPortal("198.18.0.10", 40001)}, 2, 1, 0)
	pt.in = false
	due()
	step("resync, rules not in place", []portal.Portal{udpPortal("198.18.0.10", 40001)}, 3, 2, 1)
	pt.in, pt.err = true, errors.New("iptables-save: exit status 4")
	due()
	step("resync, rules unreadable", []portal.Portal{udpPortal("198.18.0.10", 40001)}, 4, 3, 2)
	klog.Flush()
	if strings.Contains(buf.String(), "rewritten by something else") {
		t.Errorf("said the rules were rewritten, though Drift says they were not:\n%s", buf)
	}
	pt.in, pt.err, pt.drifted = false, nil, true
	due()
	step("resync, rules rewritten", []portal.Portal{udpPortal("198.18.0.10", 40001)}, 5, 4, 3)
	klog.Flush()
	if !strings.Contains(buf.String(), "The portal's rules were rewritten by something else since the last sync") {
		t.Errorf("rules rewritten by something else are not said to be:\n%s", buf)
	}
}
