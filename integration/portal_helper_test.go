//go:build integration && linux

package integration

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/conntrack"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/portal"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/state"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/userspace"
)

// proxyReq is one command to the proxy helper, which runs the data plane,
// a portal and conntrack cleanup inside the node namespace, as the proxy
// does, and takes its snapshots from the test.
type proxyReq struct {
	// Op is apply, clear, existing, cleanup or close.
	Op    string              `json:"op"`
	Ports []state.ServicePort `json:"ports,omitempty"`
	// ProxyPorts, without a data plane, are the proxy ports of each
	// service port (by ServicePortName.String()).
	ProxyPorts map[string]uint16 `json:"proxyPorts,omitempty"`
	// Clear makes apply delete stale UDP conntrack entries at once;
	// otherwise they wait for a "clear".
	Clear bool `json:"clear,omitempty"`
	// NodePortAddresses configure the iptables portal (first request only).
	NodePortAddresses []netip.Prefix `json:"nodePortAddresses,omitempty"`
}

type proxyResp struct {
	Err        string            `json:"err,omitempty"`
	ProxyPorts map[string]uint16 `json:"proxyPorts,omitempty"`
	Portals    []string          `json:"portals,omitempty"`
	Backend    string            `json:"backend,omitempty"`
	Cleared    int               `json:"cleared"`
	Stale      int               `json:"stale"`
	SyncTook   time.Duration     `json:"syncTook"`
}

// runProxyHelper serves proxyReqs from stdin until it closes.
func runProxyHelper(mode string, withProxier bool) error {
	ctx := context.Background()
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 64<<10), 64<<20)
	enc := json.NewEncoder(os.Stdout)
	var (
		pt      portal.Interface
		backend string
		p       *userspace.Proxier
		last    []portal.Portal
		stale   []conntrack.Filter
	)
	ct, err := conntrack.New()
	if err != nil {
		return err
	}
	for in.Scan() {
		var req proxyReq
		if err := json.Unmarshal(in.Bytes(), &req); err != nil {
			return err
		}
		var resp proxyResp
		fail := func(err error) {
			if err != nil && resp.Err == "" {
				resp.Err = err.Error()
			}
		}
		if pt == nil {
			switch mode {
			case "iptables":
				ipt, err := portal.NewIPTables(ctx, portal.IPTablesConfig{NodePortAddresses: req.NodePortAddresses})
				if err != nil {
					return err
				}
				pt, backend = ipt, string(ipt.Backend())
			case "bind":
				b, err := portal.NewBind(ctx, portal.BindConfig{})
				if err != nil {
					return err
				}
				pt = b
			default:
				return fmt.Errorf("unknown portal %q", mode)
			}
			if withProxier {
				cfg := userspace.Config{UDPIdleTimeout: 5 * time.Second}
				if mode == "bind" {
					cfg.DisableProxyPorts, cfg.ServeFrontends, cfg.ServeNodePorts = true, true, true
				}
				p = userspace.New(cfg)
				defer p.Close()
			}
		}
		resp.Backend = backend
		switch req.Op {
		case "apply":
			snap := state.NewSnapshot(req.Ports)
			var portals []portal.Portal
			start := time.Now()
			if mode == "bind" {
				portals = portal.FromSnapshot(snap, nil, nil)
				fail(pt.Sync(ctx, portals)) // addresses first: listeners bind them
				resp.SyncTook = time.Since(start)
				if p != nil {
					fail(p.Apply(snap))
				}
			} else {
				proxyPort := func(n state.ServicePortName) uint16 { return req.ProxyPorts[n.String()] }
				if p != nil {
					fail(p.Apply(snap))
					proxyPort = p.ProxyPort
				}
				portals = portal.FromSnapshot(snap, proxyPort, nil)
				start = time.Now()
				fail(pt.Sync(ctx, portals))
				resp.SyncTook = time.Since(start)
			}
			stale = append(stale, conntrack.StaleUDP(last, portals)...)
			last = portals
			resp.Stale = len(stale)
			if req.Clear && len(stale) > 0 {
				n, err := ct.ClearUDP(ctx, stale...)
				fail(err)
				resp.Cleared, stale = n, nil
			}
			resp.ProxyPorts = map[string]uint16{}
			for _, n := range snap.Names() {
				if p != nil {
					resp.ProxyPorts[n.String()] = p.ProxyPort(n)
				}
			}
			for _, pp := range portals {
				resp.Portals = append(resp.Portals, string(pp.Kind)+" "+pp.String())
			}
		case "clear":
			n, err := ct.ClearUDP(ctx, stale...)
			fail(err)
			resp.Cleared, resp.Stale, stale = n, len(stale), nil
		case "existing":
			ipt, ok := pt.(*portal.IPTables)
			if !ok {
				return fmt.Errorf("existing needs the iptables portal")
			}
			got, err := ipt.Existing(ctx)
			fail(err)
			for _, pp := range got {
				resp.Portals = append(resp.Portals, string(pp.Kind)+" "+pp.String())
			}
		case "cleanup":
			fail(pt.Cleanup(ctx))
		case "close":
			return nil
		default:
			return fmt.Errorf("unknown op %q", req.Op)
		}
		if err := enc.Encode(resp); err != nil {
			return err
		}
	}
	return in.Err()
}

// proxyHelper drives a proxy helper from a test.
type proxyHelper struct{ *helperProc }

func startProxyHelper(t *testing.T, w *world, portalMode string, withProxier bool) *proxyHelper {
	t.Helper()
	env := []string{"KUPT_PORTAL=" + portalMode, "KUPT_PROXIER=0"}
	if withProxier {
		env[1] = "KUPT_PROXIER=1"
	}
	return &proxyHelper{startHelper(t, w.node, "proxy", env...)}
}

// do sends req and fails the test on an error answer.
func (h *proxyHelper) do(req proxyReq) proxyResp {
	h.t.Helper()
	var resp proxyResp
	h.call(req, &resp, 60*time.Second)
	if resp.Err != "" {
		h.t.Fatalf("proxy helper %s: %s", req.Op, resp.Err)
	}
	return resp
}
