package proxyserver

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"
	"k8s.io/klog/v2"
)

// kubeProxyOnlyFlags are kube-proxy's flags that mean nothing to a
// userspace proxy: conntrack sysctls, masquerading, IPVS, feature gates,
// logging formats, profiling. They are accepted, hidden, and named in the
// log as ignored, so that a kube-proxy DaemonSet's command line runs this
// proxy as it is (the same settings in a --config file are ignored the
// same way). Each keeps kube-proxy's type, so a malformed value is still
// refused, and its default. --healthz-port and --metrics-port are here for
// their registration alone: they are applied (deprecatedPortFlags).
var kubeProxyOnlyFlags = []struct {
	name string
	add  func(fs *pflag.FlagSet, name string)
}{
	{"conntrack-max-per-core", addInt(32 * 1024)},
	{"conntrack-min", addInt(128 * 1024)},
	{"conntrack-tcp-be-liberal", addBool},
	{"conntrack-tcp-timeout-close-wait", addDuration(time.Hour)},
	{"conntrack-tcp-timeout-established", addDuration(24 * time.Hour)},
	{"conntrack-udp-timeout", addDuration(0)},
	{"conntrack-udp-timeout-stream", addDuration(0)},
	{"detect-local-mode", addString("")},
	{"feature-gates", addString("")},
	{"healthz-port", addInt(defaultHealthzPort)}, // applied: see deprecatedPortFlags
	{"iptables-masquerade-bit", addInt(14)},
	{"ipvs-exclude-cidrs", addStrings},
	{"ipvs-min-sync-period", addDuration(time.Second)},
	{"ipvs-scheduler", addString("")},
	{"ipvs-strict-arp", addBool},
	{"ipvs-sync-period", addDuration(30 * time.Second)},
	{"ipvs-tcp-timeout", addDuration(0)},
	{"ipvs-tcpfin-timeout", addDuration(0)},
	{"ipvs-udp-timeout", addDuration(0)},
	{"log-flush-frequency", addDuration(5 * time.Second)},
	{"log-json-info-buffer-size", addString("0")},
	{"log-json-split-stream", addBool},
	{"log-text-info-buffer-size", addString("0")},
	{"log-text-split-stream", addBool},
	{"logging-format", addString("text")},
	{"masquerade-all", addBool},
	{"metrics-port", addInt(defaultMetricsPort)}, // applied: see deprecatedPortFlags
	{"oom-score-adj", addInt(-999)},
	{"pod-bridge-interface", addString("")},
	{"pod-interface-name-prefix", addString("")},
	{"profiling", addBool},
	{"show-hidden-metrics-for-version", addString("")},
}

// The add functions register a flag of kube-proxy's type with kube-proxy's
// default, so that the -v=1 FLAG: lines show what kube-proxy's show.
func addBool(fs *pflag.FlagSet, name string) { fs.Bool(name, false, "") }
func addInt(def int32) func(*pflag.FlagSet, string) {
	return func(fs *pflag.FlagSet, name string) { fs.Int32(name, def, "") }
}
func addString(def string) func(*pflag.FlagSet, string) {
	return func(fs *pflag.FlagSet, name string) { fs.String(name, def, "") }
}
func addStrings(fs *pflag.FlagSet, name string) {
	fs.StringSlice(name, nil, "")
}
func addDuration(def time.Duration) func(*pflag.FlagSet, string) {
	return func(fs *pflag.FlagSet, name string) { fs.Duration(name, def, "") }
}

// deprecatedPortFlags are kube-proxy's deprecated --healthz-port and
// --metrics-port, which kube-proxy still applies (and so does this proxy;
// see applyDeprecatedPortFlags, which LoadConfigFile calls) to the address
// flag named.
var deprecatedPortFlags = []struct{ name, addrFlag string }{
	{"healthz-port", "healthz-bind-address"},
	{"metrics-port", "metrics-bind-address"},
}

// addKubeProxyFlags registers --proxy-mode and the flags of
// kubeProxyOnlyFlags, hidden.
func (c *Config) addKubeProxyFlags(fs *pflag.FlagSet) {
	fs.StringVar(&c.ProxyMode, "proxy-mode", c.ProxyMode, "kube-proxy's mode: userspace, or empty.")
	_ = fs.MarkHidden("proxy-mode")
	for _, f := range kubeProxyOnlyFlags {
		f.add(fs, f.name)
		_ = fs.MarkHidden(f.name)
	}
	c.flags = fs
}

// ignoredKubeProxyFlags lists the flags of kubeProxyOnlyFlags that were
// given, as "--name".
func (c *Config) ignoredKubeProxyFlags() []string {
	if c.flags == nil {
		return nil
	}
	var out []string
	for _, f := range kubeProxyOnlyFlags {
		if c.ConfigFile != "" && slices.Contains(overriddenModeFlags, f.name) {
			continue // said to be overridden by the file (LoadConfigFile)
		}
		if isDeprecatedPortFlag(f.name) {
			continue // applied, or said to be ignored (applyDeprecatedPortFlags)
		}
		if c.flags.Changed(f.name) {
			out = append(out, "--"+f.name)
		}
	}
	return out
}

// isDeprecatedPortFlag says whether name is one of deprecatedPortFlags.
func isDeprecatedPortFlag(name string) bool {
	for _, d := range deprecatedPortFlags {
		if d.name == name {
			return true
		}
	}
	return false
}

// applyDeprecatedPortFlags applies --healthz-port and --metrics-port, when
// given, where kube-proxy does (cmd/kube-proxy/app/options.go, Complete,
// before it reads the --config file; here LoadConfigFile, before
// Validate, which changes no option): without --config and
// --write-config-to, port 0 turns the server off, and another port is
// joined to an address flag that gives an IP alone (an address with a
// port keeps its own, and an empty one stays off). Like kube-proxy, which
// prints that the flag is deprecated, it logs so, with the address that
// results. With --config the file's address stands, and with
// --write-config-to the file written holds the address flag as given, as
// kube-proxy writes it; the log says the flag is ignored, or not
// written.
func (c *Config) applyDeprecatedPortFlags() error {
	if c.flags == nil {
		return nil
	}
	var errs []error
	for _, d := range deprecatedPortFlags {
		if !c.flags.Changed(d.name) {
			continue // its default is the port an IP alone gets (serverAddr)
		}
		port, _ := c.flags.GetInt32(d.name)
		addr := &c.HealthzBindAddress
		if d.addrFlag == "metrics-bind-address" {
			addr = &c.MetricsBindAddress
		}
		msg := fmt.Sprintf("Flag --%s has been deprecated, as in kube-proxy: use --%s instead", d.name, d.addrFlag)
		switch {
		case c.ConfigFile != "":
			klog.InfoS(msg+"; with --config it is ignored: the file's "+configFileFields[d.addrFlag]+" sets the address", "port", port, "address", *addr)
			continue
		case c.WriteConfigTo != "":
			klog.InfoS(msg+"; --write-config-to does not write it, as kube-proxy's does not: the file holds --"+d.addrFlag+" as given", "port", port, "address", *addr)
			continue
		}
		ip, hasPort, ok := splitServerAddr(*addr)
		var applied string
		switch {
		case port == 0:
			*addr, applied = "", "port 0 turns the server off"
		case !ok: // checked by Validate, which names it
			applied = "unused: --" + d.addrFlag + " is not an IP address"
		case hasPort:
			applied = "unused: --" + d.addrFlag + " gives its own port"
		case ip == "":
			applied = "unused: --" + d.addrFlag + " is empty, which turns the server off"
		case port < 0 || port > 65535:
			errs = append(errs, fmt.Errorf("--%s: %d is not a port to join to --%s=%s: give 1-65535, or 0 to turn the server off", d.name, port, d.addrFlag, *addr))
			continue
		default:
			a, _ := netip.ParseAddr(ip)
			*addr, applied = netip.AddrPortFrom(a, uint16(port)).String(), "the port is joined to --"+d.addrFlag
		}
		klog.InfoS(msg, "port", port, "applied", applied, "address", *addr)
	}
	return errors.Join(errs...)
}

// splitServerAddr reads an address flag as serverAddr does: ip is the
// address alone (brackets taken off an IPv6 one) and hasPort says it
// came with a port; ok is false for what is neither (nor empty).
func splitServerAddr(s string) (ip string, hasPort, ok bool) {
	s = strings.TrimSpace(s)
	if s == "" {
		return "", false, true
	}
	if _, err := netip.ParseAddrPort(s); err == nil {
		return "", true, true
	}
	if strings.HasPrefix(s, "[") && strings.HasSuffix(s, "]") {
		s = s[1 : len(s)-1]
	}
	if a, err := netip.ParseAddr(s); err == nil && !strings.ContainsAny(a.Zone(), "[]:") {
		return s, false, true
	}
	return "", false, false
}

// isKubeProxyOnly says whether name is one of kubeProxyOnlyFlags.
func isKubeProxyOnly(name string) bool {
	for _, f := range kubeProxyOnlyFlags {
		if f.name == name {
			return true
		}
	}
	return false
}

// checkDetectLocalModeFlag refuses a --detect-local-mode kube-proxy would
// refuse; the ones it knows are accepted (and, but for ClusterCIDR, which
// --cluster-cidr stands for, ignored).
func (c *Config) checkDetectLocalModeFlag() error {
	if c.flags == nil || !c.flags.Changed("detect-local-mode") {
		return nil
	}
	v, _ := c.flags.GetString("detect-local-mode")
	return checkDetectLocalMode("--detect-local-mode", v)
}

// checkDetectLocalMode refuses a detectLocalMode (--detect-local-mode, or
// the --config file's field) that kube-proxy would refuse, naming where it
// came from.
func checkDetectLocalMode(where, mode string) error {
	switch mode {
	case "", "ClusterCIDR", "NodeCIDR", "BridgeInterface", "InterfaceNamePrefix":
		return nil
	}
	return fmt.Errorf("%s: %q is not a mode (ClusterCIDR, NodeCIDR, BridgeInterface or InterfaceNamePrefix; this proxy supports ClusterCIDR)", where, mode)
}

// checkMode refuses a mode (--proxy-mode, or the --config file's mode)
// other than userspace or empty, naming where it came from.
func checkMode(where, mode string) error {
	set := where + ": " + ModeUserspace // a field of the file
	if strings.HasPrefix(where, "--") {
		set = where + "=" + ModeUserspace
	}
	switch {
	case mode == "" || mode == ModeUserspace:
		return nil
	case slices.Contains([]string{"iptables", "ipvs", "nftables", "kernelspace"}, mode):
		return fmt.Errorf("%s: %q is one of kube-proxy's own modes; this proxy is mode %q (set %s, or leave it out)", where, mode, ModeUserspace, set)
	}
	return fmt.Errorf("%s: %q is not a mode; this proxy is mode %q (set %s, or leave it out)", where, mode, ModeUserspace, set)
}

// Description is what -h says the program is, above its flags.
const Description = "kube-userspace-proxy is a userspace L4 service proxy for Kubernetes: kube-proxy's removed userspace mode, rebuilt.\n" +
	"It takes kube-proxy's flags and KubeProxyConfiguration file (mode: userspace), or serves Services from a manifest file without a cluster."

// SetUsage makes -h print, as kube-proxy's does, what the program is,
// how it is run, and its flags, to fs's output.
func SetUsage(fs *pflag.FlagSet) {
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "%s\n\nUsage:\n  %s [flags]\n\nFlags:\n%s", Description, fs.Name(), fs.FlagUsages())
	}
}

// VersionValue is --version, as kube-proxy's (component-base verflag):
// "false", "true" (--version alone) or "raw"; anything else is kept as
// given, for the caller to refuse (this proxy cannot report another
// version, as verflag's --version=vX.Y.Z does). -h shows it as
// kube-proxy's, "--version version[=true]".
type VersionValue string

// AddVersionFlag registers --version on fs and returns its value.
func AddVersionFlag(fs *pflag.FlagSet) *VersionValue {
	v := VersionValue("false")
	fs.Var(&v, "version", "Print the version and exit; --version=raw prints it field by field, as kube-proxy does.")
	fs.Lookup("version").NoOptDefVal = "true"
	return &v
}

func (v *VersionValue) String() string { return string(*v) }

// Type names the value in -h.
func (v *VersionValue) Type() string { return "version" }

// Set takes raw or a boolean (true, 1, f...) as verflag does, and keeps
// anything else as given.
func (v *VersionValue) Set(s string) error {
	if b, err := strconv.ParseBool(s); err == nil {
		s = strconv.FormatBool(b)
	}
	*v = VersionValue(s)
	return nil
}

// LogFlags logs every flag and its value at -v=1, in kube-proxy's words
// (cliflag.PrintFlags): FLAG: --name="value".
func LogFlags(fs *pflag.FlagSet) {
	if !klog.V(1).Enabled() {
		return
	}
	fs.VisitAll(func(f *pflag.Flag) {
		klog.V(1).Infof("FLAG: --%s=%q", f.Name, f.Value)
	})
}
