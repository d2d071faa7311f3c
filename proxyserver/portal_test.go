package proxyserver

import (
	"context"
	"errors"
	"net/netip"
	"testing"
	"time"

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
