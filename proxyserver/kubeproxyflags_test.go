package proxyserver

import (
	"flag"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/spf13/pflag"
	"k8s.io/klog/v2"
)

// TestUsage: -h says what the program is above its flags, and shows
// --version as kube-proxy's does, "--version version[=true]".
func TestUsage(t *testing.T) {
	fs := pflag.NewFlagSet("kube-userspace-proxy", pflag.ContinueOnError)
	NewConfig().AddFlags(fs)
	AddVersionFlag(fs)
	SetUsage(fs)
	var out strings.Builder
	fs.SetOutput(&out)
	if err := fs.Parse([]string{"-h"}); err != pflag.ErrHelp {
		t.Fatalf("-h: %v", err)
	}
	if !strings.HasPrefix(out.String(), Description+"\n\nUsage:\n  kube-userspace-proxy [flags]\n\nFlags:\n") {
		t.Errorf("-h does not start with the description and usage:\n%s", out.String())
	}
	line := ""
	for _, l := range strings.Split(out.String(), "\n") {
		if strings.Contains(l, "--version") && strings.HasPrefix(strings.TrimSpace(l), "--version") {
			line = l
		}
	}
	if !strings.Contains(line, "--version version[=true]") || strings.Contains(line, "default") {
		t.Errorf("-h shows --version as %q, want --version version[=true] without a default", line)
	}
}

// TestVersionFlag: --version takes what kube-proxy's takes; a version to
// report instead is kept as given, for main to refuse.
func TestVersionFlag(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "false"},
		{[]string{"--version"}, "true"},
		{[]string{"--version=raw"}, "raw"},
		{[]string{"--version=false"}, "false"},
		{[]string{"--version=1"}, "true"},
		{[]string{"--version=v1.37.2"}, "v1.37.2"},
	} {
		fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
		v := AddVersionFlag(fs)
		if err := fs.Parse(tc.args); err != nil || string(*v) != tc.want {
			t.Errorf("%q: %v, %v; want %s", tc.args, *v, err, tc.want)
		}
	}
}

// TestLogFlags: at -v=1 every flag is logged as kube-proxy logs it,
// FLAG: --name="value"; at -v=0 none.
func TestLogFlags(t *testing.T) {
	var klogFlags flag.FlagSet
	klog.InitFlags(&klogFlags)
	var buf strings.Builder
	klog.LogToStderr(false)
	klog.SetOutput(&buf)
	t.Cleanup(func() {
		_ = klogFlags.Set("v", "0")
		klog.LogToStderr(true)
	})
	fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
	NewConfig().AddFlags(fs)
	if err := fs.Parse([]string{"--hostname-override=node-a", "--masquerade-all"}); err != nil {
		t.Fatal(err)
	}
	LogFlags(fs)
	klog.Flush()
	if buf.Len() != 0 {
		t.Errorf("flags logged at -v=0:\n%s", buf.String())
	}
	_ = klogFlags.Set("v", "1")
	LogFlags(fs)
	klog.Flush()
	// kube-proxy's flags that are ignored here show kube-proxy's defaults.
	for _, want := range []string{`FLAG: --hostname-override="node-a"`, `FLAG: --masquerade-all="true"`, `FLAG: --healthz-bind-address="0.0.0.0:10256"`,
		`FLAG: --oom-score-adj="-999"`, `FLAG: --iptables-masquerade-bit="14"`, `FLAG: --conntrack-min="131072"`, `FLAG: --conntrack-max-per-core="32768"`,
		`FLAG: --conntrack-tcp-timeout-established="24h0m0s"`, `FLAG: --conntrack-tcp-timeout-close-wait="1h0m0s"`, `FLAG: --healthz-port="10256"`,
		`FLAG: --metrics-port="10249"`, `FLAG: --logging-format="text"`, `FLAG: --log-flush-frequency="5s"`, `FLAG: --ipvs-sync-period="30s"`} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("the log does not say %s:\n%s", want, buf.String())
		}
	}
}

// captureLog sends klog's output to the returned buffer, one copy of each
// line, for the rest of the test.
func captureLog(t *testing.T) *strings.Builder {
	t.Helper()
	var buf strings.Builder
	klog.LogToStderr(false)
	klog.SetOutput(&buf)
	// An error line goes to the INFO and WARNING logs too: keep one copy.
	klog.SetOutputBySeverity("WARNING", io.Discard)
	klog.SetOutputBySeverity("ERROR", io.Discard)
	t.Cleanup(func() { klog.LogToStderr(true) })
	return &buf
}

// TestDeprecatedPortFlags: --healthz-port and --metrics-port do what they
// do in kube-proxy (options.go, Complete): without --config, port 0 turns
// the server off and a port is joined to an address flag that gives an IP
// alone; an address with a port keeps it. The log says the flag is
// deprecated, as kube-proxy prints, and does not call it meaningless.
func TestDeprecatedPortFlags(t *testing.T) {
	for _, tc := range []struct {
		name             string
		args             []string
		healthz, metrics string // as served; "" is off
		err              string // substring of Validate's error
	}{
		{name: "none", healthz: "0.0.0.0:10256", metrics: "127.0.0.1:10249"},
		{name: "both off", args: []string{"--healthz-port=0", "--metrics-port=0"}},
		{name: "off with an address", args: []string{"--healthz-bind-address=127.0.0.1:46120", "--healthz-port=0"}, metrics: "127.0.0.1:10249"},
		{name: "joined to an IP", args: []string{"--healthz-bind-address=127.0.0.1", "--healthz-port=46120", "--metrics-bind-address="},
			healthz: "127.0.0.1:46120"},
		{name: "joined to an IPv6 address", args: []string{"--healthz-bind-address=::1", "--healthz-port=46120", "--metrics-bind-address=[::1]", "--metrics-port=46121"},
			healthz: "[::1]:46120", metrics: "[::1]:46121"},
		{name: "an address with its port keeps it", args: []string{"--healthz-port=46120", "--metrics-bind-address=127.0.0.1:46122", "--metrics-port=46121"},
			healthz: "0.0.0.0:10256", metrics: "127.0.0.1:46122"},
		{name: "an empty address stays off", args: []string{"--metrics-bind-address=", "--metrics-port=46121"}, healthz: "0.0.0.0:10256"},
		{name: "port zero frees the metrics address", args: []string{"--healthz-bind-address=127.0.0.1:10249", "--metrics-port=0"}, healthz: "127.0.0.1:10249"},
		{name: "not a port", args: []string{"--healthz-bind-address=127.0.0.1", "--healthz-port=70000"},
			err: "--healthz-port: 70000 is not a port to join to --healthz-bind-address=127.0.0.1"},
		{name: "not a port, unused", args: []string{"--healthz-port=70000"}, healthz: "0.0.0.0:10256", metrics: "127.0.0.1:10249"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			buf := captureLog(t)
			c := NewConfig()
			fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
			c.AddFlags(fs)
			if err := fs.Parse(append([]string{"--manifests=x"}, tc.args...)); err != nil {
				t.Fatal(err)
			}
			// As main: LoadConfigFile applies them (kube-proxy's
			// Complete), and Validate checks the result.
			err := c.LoadConfigFile(fs)
			if err == nil {
				err = c.Validate()
			}
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("Validate: %v, want an error saying %s", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if c.healthz != tc.healthz || c.metrics != tc.metrics {
				t.Errorf("healthz %q, metrics %q; want %q, %q", c.healthz, c.metrics, tc.healthz, tc.metrics)
			}
			if got := c.ignoredKubeProxyFlags(); len(got) > 0 {
				t.Errorf("named as ignored: %v", got)
			}
			klog.Flush()
			for _, name := range []string{"healthz", "metrics"} {
				given := slices.ContainsFunc(tc.args, func(a string) bool { return strings.HasPrefix(a, "--"+name+"-port=") })
				said := strings.Contains(buf.String(), `"Flag --`+name+`-port has been deprecated, as in kube-proxy: use --`+name+`-bind-address instead"`)
				if given != said {
					t.Errorf("--%s-port given: %v, but the log says it is deprecated: %v\n%s", name, given, said, buf.String())
				}
			}
		})
	}
}

// TestDeprecatedPortFlagsWithConfig: with --config, as in kube-proxy, the
// file's addresses stand and the log says the flags are ignored.
func TestDeprecatedPortFlagsWithConfig(t *testing.T) {
	buf := captureLog(t)
	c := validConfig(t, kubeadmConfig, "--healthz-port=0", "--metrics-port=46121")
	if c.healthz == "" || c.metrics == "" || strings.HasSuffix(c.metrics, ":46121") {
		t.Errorf("healthz %q, metrics %q: want the file's", c.healthz, c.metrics)
	}
	klog.Flush()
	for _, want := range []string{
		`"Flag --healthz-port has been deprecated, as in kube-proxy: use --healthz-bind-address instead; with --config it is ignored: the file's healthzBindAddress sets the address" port=0`,
		`"Flag --metrics-port has been deprecated, as in kube-proxy: use --metrics-bind-address instead; with --config it is ignored: the file's metricsBindAddress sets the address" port=46121`,
	} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("the log does not say %s:\n%s", want, buf.String())
		}
	}
	if strings.Contains(buf.String(), "no use for") {
		t.Errorf("the flags are called meaningless:\n%s", buf.String())
	}
}

// TestDeprecatedPortFlagsWritten: --write-config-to writes the address
// flags as given, without --healthz-port and --metrics-port, as
// kube-proxy's does (it applies them only without --config and
// --write-config-to), and says so; it does not ask for them beside
// --config, which ignores them. It wrote the address the port led to.
func TestDeprecatedPortFlagsWritten(t *testing.T) {
	buf := captureLog(t)
	path := filepath.Join(t.TempDir(), "written.yaml")
	c, err := loadConfig(t, "", "--write-config-to="+path, "--metrics-bind-address=127.0.0.1", "--metrics-port=46121", "--healthz-port=0")
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	keep, err := c.WriteConfigFile(0)
	if err != nil || len(keep) > 0 {
		t.Fatalf("flags to keep %q, %v; want none", keep, err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"metricsBindAddress: 127.0.0.1\n", "healthzBindAddress: 0.0.0.0:10256\n"} {
		if !strings.Contains(string(data), want) {
			t.Errorf("the file does not hold %s:\n%s", strings.TrimSpace(want), data)
		}
	}
	klog.Flush()
	for _, name := range []string{"healthz", "metrics"} {
		want := `"Flag --` + name + `-port has been deprecated, as in kube-proxy: use --` + name + `-bind-address instead; --write-config-to does not write it, as kube-proxy's does not: the file holds --` + name + `-bind-address as given"`
		if !strings.Contains(buf.String(), want) {
			t.Errorf("the log does not say %s:\n%s", want, buf.String())
		}
	}
}
