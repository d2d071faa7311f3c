package proxyserver

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/spf13/pflag"
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
