package proxyserver

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/userspace"
)

// Portal modes accepted by --portal.
const (
	PortalAuto = "auto"
	PortalNone = "none"
)

// Config is every option of the proxy, as flags set it. Validate fills the
// parsed fields.
type Config struct {
	// Manifests is a file of Service and EndpointSlice manifests to serve.
	Manifests string
	// Portal selects the kernel redirection: auto or none.
	Portal string
	// BindAddress is where proxy ports listen (kube-proxy's legacy
	// userspace meaning of --bind-address).
	BindAddress string
	// ProxyPortRange is the --proxy-port-range text; empty lets the kernel
	// choose.
	ProxyPortRange string
	// NodePortAddresses are CIDRs of the node addresses NodePorts are
	// served on; empty means all.
	NodePortAddresses []string
	// HostnameOverride names this node; empty means the host name.
	HostnameOverride string

	UDPIdleTimeout      time.Duration
	UDPReplyTimeout     time.Duration
	UDPMaxSessions      int
	TCPHalfCloseTimeout time.Duration
	// MinSyncPeriod is the least time between two syncs of kernel state;
	// SyncPeriod is the longest time between two full resyncs.
	MinSyncPeriod time.Duration
	SyncPeriod    time.Duration

	// Parsed by Validate.
	bindAddr  netip.Addr
	portRange userspace.PortRange
	nodePorts []netip.Prefix
}

// NewConfig returns a Config with the defaults of the flags.
func NewConfig() *Config {
	return &Config{
		Portal:              PortalAuto,
		BindAddress:         "0.0.0.0",
		UDPIdleTimeout:      userspace.DefaultUDPIdleTimeout,
		UDPReplyTimeout:     userspace.DefaultUDPReplyTimeout,
		UDPMaxSessions:      userspace.DefaultUDPMaxSessions,
		TCPHalfCloseTimeout: userspace.DefaultTCPHalfCloseTimeout,
		MinSyncPeriod:       time.Second,
		SyncPeriod:          30 * time.Second,
	}
}

// AddFlags registers the proxy's flags, with kube-proxy's names where
// kube-proxy has them.
func (c *Config) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&c.Manifests, "manifests", c.Manifests, "Serve the Services and EndpointSlices in this YAML or JSON file (what 'kubectl apply -f' takes) instead of a cluster's. The file is watched: edits apply within a second, and a broken edit is reported while the last good state keeps serving.")
	fs.StringVar(&c.Portal, "portal", c.Portal, "How service traffic reaches the proxy: 'none' (clients use the proxy ports and node ports directly) or 'auto' (the best this host supports; today that is none).")
	fs.StringVar(&c.BindAddress, "bind-address", c.BindAddress, "The IP address proxy ports listen on; 0.0.0.0 or :: listen on every address of each IP family a service uses.")
	fs.StringVar(&c.ProxyPortRange, "proxy-port-range", c.ProxyPortRange, "Host ports for proxy ports: 'begin-end', 'begin+offset' or a single port. Empty, 0 or 0-0 lets the kernel choose.")
	fs.StringSliceVar(&c.NodePortAddresses, "nodeport-addresses", c.NodePortAddresses, "Comma-separated CIDRs of the node addresses that serve NodePorts, e.g. 127.0.0.0/8,10.0.0.0/8. Empty means every address.")
	fs.StringVar(&c.HostnameOverride, "hostname-override", c.HostnameOverride, "The name of this node, to tell its endpoints from others'. Empty means the host name.")
	fs.DurationVar(&c.UDPIdleTimeout, "udp-timeout", c.UDPIdleTimeout, "How long an idle UDP session is kept once its endpoint has answered (must be > 0).")
	fs.DurationVar(&c.UDPReplyTimeout, "udp-reply-timeout", c.UDPReplyTimeout, "How long a UDP session waits for the answer to a client's datagram, when longer than --udp-timeout, so slow replies are not lost.")
	fs.IntVar(&c.UDPMaxSessions, "udp-max-sessions", c.UDPMaxSessions, "The most UDP sessions one service port keeps at once; -1 means no limit.")
	fs.DurationVar(&c.TCPHalfCloseTimeout, "tcp-half-close-timeout", c.TCPHalfCloseTimeout, "How long a TCP connection stays open after one side has finished sending while the other side is silent.")
	fs.DurationVar(&c.MinSyncPeriod, "iptables-min-sync-period", c.MinSyncPeriod, "The least time between two syncs of kernel state (e.g. '1s').")
	fs.DurationVar(&c.SyncPeriod, "iptables-sync-period", c.SyncPeriod, "The longest time between two full resyncs (e.g. '30s'); must be greater than 0.")
}

// Validate checks every option and parses the ones that need it. The
// error names each bad flag.
func (c *Config) Validate() error {
	var errs []error
	bad := func(flag, format string, args ...any) {
		errs = append(errs, fmt.Errorf("--%s: %s", flag, fmt.Sprintf(format, args...)))
	}
	if c.Manifests == "" {
		errs = append(errs, errors.New("no source of services: give --manifests FILE (following a cluster is not built yet)"))
	}
	switch c.Portal {
	case PortalAuto, PortalNone:
	default:
		bad("portal", "%q is not a portal mode (want auto or none)", c.Portal)
	}
	var err error
	if c.bindAddr, err = netip.ParseAddr(strings.TrimSpace(c.BindAddress)); err != nil {
		bad("bind-address", "%q is not an IP address", c.BindAddress)
	}
	if c.portRange, err = userspace.ParsePortRange(c.ProxyPortRange); err != nil {
		bad("proxy-port-range", "%v", err)
	}
	c.nodePorts = nil
	for _, s := range c.NodePortAddresses {
		s = strings.TrimSpace(s)
		if s == "" {
			continue
		}
		pfx, err := netip.ParsePrefix(s)
		if err != nil {
			bad("nodeport-addresses", "%q is not a CIDR (e.g. 127.0.0.1/32)", s)
			continue
		}
		c.nodePorts = append(c.nodePorts, pfx.Masked())
	}
	if c.UDPIdleTimeout <= 0 {
		bad("udp-timeout", "must be greater than 0, got %v", c.UDPIdleTimeout)
	}
	if c.UDPReplyTimeout <= 0 {
		bad("udp-reply-timeout", "must be greater than 0, got %v", c.UDPReplyTimeout)
	}
	if c.UDPMaxSessions == 0 || c.UDPMaxSessions < -1 {
		bad("udp-max-sessions", "must be a positive number or -1, got %d", c.UDPMaxSessions)
	}
	if c.TCPHalfCloseTimeout <= 0 {
		bad("tcp-half-close-timeout", "must be greater than 0, got %v", c.TCPHalfCloseTimeout)
	}
	if c.MinSyncPeriod < 0 {
		bad("iptables-min-sync-period", "must not be negative, got %v", c.MinSyncPeriod)
	}
	if c.SyncPeriod <= 0 {
		bad("iptables-sync-period", "must be greater than 0, got %v", c.SyncPeriod)
	}
	return errors.Join(errs...)
}

// proxierConfig turns the options into the data plane's Config.
func (c *Config) proxierConfig() userspace.Config {
	return userspace.Config{
		BindAddress:         c.bindAddr,
		PortRange:           c.portRange,
		ServeNodePorts:      true, // portal none: nothing redirects node ports
		NodePortAddresses:   c.nodePorts,
		UDPIdleTimeout:      c.UDPIdleTimeout,
		UDPReplyTimeout:     c.UDPReplyTimeout,
		UDPMaxSessions:      c.UDPMaxSessions,
		TCPHalfCloseTimeout: c.TCPHalfCloseTimeout,
	}
}
