package proxyserver

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/hashicorp/go-multierror"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/conntrack"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/internal/buildinfo"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/portal"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/source"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/state"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/userspace"
)

// LogVersion logs which build this is, as kube-proxy's first log line.
func LogVersion() {
	v := buildinfo.Info()
	klog.InfoS("Version info", "version", v.GitVersion, "gitCommit", v.GitCommit, "goVersion", v.GoVersion, "platform", v.Platform, "dataPlane", buildinfo.DataPlane)
}

// Run serves until ctx is done. It returns an error at once if the source
// cannot be read at start; later failures are logged and retried.
func Run(ctx context.Context, cfg *Config) error {
	if cfg.Cleanup {
		return cleanup(ctx, cfg)
	}
	if cfg.InitOnly {
		// kube-proxy's --init-only sets sysctls as root and exits, so the
		// proxy itself can run with fewer privileges; a userspace proxy
		// sets none. As kube-proxy's, which builds its API client first,
		// it fails as a start would without a source of services.
		node, err := nodeName(cfg.HostnameOverride)
		if err != nil {
			return err
		}
		if cfg.Manifests == "" {
			if _, err := clusterClient(cfg); err != nil {
				return err
			}
		} else {
			// A file a start would refuse fails this check too.
			src := &source.Manifests{Path: cfg.Manifests, Options: manifestOptions(cfg, node)}
			if err := src.Check(ctx); err != nil {
				return err // says "manifests:" itself
			}
		}
		klog.InfoS("Options are valid; --init-only: nothing needs privileged set-up in a userspace proxy, exiting")
		return nil
	}
	node, err := nodeName(cfg.HostnameOverride)
	if err != nil {
		return err
	}
	var healthLn, metricsLn net.Listener // open already: --bind-address-hard-fail
	if cfg.BindAddressHardFail {
		// As kube-proxy: a server that cannot listen ends the proxy, and
		// before it programs anything.
		hardFail := cfg.where("bind-address-hard-fail")
		if cfg.healthz != "" {
			if healthLn, err = listenHardFail(healthWhat, cfg.where("healthz-bind-address"), cfg.healthz, hardFail); err != nil {
				return err
			}
			defer healthLn.Close() // if not served; closing twice does no harm
		}
		if cfg.metrics != "" {
			if metricsLn, err = listenHardFail(metricsWhat, cfg.where("metrics-bind-address"), cfg.metrics, hardFail); err != nil {
				return err
			}
			defer metricsLn.Close()
		}
	}
	if cfg.ConfigFile != "" && cfg.fileData != nil {
		// As kube-proxy: a changed --config file ends the proxy, with an
		// error, so its DaemonSet runs it again with the new content.
		var stop context.CancelCauseFunc
		ctx, stop = context.WithCancelCause(ctx)
		var watchers sync.WaitGroup
		defer watchers.Wait()
		watches := []*configWatch{{Path: cfg.ConfigFile, Loaded: cfg.fileData, Same: sameYAML}}
		if cfg.kubeconfigData != nil {
			// The file's clientConnection.kubeconfig, which client-go
			// reads once: in a ConfigMap beside the file, an edit of it
			// (its server address, say) leaves the file as it was.
			watches = append(watches, &configWatch{Path: cfg.Kubeconfig, What: "the kubeconfig the --config file names", Loaded: cfg.kubeconfigData, Same: sameYAML})
		}
		for _, w := range watches {
			watchers.Go(func() {
				if err := w.run(ctx); err != nil {
					klog.InfoS("Stopping: "+w.what()+" changed", "reason", err.Error())
					stop(err)
				}
			})
		}
		defer stop(nil) // runs before watchers.Wait
	}
	if cfg.nodePortsPrimary {
		var fromNode []netip.Addr
		cfg.nodePorts, fromNode = primaryNodePortCIDRs(ctx, cfg, node)
		if ctx.Err() != nil {
			klog.InfoS("Stopping before start-up finished, while reading this node's primary IPs for --nodeport-addresses=primary", "reason", context.Cause(ctx))
			if err := context.Cause(ctx); errors.Is(err, errConfigChanged) {
				return err
			}
			return nil
		}
		if fromNode != nil {
			// As kube-proxy: the Node's primary IPs changing ends the
			// proxy, with an error, so its DaemonSet runs it again to
			// serve node ports on the new ones.
			var stop context.CancelCauseFunc
			ctx, stop = context.WithCancelCause(ctx)
			var watchers sync.WaitGroup
			defer watchers.Wait()
			watchers.Go(func() {
				if err := watchPrimaryIPs(ctx, cfg, node, fromNode); err != nil {
					klog.InfoS("NodeIPs changed for the node; stopping", "node", node, "reason", err.Error())
					stop(err)
				}
			})
			defer stop(nil) // runs before watchers.Wait
		}
	}
	dnat := newDNATTargets(cfg.bindAddr)
	pt, mode, err := choosePortal(ctx, cfg, dnat.target)
	if err != nil {
		return err
	}
	switch {
	case mode == PortalNone:
		if err := checkBindAddress(ctx, cfg.bindAddr, cfg.where("bind-address")); err != nil {
			return err
		}
	case mode == PortalIPTables && cfg.bindAddr.IsLoopback():
		// Proxy ports listen on every address, where REDIRECT delivers
		// (the portal's filter rules keep direct traffic to them out); a
		// DNAT to loopback would drop what comes from other hosts.
		klog.InfoS("The bind address is ignored with the iptables portal: a loopback address cannot take traffic from other hosts; proxy ports listen on every address", "bindAddress", cfg.bindAddr, "setBy", cfg.where("bind-address"))
	case mode == PortalIPTables && !cfg.bindAddr.IsUnspecified():
		// As in the legacy proxier, the portal DNATs to the bind address;
		// proxy ports still listen on every address.
		if err := checkBindAddress(ctx, cfg.bindAddr, cfg.where("bind-address")); err != nil {
			return err
		}
	}
	removeOtherPortal(ctx, mode, cfg)
	nodePortAddrs := "all"
	if len(cfg.nodePorts) > 0 {
		nodePortAddrs = fmt.Sprint(cfg.nodePorts)
	}
	klog.InfoS("Starting kube-userspace-proxy", "node", node, "portal", mode, "manifests", cfg.Manifests,
		"bindAddress", cfg.BindAddress, "proxyPortRange", cmp.Or(cfg.portRange.String(), "kernel-chosen"), "nodePortAddresses", nodePortAddrs)
	if !cfg.LocalhostNodePorts {
		for _, pfx := range cfg.nodePorts {
			if pfx.Addr().IsLoopback() {
				klog.InfoS("--nodeport-addresses includes loopback addresses, where --iptables-localhost-nodeports=false serves no node ports", "cidr", pfx, "setBy", cfg.where("iptables-localhost-nodeports"))
			}
		}
	}
	if ignored := cfg.ignoredKubeProxyFlags(); len(ignored) > 0 {
		klog.InfoS("Flags of kube-proxy that a userspace proxy has no use for are ignored", "flags", ignored)
	}

	pcfg := cfg.proxierConfig(mode)
	if na, ok := pt.(interface {
		NodeAddrs() (map[netip.Addr]bool, error)
	}); ok && mode == PortalBind {
		pcfg.NodeAddrs = na.NodeAddrs
	}
	if u, ok := pt.(interface{ Unserved() map[netip.Addr]bool }); ok && mode == PortalBind {
		pcfg.UnservedFrontends = u.Unserved
	}
	var previous []portal.Portal
	var previousTargets map[portal.Family][]netip.Addr
	if ipt, ok := pt.(*portal.IPTables); ok {
		// Keep the proxy ports a previous run's rules point at: the rules
		// keep working through the restart, and the first sync rewrites
		// them unchanged.
		if previous, previousTargets, err = ipt.ExistingTargets(ctx); err != nil {
			klog.ErrorS(err, "Could not read the portals a previous run left; taking new proxy ports")
		}
		pcfg.PreferredProxyPort = preferredPorts(previous)
		// Until the first sync rewrites them, those rules send each
		// Service's traffic to its old proxy port: no other service port
		// may listen there meanwhile, and none may take a port another
		// gives up before the rules stop pointing at it.
		pcfg.HoldReleasedPorts = true
		pcfg.PreviousProxyPorts = make(map[uint16]state.ServicePortName)
		for _, pp := range previous {
			pcfg.PreviousProxyPorts[pp.ProxyPort] = pp.Service
		}
	}
	p := userspace.New(pcfg)
	defer p.Close()
	ks := &kernelSync{pt: pt, last: previous, heldTargets: previousTargets, minPeriod: cfg.MinSyncPeriod, resync: cfg.SyncPeriod}
	if mode == PortalBind {
		// Listeners bind to the service addresses, so adding them cannot
		// wait for the rate limit meant for iptables-restore; an address
		// is one netlink message.
		ks.minPeriod = 0
	}
	if mode == PortalIPTables {
		ks.dnat = dnat
		// REDIRECTed UDP flows live in conntrack; clear them when their
		// portal goes or moves to another proxy port.
		if ks.ct, err = conntrack.New(); err != nil {
			klog.ErrorS(err, "Conntrack cleanup unavailable; UDP clients may keep a removed mapping until it times out")
			ks.ct = nil
		}
	}
	rep := &listenerReport{}
	// kube-proxy's rule: unhealthy once a change waits twice the resync
	// period.
	health := newProxyHealth(2 * cfg.SyncPeriod)
	// /healthz's status and the sync metrics name the same families.
	health.families = hostFamilies()
	m := newMetrics(p.Stats(), health.families)
	health.answered = m.answered
	dv := &debugView{p: p, mode: mode, pods: cfg.podCIDRs}
	if mode == PortalIPTables {
		dv.dnat = dnat.target
		dv.portals = func(s state.Snapshot) []portal.Portal { return redirectPortals(s, p) }
	}
	m.debug = dv
	if m.configz, err = cfg.configzBody(logVerbosity()); err != nil {
		klog.ErrorS(err, "No /configz: the configuration cannot be written as JSON")
	}
	hc := &healthChecks{nodePortAddresses: pcfg.NodePortAddresses, localAddrs: userspace.NodeAddrs, proxyHealthy: health.healthy,
		countListener: p.CountListener, refused: p.NodePortAddrRefused}
	defer hc.closeAll()
	loop := newSyncLoop(func(s state.Snapshot) error {
		var errs []error
		if mode == PortalBind {
			// Addresses first: listeners bind to them. Connections to
			// those about to go are reset while a reset can still leave.
			p.ResetConnectionsLeaving(s)
			errs = append(errs, ks.sync(ctx, portal.FromSnapshot(s, nil, nil)))
		}
		errs = append(errs, p.Apply(s))
		if mode == PortalIPTables {
			errs = append(errs, syncRedirects(ctx, ks, p, s))
		}
		rep.report(p.Listeners())
		errs = append(errs, hc.sync(s))
		err := joinErrors(errs...)
		shown := err
		if errors.As(err, new(errDeferred)) {
			shown = nil // a rate limit is no failure
		}
		dv.applied(s, shown)
		return err
	}, cfg.MinSyncPeriod, cfg.SyncPeriod)
	loop.health, loop.metrics = health, m

	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		loop.run(ctx)
	}()
	if cfg.healthz != "" {
		wg.Go(func() {
			serveHealth(ctx, cfg.where("healthz-bind-address"), cfg.healthz, healthLn, health, 10*time.Second)
		})
	}
	if cfg.metrics != "" {
		wg.Go(func() {
			serveMetrics(ctx, cfg.where("metrics-bind-address"), cfg.metrics, metricsLn, m, 10*time.Second)
		})
	}
	defer func() {
		cancel()
		wg.Wait()
	}()
	// Node ports (and health-check node ports) listen on the local
	// addresses --nodeport-addresses selects, the iptables portal may DNAT
	// to a node address when interfaces without one carry routes (see
	// dnatTargets), and the sources ignore endpoints at this host's
	// addresses with a node port (Options.HostAddrs): follow the host's
	// addresses, and for the portal its routes, as they come and go.
	hostChanged := make(chan struct{}, 1)
	followPorts := len(pcfg.NodePortAddresses) > 0 || mode == PortalIPTables
	changed := func(addrs bool) {
		if followPorts {
			dnat.changed()
			loop.poke()
		} else if addrs && portalStale(pt) {
			// IPv6 turned back on (the kernel gives the interfaces
			// their addresses again), or off: the bind portal's
			// addresses of that family are added, or skipped, now.
			loop.poke()
		}
		if addrs {
			select {
			case hostChanged <- struct{}{}:
			default:
			}
		}
	}
	if err := watchAddresses(ctx, mode == PortalIPTables, changed); err != nil {
		klog.ErrorS(err, "New node addresses will be served from the next resync")
	}

	if cfg.Manifests != "" {
		src := &source.Manifests{
			Path:        cfg.Manifests,
			Options:     manifestOptions(cfg, node),
			Status:      dv.sourceRead,
			HostChanged: hostChanged,
		}
		if err := src.Run(ctx, loop.offer); err != nil {
			return err // says "manifests:" itself
		}
	} else {
		client, err := clusterClient(cfg)
		if err != nil {
			return err
		}
		dv.cluster = true
		src := &source.Cluster{Client: client, NodeName: node, ConfigSyncPeriod: cfg.ConfigSyncPeriod, NodeGoingAway: health.setEligible, Ignored: dv.clusterRead,
			HostChanged: hostChanged, Options: source.Options{HostAddrs: userspace.HostAddrs, NodePortAddresses: cfg.nodePorts}}
		if err := src.Run(ctx, loop.offer); err != nil {
			return fmt.Errorf("cluster: %w", err)
		}
	}
	st := p.Stats()
	klog.InfoS("Shutting down; open connections and sessions are closed", "tcpConnections", st.TCPActive.Load(),
		"udpSessions", st.UDPSessionsActive.Load(), "sctpAssociations", st.SCTPActive.Load())
	if err := context.Cause(ctx); errors.Is(err, errConfigChanged) || errors.Is(err, errNodeIPsChanged) {
		return err
	}
	return nil
}

// clusterClient builds the API client of the cluster the options name
// (without contacting it): without a kubeconfig or --master, the
// in-cluster configuration, whose absence means no source of services at
// all.
func clusterClient(cfg *Config) (kubernetes.Interface, error) {
	client, err := source.NewClient(cfg.Kubeconfig, cfg.Master, cfg.KubeAPIQPS, cfg.KubeAPIBurst, cfg.KubeAPIContentType, cfg.KubeAPIAcceptContentTypes)
	if err != nil && cfg.Kubeconfig == "" && cfg.Master == "" {
		return nil, fmt.Errorf("no source of services: give --manifests FILE or --kubeconfig/--master, or run inside a cluster (%w)", err)
	}
	if err != nil {
		return nil, fmt.Errorf("connect to the cluster: %w", err)
	}
	return client, nil
}

// redirectPortals lists the portals of s pointing at p's proxy ports: node
// ports, external IPs and load-balancer IPs go to the external proxy port,
// which differs from the proxy port when a Local traffic policy gives
// external traffic other endpoints.
func redirectPortals(s state.Snapshot, p *userspace.Proxier) []portal.Portal {
	// The host's addresses decide whether a load-balancer IP with source
	// ranges may be the source of the node's own traffic to it: the ones
	// the data plane read at its Apply, so both agree (and a failed read
	// keeps the last list, for both).
	ps := portal.FromSnapshot(s, p.ProxyPort, p.HostAddrs())
	for i := range ps {
		if ps[i].Kind != portal.ClusterIP {
			ps[i].ProxyPort = p.ExternalProxyPort(ps[i].Service)
		}
	}
	return ps
}

// syncRedirects has the iptables portal redirect to the proxy ports of
// p's last Apply of s, and then tells p: rules after listeners, as they
// point at the proxy ports, and the proxy-port sockets Apply gave up
// close only once the rules no longer send clients there (and their UDP
// conntrack entries are gone), so an edit that moves a Service to
// another proxy port (a renamed port, externalTrafficPolicy Local to
// Cluster) refuses no client, as kube-proxy's one iptables-restore
// refuses none. A sync the rate limit defers, or one that fails, keeps
// them open: the rules of the last sync that worked still redirect to
// them.
func syncRedirects(ctx context.Context, ks *kernelSync, p *userspace.Proxier, s state.Snapshot) error {
	err := ks.sync(ctx, redirectPortals(s, p))
	if err == nil && p.PortalSynced() {
		// A service port waits for a proxy port the rules pointed at
		// another until now: come back at once.
		err = errDeferred{}
	}
	return err
}

// preferredPorts maps the portals of a previous run to the proxy ports
// each service port used. A Local traffic policy splits them: NodePort
// portals, and those to the Service's external and load-balancer IPs,
// give the external port; those to its cluster IPs the internal one
// (without the split, any portal gives the one port). The
// rules do not say which kind of frontend an address was (every address
// portal is read back as ClusterIP), so the service port's addresses now
// tell; an address it no longer has counts as a cluster IP when it is
// not one of its external addresses.
func preferredPorts(previous []portal.Portal) func(*state.ServicePort, bool) uint16 {
	byService := map[state.ServicePortName][]portal.Portal{}
	for _, pp := range previous {
		byService[pp.Service] = append(byService[pp.Service], pp)
	}
	return func(sp *state.ServicePort, ext bool) uint16 {
		external := func(ip netip.Addr) bool {
			return slices.Contains(sp.ExternalIPs, ip) || slices.Contains(sp.LoadBalancerIPs, ip)
		}
		var cluster, other, outside, nodePort uint16
		for _, pp := range byService[sp.Name] {
			switch {
			case pp.Kind == portal.NodePort:
				nodePort = cmp.Or(nodePort, pp.ProxyPort)
			case slices.Contains(sp.ClusterIPs, pp.IP):
				cluster = cmp.Or(cluster, pp.ProxyPort)
			case external(pp.IP):
				outside = cmp.Or(outside, pp.ProxyPort)
			default:
				other = cmp.Or(other, pp.ProxyPort)
			}
		}
		if ext {
			return cmp.Or(nodePort, outside)
		}
		if sp.InternalLocal == sp.ExternalLocal {
			return cmp.Or(cluster, other, outside, nodePort) // one port for all
		}
		return cmp.Or(cluster, other)
	}
}

// cleanup removes what every portal may have left, in both families.
func cleanup(ctx context.Context, cfg *Config) error {
	// Without the capability nothing could be read or removed, and "nothing
	// to clean up" would be a false all-clear.
	if err := portal.CheckNetAdmin(); err != nil {
		return fmt.Errorf("cleanup: %w", err)
	}
	var errs *multierror.Error
	if ipt, err := portal.NewIPTables(ctx, portal.IPTablesConfig{ForCleanup: true}); err != nil {
		klog.InfoS("No iptables to clean up", "reason", err.Error())
	} else {
		if err := ipt.Cleanup(ctx); err != nil {
			errs = multierror.Append(errs, err)
		}
		// The UDP flows those rules redirected keep their mapping
		// otherwise, whatever runs next.
		if err := clearRemovedUDP(ctx, ipt.Removed()); err != nil {
			errs = multierror.Append(errs, err)
		}
	}
	if b, err := portal.NewBind(ctx, portal.BindConfig{Interface: cfg.BindInterface}); err != nil {
		klog.InfoS("No addresses to clean up", "reason", err.Error())
	} else if err := b.Cleanup(ctx); err != nil {
		errs = multierror.Append(errs, err)
	}
	if err := errs.ErrorOrNil(); err != nil {
		return fmt.Errorf("cleanup: %w", err)
	}
	klog.InfoS("Cleanup done")
	return nil
}

// manifestOptions is how the --manifests source reads the file for this
// node, at start and for --init-only.
func manifestOptions(cfg *Config, node string) source.Options {
	return source.Options{
		NodeName:          node,
		AllowLoopback:     true, // the manifest's author owns this host
		AllowNoClusterIP:  true, // no cluster allocates ClusterIPs here
		HostAddrs:         userspace.HostAddrs,
		NodePortAddresses: cfg.nodePorts,
	}
}

func nodeName(override string) (string, error) {
	if name := strings.TrimSpace(override); name != "" { // Validate refused a blank one
		return strings.ToLower(name), nil
	}
	h, err := os.Hostname()
	if err != nil {
		return "", fmt.Errorf("find the node name: %w (set --hostname-override)", err)
	}
	if h = strings.TrimSpace(h); h == "" {
		return "", fmt.Errorf("find the node name: the host name is empty (set --hostname-override)")
	}
	return strings.ToLower(h), nil
}

// listenerReport logs where each service port can be reached whenever that
// changes, so a user knows where to send traffic.
type listenerReport struct {
	last []userspace.Listener
}

func (r *listenerReport) report(now []userspace.Listener) {
	if slices.Equal(now, r.last) {
		return
	}
	old := make(map[userspace.Listener]bool, len(r.last))
	for _, l := range r.last {
		old[l] = true
	}
	cur := make(map[userspace.Listener]bool, len(now))
	for _, l := range now {
		cur[l] = true
		if !old[l] {
			klog.InfoS("Serving", "service", l.Service, "addr", l.Addr, "via", l.Role)
		}
	}
	for _, l := range r.last {
		if !cur[l] {
			klog.InfoS("Stopped serving", "service", l.Service, "addr", l.Addr, "via", l.Role)
		}
	}
	r.last = now
}

// checkBindAddress fails when --bind-address is an address this host does
// not have. Every proxy port would fail to open, and the sync would retry
// them for ever; saying so once, at start, is clearer. An IPv6 address
// still in duplicate address detection (tentative, as at boot or right
// after it was configured) is waited for, up to dadWait, as node-port
// addresses are (they are served once DAD succeeds).
func checkBindAddress(ctx context.Context, addr netip.Addr, where string) error {
	if addr.IsUnspecified() {
		return nil
	}
	deadline := time.Now().Add(dadWait)
	for said := false; ; said = true {
		l, err := net.Listen("tcp", netip.AddrPortFrom(addr, 0).String())
		if err == nil {
			if said {
				klog.InfoS("The bind address passed duplicate address detection", "bindAddress", addr)
			}
			return l.Close()
		}
		if !errors.Is(err, syscall.EADDRNOTAVAIL) {
			return fmt.Errorf("%s %s: %w", where, addr, err)
		}
		switch tentative, failed := addrDAD(addr); {
		case failed:
			return fmt.Errorf("%s %s failed IPv6 duplicate address detection (another host on its link has it), so no proxy port can listen on it", where, addr)
		case !tentative:
			return fmt.Errorf("%s %s is not an address of this host, so no proxy port can listen on it", where, addr)
		case time.Now().After(deadline):
			return fmt.Errorf("%s %s is still tentative: its IPv6 duplicate address detection has not ended after %v, and until it does no proxy port can listen on it", where, addr, dadWait)
		case !said:
			klog.InfoS("The bind address is tentative (IPv6 duplicate address detection runs); waiting for it", "bindAddress", addr, "setBy", where, "timeout", dadWait)
		}
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// dadWait bounds how long checkBindAddress waits for a tentative bind
// address: the kernel's DAD takes dad_transmits (1) retransmission
// timers (1 s) after a random delay of up to a second.
const dadWait = 10 * time.Second

// logVerbosity is klog's -v, as far as this file's calls see it.
func logVerbosity() int {
	v := 0
	for n := 1; n <= 10; n++ {
		if klog.V(klog.Level(n)).Enabled() {
			v = n
		}
	}
	return v
}
