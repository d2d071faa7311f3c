package proxyserver

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
	clientmetrics "k8s.io/client-go/tools/metrics"
	"k8s.io/klog/v2"
	kubeproxyv1alpha1 "k8s.io/kube-proxy/config/v1alpha1"
	"sigs.k8s.io/yaml"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/userspace"
)

// validConfig is loadConfig and Validate, either of whose errors fails
// the test.
func validConfig(t *testing.T, file string, args ...string) *Config {
	t.Helper()
	c, err := loadConfig(t, file, args...)
	if err == nil {
		err = c.Validate()
	}
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// configzOf returns what /configz serves for c, as sent and decoded.
func configzOf(t *testing.T, c *Config) ([]byte, map[string]kubeproxyv1alpha1.KubeProxyConfiguration) {
	t.Helper()
	body, err := c.configzBody(0)
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]kubeproxyv1alpha1.KubeProxyConfiguration
	if err := json.Unmarshal(body, &got); err != nil {
		t.Fatal(err)
	}
	return body, got
}

// writtenConfig returns what --write-config-to writes for c.
func writtenConfig(t *testing.T, c *Config) []byte {
	t.Helper()
	c.WriteConfigTo = filepath.Join(t.TempDir(), "written.yaml")
	if _, err := c.WriteConfigFile(0); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(c.WriteConfigTo)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// loadConfig parses args, writes file (if not empty) for --config, and
// loads it.
func loadConfig(t *testing.T, file string, args ...string) (*Config, error) {
	t.Helper()
	c := NewConfig()
	fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
	c.AddFlags(fs)
	fs.Int("v", 0, "klog's, as main adds it")
	fs.String("vmodule", "", "klog's, as main adds it")
	if file != "" {
		path := filepath.Join(t.TempDir(), "config.yaml")
		if err := os.WriteFile(path, []byte(file), 0o644); err != nil {
			t.Fatal(err)
		}
		args = append(args, "--config", path)
	}
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	return c, c.LoadConfigFile(fs)
}

// A kube-proxy ConfigMap's file, as kubeadm writes one, set to userspace.
const kubeadmConfig = `apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
bindAddress: 0.0.0.0
bindAddressHardFail: false
clientConnection:
  acceptContentTypes: ""
  burst: 20
  contentType: ""
  kubeconfig: /var/lib/kube-proxy/kubeconfig.conf
  qps: 7
clusterCIDR: 10.244.0.0/16
configSyncPeriod: 10m0s
conntrack:
  maxPerCore: null
  min: null
  tcpCloseWaitTimeout: null
  tcpEstablishedTimeout: null
detectLocalMode: ""
enableProfiling: false
healthzBindAddress: ""
hostnameOverride: node-from-file
iptables:
  masqueradeAll: false
  masqueradeBit: null
  minSyncPeriod: 2s
  syncPeriod: 45s
logging:
  verbosity: 3
metricsBindAddress: 0.0.0.0:10249
mode: userspace
nodePortAddresses: [localhost, 10.0.0.0/8]
oomScoreAdj: null
portRange: 36000-37999
`

func TestLoadConfigFile(t *testing.T) {
	c, err := loadConfig(t, kubeadmConfig, "--kubeconfig=/ignored", "--udp-timeout=1s")
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	checks := []struct {
		name      string
		got, want any
	}{
		{"kubeconfig (the flag is ignored)", c.Kubeconfig, "/var/lib/kube-proxy/kubeconfig.conf"},
		{"qps", c.KubeAPIQPS, float32(7)},
		{"burst", c.KubeAPIBurst, 20},
		{"content type (defaulted)", c.KubeAPIContentType, contentTypeProtobuf},
		{"hostname", c.HostnameOverride, "node-from-file"},
		{"config sync period", c.ConfigSyncPeriod, 10 * time.Minute},
		{"sync period", c.SyncPeriod, 45 * time.Second},
		{"min sync period", c.MinSyncPeriod, 2 * time.Second},
		{"healthz (defaulted)", c.healthz, "0.0.0.0:10256"},
		{"metrics", c.metrics, "0.0.0.0:10249"},
		{"port range", c.ProxyPortRange, "36000-37999"},
		{"node ports", strings.Join(c.NodePortAddresses, ","), "127.0.0.0/8,::1/128,10.0.0.0/8"},
		{"our own flag still applies", c.UDPIdleTimeout, time.Second},
		{"verbosity", *c.LogVerbosity, 3},
	}
	for _, ck := range checks {
		if ck.got != ck.want {
			t.Errorf("%s = %v, want %v", ck.name, ck.got, ck.want)
		}
	}
	if c.ClusterCIDR != "10.244.0.0/16" || len(c.podCIDRs) != 1 {
		t.Errorf("cluster CIDR %q (%v), want the file's", c.ClusterCIDR, c.podCIDRs)
	}
	if got := inapplicable(mustDecode(t, kubeadmConfig)); len(got) != 0 {
		t.Errorf("inapplicable = %v, want none", got)
	}
	if got := inapplicable(mustDecode(t, strings.Replace(kubeadmConfig, `detectLocalMode: ""`, "detectLocalMode: NodeCIDR", 1)+"ipvs: {strictARP: true}\n")); !slices.Equal(got, []string{"detectLocalMode (only ClusterCIDR is supported: clusterCIDR tells pod traffic apart)", "ipvs"}) {
		t.Errorf("inapplicable = %v", got)
	}

	// iptables.localhostNodePorts is kube-proxy's, defaulting to true.
	if !c.LocalhostNodePorts {
		t.Errorf("localhostNodePorts = false, want kube-proxy's default, true")
	}
	c, err = loadConfig(t, strings.Replace(kubeadmConfig, "  masqueradeAll: false\n", "  masqueradeAll: false\n  localhostNodePorts: false\n", 1))
	if err != nil {
		t.Fatal(err)
	}
	if c.LocalhostNodePorts || !c.proxierConfig(PortalNone).NoLocalhostNodePorts {
		t.Errorf("iptables.localhostNodePorts: false was not read")
	}

	// --hostname-override and -v on the command line win over the file.
	c, err = loadConfig(t, kubeadmConfig, "--hostname-override=flag-node", "--v=1")
	if err != nil {
		t.Fatal(err)
	}
	if c.HostnameOverride != "flag-node" || c.LogVerbosity != nil {
		t.Errorf("hostname %q, verbosity %v: want the flags' (flag-node, none from the file)", c.HostnameOverride, c.LogVerbosity)
	}
	// An empty --hostname-override is no override: kube-proxy takes the
	// flag only when it is not empty.
	c, err = loadConfig(t, kubeadmConfig, "--hostname-override=")
	if err != nil {
		t.Fatal(err)
	}
	if c.HostnameOverride != "node-from-file" {
		t.Errorf("--hostname-override= with the file's hostnameOverride: %q, want the file's node-from-file", c.HostnameOverride)
	}
}

// TestLoadConfigFileLogging: the file's logging.vmodule applies as
// --vmodule would (unless --vmodule is given, as kube-proxy lets logging
// flags win), and what of logging cannot apply is named.
func TestLoadConfigFileLogging(t *testing.T) {
	head := "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n"
	file := head + "logging:\n  verbosity: 1\n  vmodule:\n  - {filePattern: proxier, verbosity: 4}\n  - {filePattern: sync*, verbosity: 2}\n"
	c, err := loadConfig(t, file)
	if err != nil {
		t.Fatal(err)
	}
	if c.LogVModule != "proxier=4,sync*=2" || c.LogVerbosity == nil || *c.LogVerbosity != 1 {
		t.Errorf("vmodule %q, verbosity %v: want proxier=4,sync*=2 and 1", c.LogVModule, c.LogVerbosity)
	}
	if got := inapplicable(mustDecode(t, file)); len(got) != 0 {
		t.Errorf("inapplicable = %v: vmodule and verbosity apply", got)
	}
	c, err = loadConfig(t, file, "--vmodule=other=3")
	if err != nil || c.LogVModule != "other=3" {
		t.Errorf("with --vmodule: %v, vmodule %q, want the command line's other=3", err, c.LogVModule)
	}
	if _, err := loadConfig(t, head+"logging:\n  vmodule: [{filePattern: \"a=1\", verbosity: 2}]\n"); err == nil ||
		!strings.Contains(err.Error(), "logging.vmodule[0].filePattern") {
		t.Errorf("bad pattern: %v", err)
	}
	// kubeadm's config.conf: every option at its default.
	kubeadm := head + "logging:\n  flushFrequency: 0\n  options:\n    json:\n      infoBufferSize: \"0\"\n    text:\n      infoBufferSize: \"0\"\n  verbosity: 0\n"
	if got := inapplicable(mustDecode(t, kubeadm)); len(got) != 0 {
		t.Errorf("kubeadm's logging options at their defaults: inapplicable = %q, want none", got)
	}
	for _, opts := range []string{"{text: {splitStream: true}}", "{json: {infoBufferSize: 64Ki}}", "{text: {infoBufferSize: \"1\"}}"} {
		if got := inapplicable(mustDecode(t, head+"logging:\n  options: "+opts+"\n")); !slices.Equal(got, []string{"logging.options"}) {
			t.Errorf("logging.options %s: inapplicable = %q, want logging.options", opts, got)
		}
	}
	got := inapplicable(mustDecode(t, head+"logging:\n  format: json\n  flushFrequency: 1s\n  options: {text: {splitStream: true}}\n"))
	want := []string{"logging.flushFrequency (logs are not buffered)", "logging.format (logs are text)", "logging.options"}
	if !slices.Equal(got, want) {
		t.Errorf("inapplicable = %q, want %q", got, want)
	}
}

// TestConfigFileOverridesModeFlags: as kube-proxy, the file's mode and
// detectLocalMode replace --proxy-mode and --detect-local-mode, so a
// kube-proxy DaemonSet's --proxy-mode=iptables beside a file with mode:
// userspace runs, and the log says the flags are overridden.
func TestConfigFileOverridesModeFlags(t *testing.T) {
	var buf bytes.Buffer
	klog.LogToStderr(false)
	klog.SetOutput(&buf)
	t.Cleanup(func() { klog.LogToStderr(true) })
	c, err := loadConfig(t, kubeadmConfig, "--proxy-mode=iptables", "--detect-local-mode=Bogus")
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Validate(); err != nil {
		t.Errorf("--proxy-mode and --detect-local-mode with --config: %v, want them overridden by the file", err)
	}
	klog.Flush()
	if !regexp.MustCompile(`Flags ignored.*--detect-local-mode.*--proxy-mode`).MatchString(buf.String()) {
		t.Errorf("the log does not say the flags are overridden:\n%s", buf.String())
	}
	if got := c.ignoredKubeProxyFlags(); slices.Contains(got, "--detect-local-mode") {
		t.Errorf("--detect-local-mode also listed as meaningless (%v): it is said to be overridden", got)
	}
	// The file's own mode is still checked.
	c, err = loadConfig(t, strings.Replace(kubeadmConfig, "mode: userspace", "mode: ipvs", 1), "--proxy-mode=userspace")
	if err == nil {
		err = c.Validate()
	}
	if err == nil || !strings.Contains(err.Error(), `mode: "ipvs"`) {
		t.Errorf("file with mode: ipvs: %v", err)
	}
}

// TestConfigFileRepeatedField: as kube-proxy, a field given twice (a
// kubeadm template's mode: "" with mode: userspace added below it) is
// read leniently, with a warning naming it and its line: the last value
// wins. Unknown fields beside it are still named.
func TestConfigFileRepeatedField(t *testing.T) {
	head := "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n"
	tests := []struct {
		name, file string
		want       []string // in the log
		sync       time.Duration
	}{
		{"YAML", head + "mode: \"\"\nmode: userspace\niptables:\n  syncPeriod: 10s\n  syncPeriod: 20s\n",
			[]string{`Using lenient decoding as strict decoding failed`, `duplicates=["line 4: mode","line 7: syncPeriod"]`}, 20 * time.Second},
		{"JSON", `{"apiVersion":"kubeproxy.config.k8s.io/v1alpha1","kind":"KubeProxyConfiguration","mode":"","mode":"userspace"}`,
			[]string{`Using lenient decoding as strict decoding failed`, `duplicates=["line 1: mode"]`}, 30 * time.Second},
		{"with an unknown field", head + "mode: \"\"\nmode: userspace\nsomethingNew: 1\n",
			[]string{`duplicates=["line 4: mode"]`, `fields=["somethingNew"]`}, 30 * time.Second},
		{"with udpIdleTimeout", head + "mode: \"\"\nudpIdleTimeout: 1s\nmode: userspace\n",
			[]string{`duplicates=["line 5: mode"]`}, 30 * time.Second},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var buf bytes.Buffer
			klog.LogToStderr(false)
			klog.SetOutput(&buf)
			t.Cleanup(func() { klog.LogToStderr(true) })
			c, err := loadConfig(t, tc.file)
			if err == nil {
				err = c.Validate()
			}
			if err != nil {
				t.Fatalf("a repeated field: %v, want it read leniently", err)
			}
			if c.SyncPeriod != tc.sync {
				t.Errorf("sync period %v, want the last value, %v", c.SyncPeriod, tc.sync)
			}
			klog.Flush()
			for _, want := range tc.want {
				if !strings.Contains(buf.String(), want) {
					t.Errorf("the log does not say %s:\n%s", want, buf.String())
				}
			}
		})
	}
}

func mustDecode(t *testing.T, s string) *kubeproxyv1alpha1.KubeProxyConfiguration {
	t.Helper()
	kp, _, err := decodeKubeProxyConfig([]byte(s))
	if err != nil {
		t.Fatal(err)
	}
	return kp
}

func TestLoadConfigFileErrors(t *testing.T) {
	head := "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n"
	tests := []struct {
		name, file, want string
	}{
		{"kube-proxy's mode", head + "mode: iptables\n", `mode: "iptables" is one of kube-proxy's own modes; this proxy is mode "userspace"`},
		{"wrong kind", "apiVersion: v1\nkind: ConfigMap\n", `apiVersion "v1", kind "ConfigMap": want apiVersion kubeproxy.config.k8s.io/v1alpha1, kind KubeProxyConfiguration`},
		{"wrong type", head + "iptables: {syncPeriod: [1]}\n", ": iptables.syncPeriod: is a list; want a duration such as 30s or 15m"},
		{"duration as a number", head + "iptables: {syncPeriod: 30}\n", ": iptables.syncPeriod: 30 is a number; want a duration such as 30s or 15m"},
		{"duration as a map", head + "iptables: {minSyncPeriod: {s: 1}}\n", ": iptables.minSyncPeriod: is a map; want a duration"},
		{"bool as a string", head + "bindAddressHardFail: \"yes\"\n", `: bindAddressHardFail: "yes" is a string; want true or false`},
		{"list as a string", head + "nodePortAddresses: 10.0.0.0/8\n", `: nodePortAddresses: "10.0.0.0/8" is a string; want a list`},
		{"fraction for a whole number", head + "oomScoreAdj: 1.5\n", ": oomScoreAdj: 1.5 is a number; want a whole number"},
		{"section as a number", head + "clientConnection: 5\n", ": clientConnection: 5 is a number; want a map of fields"},
		{"bad duration named", head + "iptables: {syncPeriod: 30x}\n", `: iptables.syncPeriod: time: unknown unit "x" in duration "30x"`},
		{"bad number named", head + "conntrack: {maxPerCore: lots}\n", `: conntrack.maxPerCore: "lots" is a string; want a whole number`},
		{"primary with CIDRs", head + "nodePortAddresses: [primary, 10.0.0.0/8]\n", `: nodePortAddresses: "primary" cannot be combined with CIDRs`},
		{"not a mode", head + "mode: Userspace\n", `mode: "Userspace" is not a mode`},
		{"bad field named", head + "portRange: 40010-40000\nnodePortAddresses: [10.0.0.0/33]\n", ": portRange: "},
		{"port range with spaces", head + "portRange: 30000 - 30100\n", `: portRange: invalid port range "30000 - 30100": no spaces are allowed within it`},
		{"bad CIDR named", head + "nodePortAddresses: [10.0.0.0/33]\n", `: nodePortAddresses: "10.0.0.0/33" is not a CIDR`},
		{"legacy UDP timeout", head + "udpIdleTimeout: -1s\n", "udpIdleTimeout: -1s is not a positive duration"},
		{"one address for both servers", head + "healthzBindAddress: 127.0.0.1:10300\nmetricsBindAddress: 127.0.0.1:10300\n", "127.0.0.1:10300 is the health address too"},
		{"cluster CIDR", head + "clusterCIDR: 10.244.0.0/16,nope\n", `clusterCIDR: "nope" is not a CIDR`},
		{"three cluster CIDRs", head + "clusterCIDR: 10.244.0.0/16,fd00::/56,10.1.0.0/16\n", `: clusterCIDR: "10.244.0.0/16,fd00::/56,10.1.0.0/16" has 3 CIDRs`},
		{"two cluster CIDRs of one family", head + "clusterCIDR: 10.244.0.0/16,10.1.0.0/16\n", `: clusterCIDR: "10.244.0.0/16,10.1.0.0/16" is not a dual-stack pair`},
		{"a field twice: the last wins", head + "mode: userspace\niptables: {syncPeriod: 30s}\nmode: iptables\n", `mode: "iptables" is one of kube-proxy's own modes`},
		{"unknown detectLocalMode", head + "detectLocalMode: Bogus\n", `detectLocalMode: "Bogus" is not a mode`},
		{"blank host name", head + "hostnameOverride: \"  \"\n", `: hostnameOverride: "  " is blank`},
		{"manifests too", head + "clientConnection: {kubeconfig: /k}\n", "--manifests and the --config file's clientConnection.kubeconfig"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			args := []string{}
			if tc.name == "manifests too" {
				args = append(args, "--manifests=x.yaml")
			}
			c, err := loadConfig(t, tc.file, args...)
			if err == nil {
				err = c.Validate()
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one with %q", err, tc.want)
			}
		})
	}
	// all, with other entries or not, is every address.
	c, err := loadConfig(t, head+"nodePortAddresses: [all, 10.0.0.0/8]\n")
	if err != nil || c.NodePortAddresses != nil {
		t.Errorf("nodePortAddresses [all, ...]: %v, %v", err, c.NodePortAddresses)
	}
	// The legacy userspace mode's udpIdleTimeout sets --udp-timeout,
	// unless the flag is given.
	c, err = loadConfig(t, head+"udpIdleTimeout: 10s\n")
	if err != nil || c.UDPIdleTimeout != 10*time.Second {
		t.Errorf("udpIdleTimeout: %v, %v", err, c.UDPIdleTimeout)
	}
	c, err = loadConfig(t, head+"udpIdleTimeout: 10s\n", "--udp-timeout=3s")
	if err != nil || c.UDPIdleTimeout != 3*time.Second {
		t.Errorf("udpIdleTimeout with --udp-timeout: %v, %v", err, c.UDPIdleTimeout)
	}
	// An IPv6 bindAddress moves the defaults of the health and metrics
	// addresses to IPv6, as kube-proxy defaults them; set ones stay.
	c, err = loadConfig(t, head+"bindAddress: \"::\"\nhealthzBindAddress: \"\"\n")
	if err == nil {
		err = c.Validate()
	}
	if err != nil || c.healthz != "[::]:10256" || c.metrics != "[::1]:10249" {
		t.Errorf("bindAddress ::: %v, healthz %q, metrics %q; want [::]:10256 and [::1]:10249", err, c.healthz, c.metrics)
	}
	c, err = loadConfig(t, head+"bindAddress: \"::\"\nmetricsBindAddress: 0.0.0.0:10249\n")
	if err == nil {
		err = c.Validate()
	}
	if err != nil || c.healthz != "[::]:10256" || c.metrics != "0.0.0.0:10249" {
		t.Errorf("bindAddress :: with metricsBindAddress: %v, healthz %q, metrics %q", err, c.healthz, c.metrics)
	}
	// A bindAddress that is not this host's is refused at start, naming
	// the file's field, not the flag the file stood for.
	c, err = loadConfig(t, head+"bindAddress: 192.0.2.77\n")
	if err == nil {
		err = c.Validate()
	}
	if err != nil {
		t.Fatal(err)
	}
	if err := checkBindAddress(context.Background(), c.bindAddr, c.where("bind-address")); err == nil || !strings.Contains(err.Error(), ": bindAddress 192.0.2.77 is not an address of this host") {
		t.Errorf("bindAddress not on this host: %v", err)
	}
	// An unknown field, as a newer kube-proxy may write, is ignored.
	c, err = loadConfig(t, head+"mode: userspace\nsomethingNew: 1\nportRange: \"40000+10\"\n")
	if err != nil || c.ProxyPortRange != "40000+10" {
		t.Errorf("unknown field: %v, port range %q", err, c.ProxyPortRange)
	}
	if _, err := loadConfig(t, "", "--config=/nonexistent/kube-proxy.yaml"); err == nil || !strings.Contains(err.Error(), "--config: open /nonexistent/kube-proxy.yaml") {
		t.Errorf("missing file: %v", err)
	}
}

// TestWriteConfigFile: --write-config-to writes a file that --config reads
// back as the same options, names the flags it cannot hold, and refuses a
// value the file would read back as something else.
func TestWriteConfigFile(t *testing.T) {
	for _, args := range [][]string{
		nil,
		{"--kubeconfig=/etc/kup/kubeconfig", "--kube-api-qps=7.5", "--kube-api-burst=30", "--kube-api-content-type=application/json",
			"--config-sync-period=10m", "--bind-address=::", "--healthz-bind-address=[::]:9000", "--metrics-bind-address=127.0.0.1",
			"--nodeport-addresses=127.0.0.0/8,198.18.0.0/15", "--cluster-cidr=198.18.0.0/16,fd5e:b1b5::/48", "--iptables-sync-period=1m",
			"--iptables-min-sync-period=0.5s", "--proxy-port-range=36000+99", "--udp-timeout=1s", "--hostname-override=node-a",
			"--portal=iptables", "--udp-max-sessions=-1", "--master=https://192.0.2.1:6443", "--iptables-localhost-nodeports=false",
			"--vmodule=proxier=4,sync*=2"},
	} {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			c, err := loadConfig(t, "", args...)
			if err != nil {
				t.Fatal(err)
			}
			if err := c.Validate(); err != nil {
				t.Fatal(err)
			}
			c.WriteConfigTo = filepath.Join(t.TempDir(), "written.yaml")
			keep, err := c.WriteConfigFile(3)
			if err != nil {
				t.Fatal(err)
			}
			data, err := os.ReadFile(c.WriteConfigTo)
			if err != nil {
				t.Fatal(err)
			}
			// Every field is one kube-proxy knows, but the legacy
			// userspace mode's udpIdleTimeout.
			var strict kubeproxyv1alpha1.KubeProxyConfiguration
			if err := yaml.UnmarshalStrict([]byte(strings.Split(string(data), "udpIdleTimeout:")[0]), &strict); err != nil {
				t.Fatalf("the file is not a strict KubeProxyConfiguration: %v\n%s", err, data)
			}
			back, err := loadConfig(t, string(data), keep...)
			if err != nil {
				t.Fatal(err)
			}
			if err := back.Validate(); err != nil {
				t.Fatal(err)
			}
			if back.LogVerbosity == nil || *back.LogVerbosity != 3 {
				t.Errorf("verbosity read back as %v, want 3", back.LogVerbosity)
			}
			c.fromFile, back.fromFile = nil, nil
			c.flags, back.flags = nil, nil
			c.WriteConfigTo, back.ConfigFile, back.LogVerbosity, back.fileData = "", "", nil, nil
			if !reflect.DeepEqual(c, back) {
				t.Errorf("read back as\n%+v\nwant\n%+v\nfile:\n%s", back, c, data)
			}
			var want []string
			for _, a := range args {
				if name := strings.SplitN(strings.TrimPrefix(a, "--"), "=", 2)[0]; configFileFields[name] == "" && name != "vmodule" {
					want = append(want, a)
				}
			}
			slices.Sort(want)
			if !slices.Equal(keep, want) {
				t.Errorf("flags to keep = %q, want %q", keep, want)
			}
		})
	}

	// A flag the file cannot hold, given at its default, need not be
	// given again.
	c, err := loadConfig(t, "", "--manifests=", "--udp-max-sessions=-1", "--portal=auto")
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	c.WriteConfigTo = filepath.Join(t.TempDir(), "written.yaml")
	if keep, err := c.WriteConfigFile(0); err != nil || !slices.Equal(keep, []string{"--udp-max-sessions=-1"}) {
		t.Errorf("flags to keep = %q, %v; want only --udp-max-sessions=-1", keep, err)
	}

	// "0" lets the kernel choose, as "" does, which the file holds.
	c, err = loadConfig(t, "", "--proxy-port-range=0")
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	c.WriteConfigTo = filepath.Join(t.TempDir(), "written.yaml")
	if _, err := c.WriteConfigFile(0); err != nil {
		t.Errorf("--proxy-port-range=0: %v", err)
	}

	c, err = loadConfig(t, "", "--healthz-bind-address=", "--config-sync-period=0", "--iptables-min-sync-period=1s")
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	c.WriteConfigTo = filepath.Join(t.TempDir(), "written.yaml")
	_, err = c.WriteConfigFile(0)
	for _, want := range []string{
		`--healthz-bind-address="" cannot be written: a KubeProxyConfiguration's healthzBindAddress would read back as 0.0.0.0:10256`,
		`--config-sync-period=0s cannot be written: a KubeProxyConfiguration's configSyncPeriod would read back as 15m0s`,
	} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v, want it to say %s", err, want)
		}
	}
	if _, serr := os.Stat(c.WriteConfigTo); serr == nil {
		t.Error("a file that does not stand for the options was written")
	}
}

// TestUnknownFields: every field the file has that a KubeProxyConfiguration
// has not is named, with its path, not only the first; a kubeadm file has
// none.
func TestUnknownFields(t *testing.T) {
	parse := func(s string) map[string]any {
		var m map[string]any
		if err := yaml.Unmarshal([]byte(s), &m); err != nil {
			t.Fatal(err)
		}
		return m
	}
	typ := reflect.TypeFor[kubeproxyv1alpha1.KubeProxyConfiguration]()
	if got := unknownFields(parse(kubeadmConfig), typ, ""); len(got) != 0 {
		t.Errorf("a kubeadm file has unknown fields %q", got)
	}
	got := unknownFields(parse(`apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: userspace
foo: bar
iptables: {syncPeriodd: 10s, minSyncPeriod: 1s}
clientConnection: {qpss: 3}
logging: {verbosity: 2, options: {text: {splitStream: true, bogus: 1}}}
`), typ, "")
	want := []string{"clientConnection.qpss", "foo", "iptables.syncPeriodd", "logging.options.text.bogus"}
	if !slices.Equal(got, want) {
		t.Errorf("unknown fields %q, want %q", got, want)
	}
}

// TestConfigz: /configz answers as kube-proxy's does, the effective
// configuration as JSON under its API group's name, with the file's values
// and kube-proxy's defaults for the rest.
func TestConfigz(t *testing.T) {
	c, err := loadConfig(t, kubeadmConfig)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	m := newMetrics(&userspace.Stats{}, []string{"IPv4"})
	if m.configz, err = c.configzBody(3); err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	m.handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/configz", nil))
	if rec.Code != http.StatusOK || rec.Header().Get("Content-Type") != "application/json" {
		t.Fatalf("/configz: %d %q", rec.Code, rec.Header().Get("Content-Type"))
	}
	var got map[string]kubeproxyv1alpha1.KubeProxyConfiguration
	if err := json.Unmarshal(rec.Body.Bytes(), &got); err != nil {
		t.Fatalf("/configz: %v\n%s", err, rec.Body)
	}
	kp, ok := got["kubeproxy.config.k8s.io"]
	if !ok || len(got) != 1 {
		t.Fatalf("/configz keys: %v, want kubeproxy.config.k8s.io alone", slices.Collect(maps.Keys(got)))
	}
	checks := []struct {
		name      string
		got, want any
	}{
		{"mode", string(kp.Mode), "userspace"},
		{"kubeconfig", kp.ClientConnection.Kubeconfig, "/var/lib/kube-proxy/kubeconfig.conf"},
		{"qps", kp.ClientConnection.QPS, float32(7)},
		{"healthz (defaulted)", kp.HealthzBindAddress, "0.0.0.0:10256"},
		{"sync period", kp.IPTables.SyncPeriod.Duration, 45 * time.Second},
		{"port range", kp.PortRange, "36000-37999"},
		{"cluster CIDR", kp.ClusterCIDR, "10.244.0.0/16"},
		{"verbosity", int(kp.Logging.Verbosity), 3},
		{"hostname", kp.HostnameOverride, "node-from-file"},
		{"localhost node ports (defaulted)", kp.IPTables.LocalhostNodePorts != nil && *kp.IPTables.LocalhostNodePorts, true},
	}
	for _, ck := range checks {
		if ck.got != ck.want {
			t.Errorf("%s = %v, want %v", ck.name, ck.got, ck.want)
		}
	}
	// kubernetes_build_info is served beside it.
	rec = httptest.NewRecorder()
	m.handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	if !regexp.MustCompile(`(?m)^kubernetes_build_info\{.*git_version="[^"]+".*go_version="go1\.[^"]*".*\} 1$`).MatchString(rec.Body.String()) {
		t.Errorf("no kubernetes_build_info in /metrics:\n%s", rec.Body)
	}
}

// TestAcceptContentTypes: the file's clientConnection.acceptContentTypes,
// which kube-proxy's API client sends as its Accept header, is kept: /configz
// shows it and --write-config-to writes it, to be read back the same.
func TestAcceptContentTypes(t *testing.T) {
	const accept = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"
	file := strings.Replace(kubeadmConfig, `acceptContentTypes: ""`, `acceptContentTypes: "`+accept+`"`, 1)
	c := validConfig(t, file)
	if c.KubeAPIAcceptContentTypes != accept {
		t.Errorf("accept content types %q, want the file's %q", c.KubeAPIAcceptContentTypes, accept)
	}
	body, got := configzOf(t, c)
	if a := got["kubeproxy.config.k8s.io"].ClientConnection.AcceptContentTypes; a != accept {
		t.Errorf("/configz acceptContentTypes %q, want %q:\n%s", a, accept, body)
	}
	data := writtenConfig(t, c)
	back, err := loadConfig(t, string(data))
	if err != nil {
		t.Fatal(err)
	}
	if back.KubeAPIAcceptContentTypes != accept {
		t.Errorf("--write-config-to wrote acceptContentTypes as %q, want %q:\n%s", back.KubeAPIAcceptContentTypes, accept, data)
	}
}

// TestConfigzHostnameOverride: as kube-proxy stores it, the host name
// override is trimmed and lower-cased: /configz and --write-config-to show
// the node name that is used.
func TestConfigzHostnameOverride(t *testing.T) {
	head := "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n"
	for _, tc := range []struct {
		name, file string
		args       []string
	}{
		{"flag", "", []string{"--hostname-override= Node-A "}},
		{"file", head + "hostnameOverride: \" Node-A \"\n", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := validConfig(t, tc.file, tc.args...)
			_, got := configzOf(t, c)
			if h := got["kubeproxy.config.k8s.io"].HostnameOverride; h != "node-a" {
				t.Errorf("/configz hostnameOverride %q, want node-a", h)
			}
			data := writtenConfig(t, c)
			if !strings.Contains(string(data), "\nhostnameOverride: node-a\n") {
				t.Errorf("--write-config-to does not write hostnameOverride: node-a:\n%s", data)
			}
		})
	}
}

// TestConfigzHasWrittenFields: /configz shows every field --write-config-to
// writes, with the same value (the effective one), udpIdleTimeout among
// them, with and without a --udp-timeout.
func TestConfigzHasWrittenFields(t *testing.T) {
	for _, args := range [][]string{
		nil,
		{"--kubeconfig=/etc/kup/kubeconfig", "--kube-api-qps=7.5", "--kube-api-burst=30", "--config-sync-period=10m",
			"--bind-address=::", "--healthz-bind-address=[::]:9000", "--nodeport-addresses=127.0.0.0/8", "--cluster-cidr=198.18.0.0/16",
			"--iptables-sync-period=1m", "--proxy-port-range=36000+99", "--udp-timeout=1s", "--hostname-override=node-a",
			"--iptables-localhost-nodeports=false", "--vmodule=proxier=4"},
	} {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			c, err := loadConfig(t, "", args...)
			if err != nil {
				t.Fatal(err)
			}
			if err := c.Validate(); err != nil {
				t.Fatal(err)
			}
			written, err := c.marshalKubeProxyConfig(2)
			if err != nil {
				t.Fatal(err)
			}
			body, err := c.configzBody(2)
			if err != nil {
				t.Fatal(err)
			}
			var file map[string]any
			if err := yaml.Unmarshal(written, &file); err != nil {
				t.Fatal(err)
			}
			var configz map[string]map[string]any
			if err := json.Unmarshal(body, &configz); err != nil {
				t.Fatal(err)
			}
			want, got := flatten("", file), flatten("", configz["kubeproxy.config.k8s.io"])
			for _, k := range slices.Sorted(maps.Keys(want)) {
				if k == "apiVersion" || k == "kind" {
					continue // configz names the group instead, as kube-proxy's does
				}
				if g, ok := got[k]; !ok || g != want[k] {
					t.Errorf("/configz has %s = %q (present: %v); --write-config-to writes %q", k, g, ok, want[k])
				}
			}
			if udp := got["udpIdleTimeout"]; udp != c.UDPIdleTimeout.String() {
				t.Errorf("/configz udpIdleTimeout = %q, want the effective --udp-timeout %v", udp, c.UDPIdleTimeout)
			}
		})
	}
}

// flatten lists the leaves of m by dotted path, each value printed.
func flatten(prefix string, m map[string]any) map[string]string {
	out := make(map[string]string)
	for k, v := range m {
		if sub, ok := v.(map[string]any); ok {
			maps.Copy(out, flatten(prefix+k+".", sub))
			continue
		}
		out[prefix+k] = fmt.Sprint(v)
	}
	return out
}

// TestClientMetrics: client-go's request metrics reach /metrics under
// kube-proxy's names and labels.
func TestClientMetrics(t *testing.T) {
	m := newMetrics(&userspace.Stats{}, []string{"IPv4"})
	u := url.URL{Scheme: "https", Host: "192.0.2.1:6443", Path: "/api/v1/services"}
	clientmetrics.RequestLatency.Observe(context.Background(), "GET", u, 30*time.Millisecond)
	clientmetrics.RequestResult.Increment(context.Background(), "200", "GET", u.Host)
	rec := httptest.NewRecorder()
	m.handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	for _, want := range []string{ // counts add up over -count=N
		`rest_client_request_duration_seconds_bucket\{host="192\.0\.2\.1:6443",verb="GET",le="0\.1"\} [1-9]`,
		`rest_client_requests_total\{code="200",host="192\.0\.2\.1:6443",method="GET"\} [1-9]`,
	} {
		if !regexp.MustCompile(want).MatchString(rec.Body.String()) {
			t.Errorf("/metrics has no %s:\n%s", want, rec.Body)
		}
	}
}

// TestConfigzCommandLineVModule: /configz shows a command-line --vmodule
// as logging.vmodule, as it shows the file's, with or without --config.
func TestConfigzCommandLineVModule(t *testing.T) {
	for _, file := range []string{"", kubeadmConfig} {
		c, err := loadConfig(t, file, "--vmodule=proxier=4,sync*=2")
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Validate(); err != nil {
			t.Fatal(err)
		}
		_, got := configzOf(t, c)
		vm := got["kubeproxy.config.k8s.io"].Logging.VModule
		if len(vm) != 2 || vm[0].FilePattern != "proxier" || vm[0].Verbosity != 4 || vm[1].FilePattern != "sync*" || vm[1].Verbosity != 2 {
			t.Errorf("with --config %v: logging.vmodule = %+v, want proxier=4,sync*=2", file != "", vm)
		}
	}
}

// A detectLocalMode this proxy does not support (NodeCIDR on GKE) leaves
// the cluster CIDR telling pod traffic apart, in a --config file as with
// --detect-local-mode and --cluster-cidr: the two gave different answers,
// the file dropping the CIDR.
func TestUnsupportedDetectLocalModeKeepsTheClusterCIDR(t *testing.T) {
	for _, mode := range []string{"NodeCIDR", "BridgeInterface", "InterfaceNamePrefix"} {
		file := validConfig(t, strings.Replace(kubeadmConfig, `detectLocalMode: ""`, "detectLocalMode: "+mode, 1))
		flags := validConfig(t, "", "--detect-local-mode="+mode, "--cluster-cidr=10.244.0.0/16")
		for name, c := range map[string]*Config{"file": file, "flags": flags} {
			if c.ClusterCIDR != "10.244.0.0/16" || len(c.podCIDRs) != 1 || c.podCIDRs[0] != netip.MustParsePrefix("10.244.0.0/16") {
				t.Errorf("%s, detectLocalMode %s: cluster CIDR %q (%v), want 10.244.0.0/16", name, mode, c.ClusterCIDR, c.podCIDRs)
			}
		}
	}
}
