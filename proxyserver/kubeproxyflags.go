package proxyserver

import (
	"fmt"
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
// refused.
var kubeProxyOnlyFlags = []struct {
	name string
	add  func(fs *pflag.FlagSet, name string)
}{
	{"conntrack-max-per-core", addInt},
	{"conntrack-min", addInt},
	{"conntrack-tcp-be-liberal", addBool},
	{"conntrack-tcp-timeout-close-wait", addDuration},
	{"conntrack-tcp-timeout-established", addDuration},
	{"conntrack-udp-timeout", addDuration},
	{"conntrack-udp-timeout-stream", addDuration},
	{"detect-local-mode", addString},
	{"feature-gates", addString},
	{"healthz-port", addInt},
	{"iptables-masquerade-bit", addInt},
	{"ipvs-exclude-cidrs", addStrings},
	{"ipvs-min-sync-period", addDuration},
	{"ipvs-scheduler", addString},
	{"ipvs-strict-arp", addBool},
	{"ipvs-sync-period", addDuration},
	{"ipvs-tcp-timeout", addDuration},
	{"ipvs-tcpfin-timeout", addDuration},
	{"ipvs-udp-timeout", addDuration},
	{"log-flush-frequency", addDuration},
	{"log-json-info-buffer-size", addString},
	{"log-json-split-stream", addBool},
	{"log-text-info-buffer-size", addString},
	{"log-text-split-stream", addBool},
	{"logging-format", addString},
	{"masquerade-all", addBool},
	{"metrics-port", addInt},
	{"oom-score-adj", addInt},
	{"pod-bridge-interface", addString},
	{"pod-interface-name-prefix", addString},
	{"profiling", addBool},
	{"show-hidden-metrics-for-version", addString},
}

func addBool(fs *pflag.FlagSet, name string)   { fs.Bool(name, false, "") }
func addInt(fs *pflag.FlagSet, name string)    { fs.Int32(name, 0, "") }
func addString(fs *pflag.FlagSet, name string) { fs.String(name, "", "") }
func addStrings(fs *pflag.FlagSet, name string) {
	fs.StringSlice(name, nil, "")
}
func addDuration(fs *pflag.FlagSet, name string) { fs.Duration(name, time.Duration(0), "") }

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
		if c.flags.Changed(f.name) {
			out = append(out, "--"+f.name)
		}
	}
	return out
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
