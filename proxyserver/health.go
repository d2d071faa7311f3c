package proxyserver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"k8s.io/klog/v2"
)

// proxyHealth says whether the proxy keeps up with what its source tells
// it, by kube-proxy's rule: it is unhealthy while a change has waited
// longer than timeout to be applied (its portal cannot be programmed, or
// the loop is stuck; see syncLoop.run for what counts). It is healthy
// before the first change, and whenever nothing waits. It also keeps whether this node may take load-balancer
// traffic, which only /healthz reports: not once timeout has passed since
// the start with nothing applied yet (see report).
type proxyHealth struct {
	timeout  time.Duration
	now      func() time.Time
	answered func(withNode bool, code int) // counts answers; may be nil
	// families are the IP families the report's status names, and the
	// sync metrics' ip_family label too: one sync serves them all, so they
	// share its health (kube-proxy runs a proxier, with a health of its
	// own, per family).
	families []string

	started time.Time // when the proxy started

	mu           sync.Mutex // guards the fields below
	lastUpdated  time.Time  // the last sync that applied everything offered
	pendingSince time.Time  // when the oldest change not yet applied came; zero if none
	ineligible   string     // why this node should not take traffic; empty if it may
	syncSince    time.Time  // when the sync running now started; zero if none runs
}

func newProxyHealth(timeout time.Duration) *proxyHealth {
	return &proxyHealth{timeout: timeout, now: time.Now, families: []string{"IPv4", "IPv6"}, started: time.Now()}
}

// hostFamilies are the IP families this host can serve: IPv4, and IPv6
// unless the kernel has it off (no ::1 to bind).
func hostFamilies() []string {
	c, err := net.ListenPacket("udp6", "[::1]:0")
	if err != nil {
		return []string{"IPv4"}
	}
	c.Close()
	return []string{"IPv4", "IPv6"}
}

// queued records that a change arrived.
func (h *proxyHealth) queued() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.pendingSince.IsZero() {
		h.pendingSince = h.now()
	}
}

// updated records a sync that applied everything offered before started;
// newer, if true, says another change came while it ran, which then counts
// as waiting since started.
func (h *proxyHealth) updated(started time.Time, newer bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.lastUpdated = h.now()
	h.pendingSince = time.Time{}
	if newer {
		h.pendingSince = started
	}
}

// syncing records that a sync started at start and is running, or, with
// the zero time, that it has ended.
func (h *proxyHealth) syncing(start time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.syncSince = start
}

// setEligible records whether this node may take traffic from load
// balancers (why it may not, or "").
func (h *proxyHealth) setEligible(why string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if why != h.ineligible {
		if why != "" {
			klog.InfoS("This node should take no load-balancer traffic now: /healthz answers 503", "reason", why)
		} else if h.ineligible != "" {
			klog.InfoS("This node may take load-balancer traffic again: /healthz answers 200 while the proxy keeps up")
		}
	}
	h.ineligible = why
}

// healthy reports whether the proxy keeps up.
func (h *proxyHealth) healthy() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.healthyLocked(h.now())
}

func (h *proxyHealth) healthyLocked(now time.Time) bool {
	return h.pendingSince.IsZero() || now.Sub(h.pendingSince) <= h.timeout
}

// healthReport is the body of /healthz and /livez, in kube-proxy's shape.
type healthReport struct {
	// LastUpdated is when the proxy last applied everything it was told;
	// now in a 200 answer, as kube-proxy reports it for old clients.
	LastUpdated time.Time `json:"lastUpdated"`
	CurrentTime time.Time `json:"currentTime"`
	// NodeEligible is false when this node is going away (its Node is
	// missing, being deleted, or tainted for deletion by the cluster
	// autoscaler). Only /healthz has it.
	NodeEligible *bool `json:"nodeEligible,omitempty"`
	Healthy      bool  `json:"healthy"`
	// Status is the health of each IP family, in kube-proxy's shape,
	// with the time of the last sync that applied everything (whatever
	// the answer); as kube-proxy's, it is empty (left out) before the
	// first.
	Status map[string]familyHealth `json:"status,omitempty"`
	// Reason says, when the answer is 503, why.
	Reason string `json:"reason,omitempty"`
}

// familyHealth is one IP family's part of a healthReport.
type familyHealth struct {
	LastUpdated time.Time `json:"lastUpdated"`
	Healthy     bool      `json:"healthy"`
}

// report is the status of /healthz (withNode) or /livez.
func (h *proxyHealth) report(withNode bool) (healthReport, int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	now := h.now()
	r := healthReport{CurrentTime: now, LastUpdated: h.lastUpdated, Healthy: h.healthyLocked(now)}
	code := http.StatusOK
	switch {
	case withNode && h.lastUpdated.IsZero() && now.Sub(h.started) > h.timeout:
		// kube-proxy calls itself healthy until its first change: its
		// rules from before a restart go on serving meanwhile. Ours send
		// traffic to proxy ports nothing listens on yet, and the other
		// portals serve nothing at all, so a node whose source has not
		// delivered (an API server down while the proxy restarted) tells
		// load balancers to go elsewhere. /livez stays 200: a restart
		// would not help.
		r.Healthy, code = false, http.StatusServiceUnavailable
		switch {
		case !h.syncSince.IsZero():
			r.Reason = "nothing applied yet: the first sync has been running for " + roughly(now.Sub(h.syncSince)) + " and has not finished"
		case !h.pendingSince.IsZero():
			r.Reason = "nothing applied yet: the source delivered Services and EndpointSlices " + roughly(now.Sub(h.pendingSince)) +
				" ago, and they wait to be applied (see the sync errors in the log)"
		default:
			r.Reason = "nothing applied yet: the source has not delivered Services and EndpointSlices in the " +
				now.Sub(h.started).Round(time.Second).String() + " since the proxy started (see the log)"
		}
	case r.Healthy:
	default:
		code = http.StatusServiceUnavailable
		r.Reason = "a change has waited more than " + h.timeout.String() + " to be applied"
		if !h.syncSince.IsZero() && !h.syncSince.After(h.pendingSince.Add(h.timeout)) {
			// A sync that hangs (an iptables-restore waiting for the
			// xtables lock) logs no error: say it runs, as the log does
			// ("Sync still running").
			r.Reason += ": a sync has been running for " + roughly(now.Sub(h.syncSince)) + " and has not finished"
		} else {
			r.Reason += " (see the sync errors in the log)"
		}
	}
	if len(h.families) > 0 && !h.lastUpdated.IsZero() {
		r.Status = make(map[string]familyHealth, len(h.families))
		for _, f := range h.families {
			r.Status[f] = familyHealth{LastUpdated: h.lastUpdated, Healthy: r.Healthy}
		}
	}
	if withNode {
		eligible := h.ineligible == ""
		r.NodeEligible = &eligible
		if !eligible {
			code = http.StatusServiceUnavailable
			if r.Reason == "" {
				r.Reason = h.ineligible
			}
		}
	}
	if code == http.StatusOK {
		// As kube-proxy: old clients took lastUpdated for the last
		// periodic sync, so a 200 says now. Only the top level: each
		// family's says when it was really applied.
		r.LastUpdated = now
	}
	return r, code
}

// roughly is d rounded for people: to the second, or under a second to
// the millisecond.
func roughly(d time.Duration) string {
	if d < time.Second {
		return d.Round(time.Millisecond).String()
	}
	return d.Round(time.Second).String()
}

// ServeHTTP answers /healthz, which load balancers and node monitors ask
// (it fails while the node is going away), and /livez, for a liveness
// probe (it looks at the proxy only).
func (h *proxyHealth) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	var withNode bool
	switch req.URL.Path {
	case "/healthz":
		withNode = true
	case "/livez":
	default:
		http.NotFound(w, req)
		return
	}
	r, code := h.report(withNode)
	if h.answered != nil {
		h.answered(withNode, code)
	}
	body, _ := json.Marshal(r)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(code)
	_, _ = w.Write(body)
}

// What the health and metrics servers serve, for messages.
const (
	healthWhat  = "/healthz and /livez"
	metricsWhat = "/metrics"
)

// serveHealth serves h on addr until ctx is done (see serveHTTP); where
// names what set addr (the flag, or the --config file's field).
func serveHealth(ctx context.Context, where, addr string, ln net.Listener, h http.Handler, retry time.Duration) {
	serveHTTP(ctx, healthWhat, where, addr, ln, h, retry)
}

// listenHardFail opens addr (ip:port) for what, as serveHTTP would, for
// --bind-address-hard-fail (set by hardFail, the flag or the --config
// file's field): failing is a fatal start-up error, which names the
// address, what set it (where) and the setting.
func listenHardFail(what, where, addr, hardFail string) (net.Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("cannot serve %s on %s (%s): %w; %s is set, so this is fatal (%s)", what, addr, where, err, hardFail, freeAddressHint(where))
	}
	return ln, nil
}

// serveHTTP serves h on addr (ip:port) until ctx is done. As kube-proxy
// listens (netutils.MultiListen with "tcp"), 0.0.0.0 and [::] are each
// every address of both families, one dual-stack socket (IPv4 alone on a
// host with IPv6 off), and a specific address is that address alone. A
// port it cannot take is logged, naming where (the flag or the --config
// file's field that set addr), and tried again every retry,
// so what serves comes up once the port is free; the proxy serves traffic
// meanwhile. ln, if not nil, is addr already open (listenHardFail). The
// server is under the limits of what (limitsOf).
func serveHTTP(ctx context.Context, what, where, addr string, ln net.Listener, h http.Handler, retry time.Duration) {
	serveLimited(ctx, what, where, addr, ln, h, retry, limitsOf(what))
}

// serveLimited is serveHTTP under limits.
func serveLimited(ctx context.Context, what, where, addr string, ln net.Listener, h http.Handler, retry time.Duration, limits httpLimits) {
	var cl *connLimit
	if limits.maxConns > 0 {
		cl = newConnLimit(what, limits.maxConns)
	}
	srv := limits.server(h, cl)
	said := false
	for {
		var err error
		if ln == nil {
			ln, err = net.Listen("tcp", addr)
		}
		if err == nil {
			klog.InfoS("Serving "+what, listening(addr, ln, hostFamilies())...)
			stop := context.AfterFunc(ctx, func() {
				sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				defer cancel()
				_ = srv.Shutdown(sctx)
			})
			err = srv.Serve(newQuietListener(ln, what, nil))
			ln = nil
			stop()
			if errors.Is(err, http.ErrServerClosed) {
				return
			}
			klog.ErrorS(err, "Stopped serving "+what+"; starting again", "addr", addr)
		} else if !said {
			said = true
			klog.ErrorS(err, "Cannot serve "+what+" ("+freeAddressHint(where)+"); trying again meanwhile", "addr", addr, "retryEvery", retry)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(retry):
		}
	}
}

// freeAddressHint says what to do about an address that cannot be
// bound, set by where (Config.where): give a free one, or, a flag, none
// at all. In a --config file an empty address means kube-proxy's default,
// not off, so it is not offered there.
func freeAddressHint(where string) string {
	if strings.HasPrefix(where, "--config ") {
		return "set " + where + " to a free address"
	}
	return "set " + where + " to a free address, or to empty to turn it off"
}

// listening is the key-value pairs that tell where ln, listening on addr,
// serves: its address, and on a wildcard the families it takes (a
// dual-stack socket names itself [::] even when asked for 0.0.0.0, so addr
// keeps the host asked for). host are the families the host serves
// (hostFamilies): with IPv6 off (disable_ipv6), a [::] socket still
// binds, but takes IPv4 alone, as /healthz's status says.
func listening(addr string, ln net.Listener, host []string) []any {
	ta, ok := ln.Addr().(*net.TCPAddr)
	if !ok || !ta.IP.IsUnspecified() {
		return []any{"addr", ln.Addr().String()}
	}
	families := "IPv4"
	if ta.IP.To4() == nil && slices.Contains(host, "IPv6") {
		families = "IPv4,IPv6"
	}
	h, _, _ := net.SplitHostPort(addr)
	return []any{"addr", net.JoinHostPort(h, strconv.Itoa(ta.Port)), "families", families}
}
