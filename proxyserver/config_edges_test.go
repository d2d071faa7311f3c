package proxyserver

import (
	"slices"
	"strings"
	"testing"

	"k8s.io/klog/v2"
)

// TestConfigFileFlagsThatWin: beside --config, --hostname-override and
// --udp-timeout still apply, so an error in them names the flag, not the
// file's field, and the log does not list them among the flags the file
// replaces.
func TestConfigFileFlagsThatWin(t *testing.T) {
	logs := captureLog(t)
	c, err := loadConfig(t, kubeadmConfig+"udpIdleTimeout: 1s\n", "--hostname-override=  ", "--udp-timeout=0s", "--kube-api-qps=50")
	if err != nil {
		t.Fatal(err)
	}
	err = c.Validate()
	for _, want := range []string{`--hostname-override: "  " is blank`, "--udp-timeout: must be greater than 0, got 0s"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate error = %v, want it to say %q", err, want)
		}
	}
	if err != nil && (strings.Contains(err.Error(), "hostnameOverride") || strings.Contains(err.Error(), "udpIdleTimeout")) {
		t.Errorf("Validate error = %v: it names the file's field for a flag the command line gave", err)
	}
	klog.Flush()
	line := ""
	for l := range strings.Lines(logs.String()) {
		if strings.Contains(l, "Flags ignored") {
			line = l
		}
	}
	if !strings.Contains(line, "--kube-api-qps") {
		t.Fatalf("no log line lists --kube-api-qps as ignored:\n%s", logs)
	}
	for _, flag := range []string{"--hostname-override", "--udp-timeout"} {
		if strings.Contains(line, flag) {
			t.Errorf("the log lists %s as ignored, though it wins over the file: %s", flag, line)
		}
	}
}

// TestConfigFileFlagsDoNotLeak: the flags a --config file stands for are
// ignored even when the file leaves their field out: the field takes
// kube-proxy's default, not the flag's value. Each of qps and burst is
// read on its own.
func TestConfigFileFlagsDoNotLeak(t *testing.T) {
	head := "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n"
	flags := []string{"--kube-api-qps=50", "--kube-api-burst=100", "--nodeport-addresses=10.0.0.0/8"}
	for _, tc := range []struct {
		name, file string
		qps        float32
		burst      int
	}{
		{"no clientConnection", head, 5, 10},
		{"qps alone", head + "clientConnection: {qps: 7}\n", 7, 10},
		{"burst alone", head + "clientConnection: {burst: 30}\n", 5, 30},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := validConfig(t, tc.file, flags...)
			if c.KubeAPIQPS != tc.qps || c.KubeAPIBurst != tc.burst {
				t.Errorf("qps %v, burst %d; want %v and %d", c.KubeAPIQPS, c.KubeAPIBurst, tc.qps, tc.burst)
			}
			if c.NodePortAddresses != nil || c.nodePorts != nil {
				t.Errorf("node port addresses %q (%v), want none (every address): the file has no nodePortAddresses", c.NodePortAddresses, c.nodePorts)
			}
		})
	}
}

// TestConfigFileValuesRefused: values of the file that cannot apply are
// refused, naming the field: a vmodule pattern that is empty or would be
// split into two (','), a legacy udpIdleTimeout of 0, and a file of
// another kind or version.
func TestConfigFileValuesRefused(t *testing.T) {
	head := "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n"
	for _, tc := range []struct{ name, file, want string }{
		{"empty vmodule pattern", head + "logging:\n  vmodule: [{filePattern: \"\", verbosity: 2}]\n",
			`logging.vmodule[0].filePattern: "" must be a file name pattern`},
		{"vmodule pattern with a comma", head + "logging:\n  vmodule: [{filePattern: \"tcp*\", verbosity: 1}, {filePattern: \"a,b\", verbosity: 2}]\n",
			`logging.vmodule[1].filePattern: "a,b" must be a file name pattern`},
		{"udpIdleTimeout 0", head + "udpIdleTimeout: 0s\n", "udpIdleTimeout: 0s is not a positive duration"},
		{"another kind", "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeletConfiguration\n",
			`kind "KubeletConfiguration": want apiVersion kubeproxy.config.k8s.io/v1alpha1, kind KubeProxyConfiguration`},
		{"another version", "apiVersion: kubeproxy.config.k8s.io/v1alpha2\nkind: KubeProxyConfiguration\n",
			`apiVersion "kubeproxy.config.k8s.io/v1alpha2", kind "KubeProxyConfiguration": want`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := loadConfig(t, tc.file)
			if err == nil {
				err = c.Validate()
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one with %q", err, tc.want)
			}
		})
	}
}

// TestInapplicableLeavesOutWhatApplies: logging.format text (the format
// this proxy logs in) and detectLocalMode ClusterCIDR (the mode it
// supports) are not named as settings it has no use for.
func TestInapplicableLeavesOutWhatApplies(t *testing.T) {
	file := "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nclusterCIDR: 10.244.0.0/16\ndetectLocalMode: ClusterCIDR\nlogging: {format: text}\n"
	if got := inapplicable(mustDecode(t, file)); len(got) != 0 {
		t.Errorf("inapplicable = %q, want none", got)
	}
	c := validConfig(t, file)
	if c.ClusterCIDR != "10.244.0.0/16" || !slices.Equal(c.podCIDRs, c.proxierConfig(PortalNone).ClusterCIDRs) || len(c.podCIDRs) != 1 {
		t.Errorf("cluster CIDR %q (%v), want the file's", c.ClusterCIDR, c.podCIDRs)
	}
}

// TestServerAddrUnbalancedBrackets: brackets are taken off an address
// only when they enclose all of it: "[::1" is a typo, not the
// unspecified address "::" that stripping one bracket and a last
// character would leave.
func TestServerAddrUnbalancedBrackets(t *testing.T) {
	for _, bad := range []string{"[::1", "::1]", "[127.0.0.1"} {
		if got, err := serverAddr(bad, defaultHealthzPort); err == nil {
			t.Errorf("serverAddr(%q) = %q, want an error", bad, got)
		}
	}
}
