package proxyserver

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"

	"k8s.io/klog/v2"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/source"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/state"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/userspace"
)

// Run serves until ctx is done. It returns an error at once if the source
// cannot be read at start; later failures are logged and retried.
func Run(ctx context.Context, cfg *Config) error {
	node, err := nodeName(cfg.HostnameOverride)
	if err != nil {
		return err
	}
	if cfg.Portal == PortalAuto {
		klog.InfoS("Portal chosen", "portal", PortalNone, "reason", "only the none portal is built so far: clients use the proxy ports and node ports directly")
	}
	klog.InfoS("Starting kube-userspace-proxy", "node", node, "manifests", cfg.Manifests,
		"bindAddress", cfg.BindAddress, "proxyPortRange", cfg.ProxyPortRange, "nodePortAddresses", cfg.NodePortAddresses)

	p := userspace.New(cfg.proxierConfig())
	defer p.Close()
	rep := &listenerReport{}
	loop := newSyncLoop(func(s state.Snapshot) error {
		err := p.Apply(s)
		rep.report(p.Listeners())
		return err
	}, cfg.MinSyncPeriod, cfg.SyncPeriod)

	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		loop.run(ctx)
	}()
	defer func() {
		cancel()
		wg.Wait()
	}()

	src := &source.Manifests{
		Path: cfg.Manifests,
		Options: source.Options{
			NodeName:         node,
			AllowLoopback:    true, // the manifest's author owns this host
			AllowNoClusterIP: true, // no cluster allocates ClusterIPs here
		},
	}
	if err := src.Run(ctx, loop.offer); err != nil {
		return fmt.Errorf("manifests: %w", err)
	}
	klog.InfoS("Shutting down")
	return nil
}

func nodeName(override string) (string, error) {
	if override != "" {
		return strings.ToLower(strings.TrimSpace(override)), nil
	}
	h, err := os.Hostname()
	if err != nil {
		return "", fmt.Errorf("find the node name: %w (set --hostname-override)", err)
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
