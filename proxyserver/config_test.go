package proxyserver

import (
	"fmt"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
)

func TestValidate(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want string // substring of the error; empty means valid
	}{
		{name: "defaults with a file", args: []string{"--manifests", "x.yaml"}},
		// Each bound from both sides where both are meant: kube-proxy
		// takes 0 for the API client's QPS and burst (only a negative one
		// is refused) and a minimum sync period of 0 or equal to the sync
		// period; the data plane's timeouts must be greater than 0,
		// --udp-max-sessions is positive or -1; --manifests stands alone
		// beside --master as beside --kubeconfig, and without --config the
		// error does not speak of a file.
		{name: "qps and burst 0", args: []string{"--manifests=x.yaml", "--kube-api-qps=0", "--kube-api-burst=0"}},
		{name: "negative qps", args: []string{"--manifests=x.yaml", "--kube-api-qps=-0.5"}, want: "--kube-api-qps: must not be negative, got -0.5"},
		{name: "negative burst", args: []string{"--manifests=x.yaml", "--kube-api-burst=-1"}, want: "--kube-api-burst: must not be negative, got -1"},
		{name: "udp timeout 0", args: []string{"--manifests=x.yaml", "--udp-timeout=0s"}, want: "--udp-timeout: must be greater than 0, got 0s"},
		{name: "udp reply timeout 0", args: []string{"--manifests=x.yaml", "--udp-reply-timeout=0s"}, want: "--udp-reply-timeout: must be greater than 0, got 0s"},
		{name: "udp sessions -2", args: []string{"--manifests=x.yaml", "--udp-max-sessions=-2"}, want: "--udp-max-sessions: must be a positive number or -1, got -2"},
		{name: "udp sessions 1", args: []string{"--manifests=x.yaml", "--udp-max-sessions=1"}},
		{name: "half-close timeout 0", args: []string{"--manifests=x.yaml", "--tcp-half-close-timeout=0s"}, want: "--tcp-half-close-timeout: must be greater than 0, got 0s"},
		{name: "min sync period 0", args: []string{"--manifests=x.yaml", "--iptables-min-sync-period=0s"}},
		{name: "negative min sync period", args: []string{"--manifests=x.yaml", "--iptables-min-sync-period=-1s"}, want: "--iptables-min-sync-period: must not be negative, got -1s"},
		{name: "min sync period equal to sync period", args: []string{"--manifests=x.yaml", "--iptables-min-sync-period=30s", "--iptables-sync-period=30s"}},
		{name: "manifests and master", args: []string{"--manifests=x.yaml", "--master=https://192.0.2.1:6443"},
			want: "--manifests and --kubeconfig/--master both name a source of services: give one"},
		{name: "manifests and kubeconfig without a file", args: []string{"--manifests=x.yaml", "--kubeconfig=/k"},
			want: "--manifests and --kubeconfig/--master both name a source of services: give one"},
		{name: "all good", args: []string{"--manifests", "x.yaml", "--bind-address", "::", "--proxy-port-range", "30000+99",
			"--nodeport-addresses", "127.0.0.0/8, 10.0.0.0/8", "--udp-max-sessions", "-1", "--portal", "none"}},
		{name: "two sources", args: []string{"--manifests", "x", "--kubeconfig", "k"}, want: "give one"},
		{name: "bind address", args: []string{"--manifests", "x", "--bind-address", "0.0.0.0:1"}, want: "--bind-address"},
		{name: "port range", args: []string{"--manifests", "x", "--proxy-port-range", "1-2-3"}, want: "--proxy-port-range"},
		// As kube-proxy's: spaces around the dash are refused, named.
		{name: "port range with spaces", args: []string{"--manifests", "x", "--proxy-port-range", "30000 - 30100"},
			want: `--proxy-port-range: invalid port range "30000 - 30100": no spaces are allowed within it`},
		{name: "cidr", args: []string{"--manifests", "x", "--nodeport-addresses", "10.0.0.0/33"}, want: "--nodeport-addresses"},
		{name: "portal", args: []string{"--manifests", "x", "--portal", "magic"}, want: `"magic" is not a portal mode`},
		{name: "udp sessions", args: []string{"--manifests", "x", "--udp-max-sessions", "0"}, want: "--udp-max-sessions"},
		{name: "sync period", args: []string{"--manifests", "x", "--iptables-sync-period", "0s"}, want: "--iptables-sync-period"},
		{name: "min sync period above sync period", args: []string{"--manifests", "x", "--iptables-min-sync-period", "5m", "--iptables-sync-period", "30s"},
			want: "--iptables-sync-period: must not be less than the minimum sync period (5m0s), got 30s"},
		{name: "several at once", args: []string{"--bind-address", "nope", "--udp-timeout", "-1s"}, want: "--udp-timeout"},
		{name: "content type", args: []string{"--kube-api-content-type", "text/plain"}, want: "--kube-api-content-type"},
		{name: "hostname", args: []string{"--manifests", "x", "--hostname-override", " Node-1 "}},
		{name: "blank hostname", args: []string{"--manifests", "x", "--hostname-override", " "}, want: `--hostname-override: " " is blank`},
		{name: "cluster CIDRs", args: []string{"--manifests", "x", "--cluster-cidr", "10.244.0.0/16, fd00:10:244::/56"}},
		{name: "cluster CIDR", args: []string{"--manifests", "x", "--cluster-cidr", "10.244.0.0"}, want: `--cluster-cidr: "10.244.0.0" is not a CIDR`},
		{name: "three cluster CIDRs", args: []string{"--manifests", "x", "--cluster-cidr", "10.244.0.0/16,fd00:10:244::/56,10.245.0.0/16"},
			want: `--cluster-cidr: "10.244.0.0/16,fd00:10:244::/56,10.245.0.0/16" has 3 CIDRs: give at most two, one IPv4 and one IPv6`},
		{name: "two IPv4 cluster CIDRs", args: []string{"--manifests", "x", "--cluster-cidr", "10.244.0.0/16,10.245.0.0/16"},
			want: `--cluster-cidr: "10.244.0.0/16,10.245.0.0/16" is not a dual-stack pair`},
		{name: "two IPv6 cluster CIDRs", args: []string{"--manifests", "x", "--cluster-cidr", "fd00:1::/56,fd00:2::/56"}, want: "is not a dual-stack pair"},
		// As kube-proxy's ParseCIDRSloppy: leading zeros are decimal.
		{name: "cluster CIDR with leading zeros", args: []string{"--manifests", "x", "--cluster-cidr", "010.000.0.0/8"}},
		{name: "node port CIDR with leading zeros", args: []string{"--manifests", "x", "--nodeport-addresses", "127.000.000.001/32"}},
		// As kube-proxy: an empty entry is no CIDR.
		{name: "cluster CIDR with a trailing comma", args: []string{"--manifests", "x", "--cluster-cidr", "10.0.0.0/8,"},
			want: `--cluster-cidr: "10.0.0.0/8," has an empty entry`},
		{name: "cluster CIDRs with an empty entry", args: []string{"--manifests", "x", "--cluster-cidr", "10.0.0.0/8,,fd00::/48"}, want: "has an empty entry"},
		{name: "IPv6 then IPv4 cluster CIDRs", args: []string{"--manifests", "x", "--cluster-cidr", "fd00:10:244::/56,10.244.0.0/16"}},
		{name: "healthz off", args: []string{"--manifests", "x", "--healthz-bind-address="}},
		{name: "healthz IPv6", args: []string{"--manifests", "x", "--healthz-bind-address=[::1]:10256"}},
		{name: "healthz IP alone", args: []string{"--manifests", "x", "--healthz-bind-address=127.0.0.1"}},
		{name: "healthz no IP", args: []string{"--manifests", "x", "--healthz-bind-address=:10256"}, want: `--healthz-bind-address: ":10256" is not an IP address with a port`},
		{name: "healthz port", args: []string{"--manifests", "x", "--healthz-bind-address=127.0.0.1:70000"}, want: "--healthz-bind-address"},
		{name: "metrics", args: []string{"--manifests", "x", "--metrics-bind-address=localhost:10249"}, want: `--metrics-bind-address: "localhost:10249" is not an IP address with a port, such as 0.0.0.0:10249`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := NewConfig()
			fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
			c.AddFlags(fs)
			if err := fs.Parse(tc.args); err != nil {
				t.Fatal(err)
			}
			err := c.Validate()
			if tc.want == "" {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Validate error = %v, want it to mention %q", err, tc.want)
			}
		})
	}
}

func TestValidateParses(t *testing.T) {
	c := NewConfig()
	c.Manifests = "x"
	c.NodePortAddresses = []string{"127.0.0.1/8"}
	c.ProxyPortRange = "40000-40009"
	c.UDPIdleTimeout = time.Second
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	pc := c.proxierConfig(PortalNone)
	if got := fmt.Sprint(pc.NodePortAddresses); got != "[127.0.0.0/8 ::/0]" {
		t.Errorf("node port prefixes = %s, want [127.0.0.0/8 ::/0]: masked, and IPv6 (no CIDR of it) everywhere, as kube-proxy reads them", got)
	}
	if pc.PortRange.Base != 40000 || pc.PortRange.Size != 10 {
		t.Errorf("port range = %+v", pc.PortRange)
	}
	if !pc.ServeNodePorts || pc.UDPIdleTimeout != time.Second {
		t.Errorf("proxier config = %+v", pc)
	}
	for in, want := range map[string]string{"": "", "0.0.0.0:10256": "0.0.0.0:10256", "::": "[::]:10256", "[::1]": "[::1]:10256", " 127.0.0.1:0 ": "127.0.0.1:0"} {
		c.HealthzBindAddress = in
		if err := c.Validate(); err != nil || c.healthz != want {
			t.Errorf("--healthz-bind-address=%q: %q, %v; want %q", in, c.healthz, err, want)
		}
	}
	c.MetricsBindAddress = "0.0.0.0"
	if err := c.Validate(); err != nil || c.metrics != "0.0.0.0:10249" {
		t.Errorf("--metrics-bind-address=0.0.0.0: %q, %v", c.metrics, err)
	}
}

// FuzzValidate feeds arbitrary flag values to Validate: it must never panic,
// and what it accepts must parse back into sane values.
func FuzzValidate(f *testing.F) {
	f.Add("0.0.0.0", "30000-30010", "127.0.0.0/8", "auto")
	f.Add("::", "", "", "none")
	f.Add("1.2.3.4:5", "9-1", "10.0.0.0/33,", "x")
	f.Fuzz(func(t *testing.T, bind, portRange, nodePorts, portal string) {
		c := NewConfig()
		c.Manifests = "x.yaml"
		c.BindAddress, c.ProxyPortRange, c.Portal = bind, portRange, portal
		c.NodePortAddresses = strings.Split(nodePorts, ",")
		if err := c.Validate(); err != nil {
			return
		}
		pc := c.proxierConfig(PortalNone)
		if !pc.BindAddress.IsValid() {
			t.Fatalf("accepted bind address %q parsed to nothing", bind)
		}
		for _, p := range pc.NodePortAddresses {
			if !p.IsValid() || p != p.Masked() {
				t.Fatalf("accepted node port prefix %v is not a masked CIDR", p)
			}
		}
		if pc.PortRange.Size > 0 && int(pc.PortRange.Base)+pc.PortRange.Size-1 > 65535 {
			t.Fatalf("accepted port range %q runs past 65535", portRange)
		}
	})
}

// TestKubeProxyFlags: a kube-proxy DaemonSet's command line runs the proxy
// as it is: kube-proxy's flags that mean nothing here are accepted (with
// their types checked) and listed as ignored, and --proxy-mode takes
// userspace; another mode is refused, naming the flag.
func TestKubeProxyFlags(t *testing.T) {
	parse := func(args ...string) (*Config, error) {
		c := NewConfig()
		fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
		c.AddFlags(fs)
		if err := fs.Parse(append([]string{"--manifests", "x"}, args...)); err != nil {
			return c, err
		}
		return c, c.Validate()
	}
	c, err := parse("--proxy-mode=userspace", "--feature-gates=Foo=true", "--conntrack-max-per-core=0", "--masquerade-all",
		"--oom-score-adj=-998", "--logging-format=text", "--ipvs-exclude-cidrs=10.0.0.0/8,10.1.0.0/16", "--conntrack-tcp-timeout-established=24h", "--detect-local-mode=ClusterCIDR", "--log-json-split-stream")
	if err != nil {
		t.Fatalf("kube-proxy's flags: %v", err)
	}
	want := []string{"--conntrack-max-per-core", "--conntrack-tcp-timeout-established", "--detect-local-mode", "--feature-gates", "--ipvs-exclude-cidrs", "--log-json-split-stream", "--logging-format", "--masquerade-all", "--oom-score-adj"}
	if got := c.ignoredKubeProxyFlags(); !slices.Equal(got, want) {
		t.Errorf("ignored flags %v, want %v", got, want)
	}
	if c, err := parse(); err != nil || c.ignoredKubeProxyFlags() != nil {
		t.Errorf("no kube-proxy flags: %v, ignored %v", err, c.ignoredKubeProxyFlags())
	}
	for _, tc := range []struct{ arg, want string }{
		{"--proxy-mode=iptables", `--proxy-mode: "iptables" is one of kube-proxy's own modes; this proxy is mode "userspace" (set --proxy-mode=userspace, or leave it out)`},
		{"--proxy-mode=fast", `--proxy-mode: "fast" is not a mode`},
		{"--conntrack-max-per-core=lots", "conntrack-max-per-core"},
		{"--conntrack-udp-timeout=5", "conntrack-udp-timeout"},
		{"--detect-local-mode=Bogus", `--detect-local-mode: "Bogus" is not a mode`},
	} {
		if _, err := parse(tc.arg); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error with %q", tc.arg, err, tc.want)
		}
	}
	// Hidden: --help shows this proxy's own flags.
	fs := pflag.NewFlagSet("help", pflag.ContinueOnError)
	NewConfig().AddFlags(fs)
	if usage := fs.FlagUsages(); strings.Contains(usage, "conntrack") || strings.Contains(usage, "proxy-mode") {
		t.Errorf("--help lists kube-proxy's ignored flags:\n%s", usage)
	}
}

// TestServerAddr: the health and metrics addresses take ip:port or an IP
// alone, IPv6 in brackets, with a zone or not.
func TestServerAddr(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"127.0.0.1:10300", "127.0.0.1:10300"},
		{"127.0.0.1", "127.0.0.1:10256"},
		{"::1", "[::1]:10256"},
		{"[::1]", "[::1]:10256"},
		{"[::]:10300", "[::]:10300"},
		{"[fe80::1%lo]:10300", "[fe80::1%lo]:10300"},
		{"fe80::1%lo", "[fe80::1%lo]:10256"},
		{"[fe80::1%lo]", "[fe80::1%lo]:10256"},
		{"", ""},
	} {
		if got, err := serverAddr(tc.in, 10256); err != nil || got != tc.want {
			t.Errorf("serverAddr(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
	for _, bad := range []string{"localhost:10256", ":10256", "[fe80::1%lo]:10256]", "1.2.3.4:99999"} {
		if got, err := serverAddr(bad, 10256); err == nil {
			t.Errorf("serverAddr(%q) = %q, want an error", bad, got)
		}
	}
}

// TestClusterCIDRSloppy: 010.000.0.0/8 reads as kube-proxy reads it,
// 10.0.0.0/8.
func TestClusterCIDRSloppy(t *testing.T) {
	c := NewConfig()
	c.Manifests, c.ClusterCIDR = "x", "010.000.0.0/8"
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if len(c.podCIDRs) != 1 || c.podCIDRs[0] != netip.MustParsePrefix("10.0.0.0/8") {
		t.Errorf("pod CIDRs %v, want [10.0.0.0/8]", c.podCIDRs)
	}
}

// TestValidateChangesNoOption: Validate only checks and parses; what
// kube-proxy applies to the options before it validates them (the
// deprecated --healthz-port and --metrics-port, the host name's case)
// LoadConfigFile has applied, as kube-proxy's Complete does. Validate
// joined the ports to the addresses and lower-cased the host name itself.
func TestValidateChangesNoOption(t *testing.T) {
	for _, tc := range []struct {
		name, file string
		args       []string
	}{
		{name: "port joined", args: []string{"--healthz-bind-address=127.0.0.1", "--healthz-port=46120", "--metrics-bind-address=::1", "--metrics-port=46121"}},
		{name: "port 0", args: []string{"--healthz-port=0", "--metrics-port=0"}},
		{name: "host name", args: []string{"--hostname-override= Node-1 "}},
		{name: "with --write-config-to", args: []string{"--write-config-to=/nonexistent/x.yaml", "--metrics-port=0", "--hostname-override=Node-1"}},
		{name: "with --config", file: kubeadmConfig, args: []string{"--healthz-port=0", "--hostname-override=Node-1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := loadConfig(t, tc.file, append([]string{"--manifests=x.yaml"}, tc.args...)...)
			if tc.file != "" {
				c.Manifests = "" // the file names a kubeconfig
			}
			if err != nil {
				t.Fatal(err)
			}
			before := exportedFields(c)
			if err := c.Validate(); err != nil {
				t.Fatal(err)
			}
			if after := exportedFields(c); after != before {
				t.Errorf("Validate changed the options:\nbefore %s\nafter  %s", before, after)
			}
		})
	}
}

// exportedFields prints c's exported fields, the options.
func exportedFields(c *Config) string {
	var b strings.Builder
	v := reflect.ValueOf(c).Elem()
	for i := range v.NumField() {
		if f := v.Type().Field(i); f.IsExported() {
			fmt.Fprintf(&b, "%s=%#v ", f.Name, v.Field(i).Interface())
		}
	}
	return b.String()
}
