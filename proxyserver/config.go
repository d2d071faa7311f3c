package proxyserver

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/spf13/pflag"
	netutils "k8s.io/utils/net"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/state"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/userspace"
)

// Portal modes accepted by --portal.
const (
	PortalAuto     = "auto"
	PortalIPTables = "iptables"
	PortalBind     = "bind"
	PortalNone     = "none"
)

// Content types the API client may ask for.
const (
	contentTypeProtobuf = "application/vnd.kubernetes.protobuf"
	contentTypeJSON     = "application/json"
)

// Config is every option of the proxy, as flags set it. Validate fills the
// parsed fields.
type Config struct {
	// ConfigFile is a KubeProxyConfiguration file (--config); see
	// LoadConfigFile.
	ConfigFile string
	// WriteConfigTo is where to write the KubeProxyConfiguration the
	// options amount to, instead of running (see WriteConfigFile).
	WriteConfigTo string
	// ProxyMode is kube-proxy's --proxy-mode: userspace, or empty.
	ProxyMode string
	// LogVerbosity is the file's logging.verbosity, when the command line
	// gave no -v; nil otherwise. The caller applies it to klog.
	LogVerbosity *int
	// LogVModule is --vmodule's value (pattern=N,...) as LoadConfigFile
	// sets it: the command line's, or else the file's logging.vmodule;
	// "" for none. The caller applies it to klog.
	LogVModule string
	// Manifests is a file of Service and EndpointSlice manifests to serve.
	// If empty, the proxy follows a cluster.
	Manifests string
	// Kubeconfig and Master reach the cluster; both empty means the
	// in-cluster configuration.
	Kubeconfig string
	Master     string
	// KubeAPIQPS, KubeAPIBurst and KubeAPIContentType tune the API client.
	KubeAPIQPS         float32
	KubeAPIBurst       int
	KubeAPIContentType string
	// KubeAPIAcceptContentTypes is the --config file's
	// clientConnection.acceptContentTypes: the Accept header of the API
	// client's requests (e.g. "application/json"), as kube-proxy sets it.
	// kube-proxy has no flag for it. If empty, client-go's: the content
	// type, with JSON as a fallback.
	KubeAPIAcceptContentTypes string
	// ConfigSyncPeriod is how often the informers redeliver every object.
	ConfigSyncPeriod time.Duration
	// Portal selects the kernel redirection: auto, iptables, bind or none.
	Portal string
	// BindInterface is the interface the bind portal adds service
	// addresses to; empty means a dummy interface of its own.
	BindInterface string
	// Cleanup removes every rule, chain and address the proxy owns, then
	// exits.
	Cleanup bool
	// InitOnly is kube-proxy's --init-only: do the privileged set-up, then
	// exit. A userspace proxy has none to do, so Run returns at once once
	// the options are valid and name a source of services, as a start
	// would find them (a hardened DaemonSet runs it as an init
	// container).
	InitOnly bool
	// BindAddress is where proxy ports listen (kube-proxy's legacy
	// userspace meaning of --bind-address).
	BindAddress string
	// ProxyPortRange is the --proxy-port-range text; empty lets the kernel
	// choose.
	ProxyPortRange string
	// NodePortAddresses are CIDRs of the node addresses NodePorts are
	// served on, per IP family: empty means all, and a family none of
	// them is in (or with a zero CIDR) serves them on all its addresses.
	NodePortAddresses []string
	// LocalhostNodePorts serves node ports on loopback addresses
	// (127.0.0.0/8, ::1) to this host's own traffic, when
	// NodePortAddresses holds them (kube-proxy's
	// --iptables-localhost-nodeports). If false, they are served on no
	// loopback address. Traffic from other hosts never reaches them there.
	LocalhostNodePorts bool
	// HostnameOverride names this node; empty means the host name.
	// LoadConfigFile trims it and makes it lower case, as kube-proxy
	// does.
	HostnameOverride string
	// ClusterCIDR is the pods' CIDRs, comma-separated (one per IP family):
	// their traffic to a Service with externalTrafficPolicy: Local is not
	// external. Empty means only this host's traffic is told apart.
	ClusterCIDR string

	UDPIdleTimeout      time.Duration
	UDPReplyTimeout     time.Duration
	UDPMaxSessions      int
	TCPHalfCloseTimeout time.Duration
	// MinSyncPeriod is the least time between two syncs of kernel state;
	// SyncPeriod is the longest time between two full resyncs.
	MinSyncPeriod time.Duration
	SyncPeriod    time.Duration
	// HealthzBindAddress is where /healthz and /livez are served: "ip:port",
	// or an IP alone for port 10256. Empty turns them off.
	HealthzBindAddress string
	// MetricsBindAddress is where /metrics is served: "ip:port", or an IP
	// alone for port 10249. Empty turns it off.
	MetricsBindAddress string
	// BindAddressHardFail makes an address /healthz or /metrics cannot
	// listen on a fatal start-up error (kube-proxy's
	// --bind-address-hard-fail). If false, the proxy serves traffic and
	// tries the address again every 10s.
	BindAddressHardFail bool

	// Parsed by Validate.
	bindAddr  netip.Addr
	portRange userspace.PortRange
	nodePorts []netip.Prefix
	podCIDRs  []netip.Prefix
	fromFile  map[string]bool // flags whose value the --config file set
	fileData  []byte          // the --config file's content, as read
	// kubeconfigData is the Kubeconfig file's content, as LoadKubeconfig
	// read it, or nil.
	kubeconfigData []byte
	healthz        string         // HealthzBindAddress as host:port, or ""
	metrics        string         // MetricsBindAddress as host:port, or ""
	flags          *pflag.FlagSet // where AddFlags registered them, or nil

	// nodePortsPrimary: --nodeport-addresses=primary, the node's primary
	// IPs, which Run reads into nodePorts.
	nodePortsPrimary bool
}

// kube-proxy's health and metrics ports.
const (
	defaultHealthzPort = 10256
	defaultMetricsPort = 10249
)

// NewConfig returns a Config with the defaults of the flags.
func NewConfig() *Config {
	return &Config{
		Portal:              PortalAuto,
		KubeAPIQPS:          5,
		KubeAPIBurst:        10,
		KubeAPIContentType:  contentTypeProtobuf,
		ConfigSyncPeriod:    15 * time.Minute,
		BindAddress:         "0.0.0.0",
		UDPIdleTimeout:      userspace.DefaultUDPIdleTimeout,
		UDPReplyTimeout:     userspace.DefaultUDPReplyTimeout,
		UDPMaxSessions:      userspace.DefaultUDPMaxSessions,
		TCPHalfCloseTimeout: userspace.DefaultTCPHalfCloseTimeout,
		LocalhostNodePorts:  true,
		MinSyncPeriod:       time.Second,
		SyncPeriod:          30 * time.Second,
		HealthzBindAddress:  "0.0.0.0:10256",
		MetricsBindAddress:  "127.0.0.1:10249",
	}
}

// AddFlags registers the proxy's flags, with kube-proxy's names where
// kube-proxy has them.
func (c *Config) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&c.ConfigFile, "config", c.ConfigFile, "A KubeProxyConfiguration file (kubeproxy.config.k8s.io/v1alpha1), such as a kube-proxy DaemonSet's ConfigMap holds, with mode: userspace or no mode. It sets what kube-proxy's flags would (those flags are then ignored), except that a non-empty --hostname-override, -v and --vmodule given on the command line win; this proxy's own flags still apply.")
	fs.StringVar(&c.WriteConfigTo, "write-config-to", c.WriteConfigTo, "Write the KubeProxyConfiguration file that stands for the other options (what --config would read), then exit. Options it cannot hold are named, to be kept on the command line.")
	fs.StringVar(&c.Manifests, "manifests", c.Manifests, "Serve the Services and EndpointSlices in this YAML or JSON file (what 'kubectl apply -f' takes) instead of a cluster's. The file is watched: edits apply within a second, and a broken edit is reported while the last good state keeps serving.")
	fs.StringVar(&c.Kubeconfig, "kubeconfig", c.Kubeconfig, "Path to a kubeconfig file with the cluster and credentials. With --master empty too, the in-cluster configuration is used.")
	fs.StringVar(&c.Master, "master", c.Master, "The address of the Kubernetes API server (overrides the kubeconfig's).")
	fs.Float32Var(&c.KubeAPIQPS, "kube-api-qps", c.KubeAPIQPS, "Queries per second to the API server.")
	fs.IntVar(&c.KubeAPIBurst, "kube-api-burst", c.KubeAPIBurst, "Burst of queries to the API server.")
	fs.StringVar(&c.KubeAPIContentType, "kube-api-content-type", c.KubeAPIContentType, "Content type of requests to the API server: application/vnd.kubernetes.protobuf or application/json.")
	fs.DurationVar(&c.ConfigSyncPeriod, "config-sync-period", c.ConfigSyncPeriod, "How often the informers redeliver every Service and EndpointSlice (e.g. '15m'); redelivered objects cause no work.")
	fs.StringVar(&c.Portal, "portal", c.Portal, "How service traffic reaches the proxy: 'iptables' (nat REDIRECT rules to the proxy ports), 'bind' (no netfilter: service addresses are added to an interface and served directly), 'none' (clients use the proxy ports and node ports directly) or 'auto' (iptables when usable, else bind when addresses may be changed, else none).")
	fs.StringVar(&c.BindInterface, "bind-interface", c.BindInterface, "With --portal=bind: the interface service addresses are added to. Empty means a dummy interface the proxy creates (kube-ups0), or lo where the kernel has no dummy driver.")
	fs.BoolVar(&c.Cleanup, "cleanup", c.Cleanup, "Remove every iptables rule and chain and every service address the proxy owns, in both IP families, then exit.")
	fs.BoolVar(&c.InitOnly, "init-only", c.InitOnly, "As kube-proxy's: do the set-up that needs privileges, then exit. This proxy needs none, so it checks its options and its source of services as a start would (without contacting the API server), and exits 0 (for an init container).")
	fs.StringVar(&c.BindAddress, "bind-address", c.BindAddress, "The IP address proxy ports listen on; 0.0.0.0 or :: listen on every address of each IP family a service uses. With --portal=iptables proxy ports listen on every address, and the rules DNAT to this address (when it is one of this host's) instead of REDIRECTing.")
	fs.StringVar(&c.ProxyPortRange, "proxy-port-range", c.ProxyPortRange, "Host ports for proxy ports: 'begin-end', 'begin+offset' or a single port. Empty, 0 or 0-0 lets the kernel choose.")
	fs.StringSliceVar(&c.NodePortAddresses, "nodeport-addresses", c.NodePortAddresses, "Comma-separated CIDRs of the node addresses that serve NodePorts, e.g. 127.0.0.0/8,10.0.0.0/8, or 'primary' for the node's primary IPs (the Node's InternalIPs; with --manifests, the addresses of the default route's interface). Empty means every address; an IP family none of them is in serves NodePorts on every address of that family.")
	fs.BoolVar(&c.LocalhostNodePorts, "iptables-localhost-nodeports", c.LocalhostNodePorts, "Serve NodePorts on loopback addresses (127.0.0.1, ::1) to this host's own traffic, where --nodeport-addresses includes them. false: NodePorts are not served on loopback addresses at all. Traffic from other hosts never reaches them there.")
	fs.StringVar(&c.ClusterCIDR, "cluster-cidr", c.ClusterCIDR, "The pods' CIDRs, comma-separated for dual stack (e.g. 10.244.0.0/16,fd00:10:244::/56): traffic from a pod to a node port, external IP or load-balancer IP of a Service with externalTrafficPolicy: Local goes to all its endpoints, as kube-proxy routes it. Empty: only this host's own traffic is told apart.")
	fs.StringVar(&c.HostnameOverride, "hostname-override", c.HostnameOverride, "The name of this node, to tell its endpoints from others'. Empty means the host name.")
	fs.DurationVar(&c.UDPIdleTimeout, "udp-timeout", c.UDPIdleTimeout, "How long an idle UDP session is kept once its endpoint has answered (must be > 0).")
	fs.DurationVar(&c.UDPReplyTimeout, "udp-reply-timeout", c.UDPReplyTimeout, "How long a UDP session waits for the answer to a client's datagram, when longer than --udp-timeout, so slow replies are not lost.")
	fs.IntVar(&c.UDPMaxSessions, "udp-max-sessions", c.UDPMaxSessions, "The most UDP sessions one service port keeps at once; -1 means no limit.")
	fs.DurationVar(&c.TCPHalfCloseTimeout, "tcp-half-close-timeout", c.TCPHalfCloseTimeout, "How long a TCP connection stays open after one side has finished sending while the other side is silent.")
	fs.DurationVar(&c.MinSyncPeriod, "iptables-min-sync-period", c.MinSyncPeriod, "The least time between two syncs of kernel state (e.g. '1s').")
	fs.DurationVar(&c.SyncPeriod, "iptables-sync-period", c.SyncPeriod, "The longest time between two full resyncs (e.g. '30s'); must be greater than 0.")
	fs.StringVar(&c.HealthzBindAddress, "healthz-bind-address", c.HealthzBindAddress, "The IP address and port of /healthz and /livez; an unspecified address ('0.0.0.0' or '[::]') listens in both IP families, and an IP alone means port 10256. They answer 503 once a change has waited more than twice --iptables-sync-period because the portal cannot be programmed; /healthz also while this node's Node is going away. Empty turns them off.")
	fs.StringVar(&c.MetricsBindAddress, "metrics-bind-address", c.MetricsBindAddress, "The IP address and port of /metrics (Prometheus; kube-proxy's sync metrics and the data plane's counters), an unspecified address ('0.0.0.0:10249' or '[::]:10249') listens in both IP families, and an IP alone means port 10249. Empty turns it off.")
	fs.BoolVar(&c.BindAddressHardFail, "bind-address-hard-fail", c.BindAddressHardFail, "If true, an address --healthz-bind-address or --metrics-bind-address cannot listen on (in use, not this host's) is fatal: the proxy exits at start. If false, it serves traffic and tries the address again every 10s.")
	c.addKubeProxyFlags(fs)
}

// where names what set flag's value, for messages: the --config file's
// field when the file set it, else the flag.
func (c *Config) where(flag string) string {
	if field := configFileFields[flag]; c.fromFile[flag] && field != "" {
		return "--config " + c.ConfigFile + ": " + field
	}
	return "--" + flag
}

// Validate checks every option and parses the ones that need it. The
// error names each bad flag. It changes no option (the exported fields):
// what kube-proxy applies to them before it validates (the deprecated
// --healthz-port and --metrics-port, the host name's case) LoadConfigFile
// applies.
func (c *Config) Validate() error {
	var errs []error
	bad := func(flag, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s: %s", c.where(flag), fmt.Sprintf(format, args...)))
	}
	if c.ConfigFile == "" { // else the file's mode and detectLocalMode replace them
		if err := checkMode("--proxy-mode", c.ProxyMode); err != nil {
			errs = append(errs, err)
		}
		if err := c.checkDetectLocalModeFlag(); err != nil {
			errs = append(errs, err)
		}
	}
	switch c.Portal {
	case PortalAuto, PortalIPTables, PortalBind, PortalNone:
	default:
		bad("portal", "%q is not a portal mode (want auto, iptables, bind or none)", c.Portal)
	}
	switch {
	case c.Manifests != "" && c.ConfigFile != "" && c.Kubeconfig != "":
		errs = append(errs, errors.New("--manifests and the --config file's clientConnection.kubeconfig both name a source of services: give one"))
	case c.Manifests != "" && (c.Kubeconfig != "" || c.Master != ""):
		errs = append(errs, errors.New("--manifests and --kubeconfig/--master both name a source of services: give one"))
	}
	switch c.KubeAPIContentType {
	case contentTypeProtobuf, contentTypeJSON:
	default:
		bad("kube-api-content-type", "%q is not %s or %s", c.KubeAPIContentType, contentTypeProtobuf, contentTypeJSON)
	}
	if c.KubeAPIQPS < 0 {
		bad("kube-api-qps", "must not be negative, got %v", c.KubeAPIQPS)
	}
	if c.KubeAPIBurst < 0 {
		bad("kube-api-burst", "must not be negative, got %d", c.KubeAPIBurst)
	}
	if c.ConfigSyncPeriod < 0 {
		bad("config-sync-period", "must not be negative, got %v", c.ConfigSyncPeriod)
	}
	if c.HostnameOverride != "" && strings.TrimSpace(c.HostnameOverride) == "" {
		// kube-proxy trims it and refuses what is left empty: taken as
		// is, it would name a node no endpoint is ever on. (LoadConfigFile
		// trims and lower-cases one that is not blank.)
		bad("hostname-override", "%q is blank: give this node's name, or leave it out to use the host name", c.HostnameOverride)
	}
	var err error
	if c.bindAddr, err = netip.ParseAddr(strings.TrimSpace(c.BindAddress)); err != nil {
		bad("bind-address", "%q is not an IP address", c.BindAddress)
	}
	if c.portRange, err = userspace.ParsePortRange(c.ProxyPortRange); err != nil {
		bad("proxy-port-range", "%v", err)
	}
	// cidrs parses a list of CIDRs (blank entries skipped), masked, as
	// kube-proxy does (ParseCIDRSloppy: IPv4 parts with leading zeros,
	// 010.000.0.0/8, are decimal).
	cidrs := func(flag, example string, list []string) []netip.Prefix {
		var out []netip.Prefix
		for _, s := range list {
			if s = strings.TrimSpace(s); s == "" {
				continue
			}
			pfx, err := parseCIDRSloppy(s)
			if err != nil {
				bad(flag, "%q is not a CIDR (e.g. %s)", s, example)
				continue
			}
			out = append(out, pfx.Masked())
		}
		return out
	}
	// Per IP family, as kube-proxy reads them: a family none of the
	// CIDRs is in keeps its node ports on every address.
	c.nodePorts, c.nodePortsPrimary = nil, false
	if list := nonBlank(c.NodePortAddresses); slices.Contains(list, NodePortAddressesPrimary) {
		// kube-proxy's keyword for the node's primary IPs, which Run
		// reads (primaryNodePortCIDRs); it stands alone.
		if len(list) > 1 {
			bad("nodeport-addresses", "%q cannot be combined with CIDRs: give primary alone, or CIDRs", NodePortAddressesPrimary)
		}
		c.nodePortsPrimary = true
	} else {
		c.nodePorts = state.NodePortCIDRs(cidrs("nodeport-addresses", "127.0.0.1/32", c.NodePortAddresses))
	}
	c.podCIDRs = cidrs("cluster-cidr", "10.244.0.0/16", strings.Split(c.ClusterCIDR, ","))
	// As kube-proxy's validation: one CIDR, or a dual-stack pair; an
	// empty entry (10.0.0.0/8, or a,,b) is no CIDR.
	if entries := strings.Split(c.ClusterCIDR, ","); strings.TrimSpace(c.ClusterCIDR) != "" && slices.ContainsFunc(entries, func(e string) bool { return strings.TrimSpace(e) == "" }) {
		bad("cluster-cidr", "%q has an empty entry: give one CIDR, or two (one IPv4 and one IPv6) separated by a comma", c.ClusterCIDR)
	} else if n := len(entries); n > 2 {
		bad("cluster-cidr", "%q has %d CIDRs: give at most two, one IPv4 and one IPv6 (e.g. 10.244.0.0/16,fd00:10:244::/56)", c.ClusterCIDR, n)
	} else if len(c.podCIDRs) == 2 && c.podCIDRs[0].Addr().Is4() == c.podCIDRs[1].Addr().Is4() {
		bad("cluster-cidr", "%q is not a dual-stack pair: two CIDRs must be one IPv4 and one IPv6 (e.g. 10.244.0.0/16,fd00:10:244::/56)", c.ClusterCIDR)
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
	} else if c.MinSyncPeriod > c.SyncPeriod {
		// As kube-proxy: the resync could never come as often as asked.
		bad("iptables-sync-period", "must not be less than the minimum sync period (%v), got %v", c.MinSyncPeriod, c.SyncPeriod)
	}
	if c.healthz, err = serverAddr(c.HealthzBindAddress, defaultHealthzPort); err != nil {
		bad("healthz-bind-address", "%v", err)
	}
	if c.metrics, err = serverAddr(c.MetricsBindAddress, defaultMetricsPort); err != nil {
		bad("metrics-bind-address", "%v", err)
	}
	if c.healthz != "" && c.healthz == c.metrics {
		bad("metrics-bind-address", "%s is the health address too: give each server its own", c.metrics)
	}
	return errors.Join(errs...)
}

// parseCIDRSloppy parses a CIDR as kube-proxy does
// (k8s.io/utils/net.ParseCIDRSloppy), taking IPv4 parts with leading
// zeros as decimal, as Go did before 1.17.
func parseCIDRSloppy(s string) (netip.Prefix, error) {
	ip, ipnet, err := netutils.ParseCIDRSloppy(s)
	if err != nil {
		return netip.Prefix{}, err
	}
	a, ok := netip.AddrFromSlice(ip)
	if !ok {
		return netip.Prefix{}, fmt.Errorf("%q is not a CIDR", s)
	}
	if ip.To4() != nil {
		a = a.Unmap()
	}
	bits, _ := ipnet.Mask.Size()
	pfx := netip.PrefixFrom(a, bits)
	if !pfx.IsValid() {
		return netip.Prefix{}, fmt.Errorf("%q is not a CIDR", s)
	}
	return pfx, nil
}

// NodePortAddressesPrimary is kube-proxy's --nodeport-addresses keyword for
// the node's primary IPs.
const NodePortAddressesPrimary = "primary"

// nonBlank returns list's entries trimmed, without blank ones.
func nonBlank(list []string) []string {
	var out []string
	for _, s := range list {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	return out
}

// serverAddr reads --healthz-bind-address or --metrics-bind-address:
// "ip:port", or an IP alone for kube-proxy's port; empty turns the server
// off.
func serverAddr(s string, port uint16) (string, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return "", nil
	}
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return ap.String(), nil
	}
	// An address alone, IPv6 in brackets or not. (Brackets are taken off
	// only when they enclose it all: a zone may hold anything but "%".)
	a := s
	if strings.HasPrefix(a, "[") && strings.HasSuffix(a, "]") {
		a = a[1 : len(a)-1]
	}
	if ip, err := netip.ParseAddr(a); err == nil && !strings.ContainsAny(ip.Zone(), "[]:") {
		return netip.AddrPortFrom(ip, port).String(), nil
	}
	return "", fmt.Errorf("%q is not an IP address with a port, such as 0.0.0.0:%d", s, port)
}

// proxierConfig turns the options into the data plane's Config for a
// portal mode.
func (c *Config) proxierConfig(portalMode string) userspace.Config {
	bind := c.bindAddr
	if portalMode == PortalIPTables {
		// REDIRECT delivers to the address of the interface a packet came
		// in on: the proxy ports listen on every address (see Run).
		bind = netip.IPv4Unspecified()
	}
	return userspace.Config{
		BindAddress: bind,
		PortRange:   c.portRange,
		// iptables redirects node ports to the proxy ports; otherwise the
		// data plane listens on them itself.
		ServeNodePorts: portalMode != PortalIPTables,
		// bind puts the service addresses on the host and listens on them,
		// so it needs no proxy ports.
		ServeFrontends:       portalMode == PortalBind,
		DisableProxyPorts:    portalMode == PortalBind,
		NodePortAddresses:    c.nodePorts,
		NoLocalhostNodePorts: !c.LocalhostNodePorts,
		// iptables refuses (REJECT) or drops (DROP) what has no endpoint,
		// as kube-proxy does; the log says so.
		PortalRefuses:       portalMode == PortalIPTables,
		ClusterCIDRs:        c.podCIDRs,
		UDPIdleTimeout:      c.UDPIdleTimeout,
		UDPReplyTimeout:     c.UDPReplyTimeout,
		UDPMaxSessions:      c.UDPMaxSessions,
		TCPHalfCloseTimeout: c.TCPHalfCloseTimeout,
	}
}
