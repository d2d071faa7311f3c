package proxyserver

import (
	"flag"
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
	for _, want := range []string{`FLAG: --hostname-override="node-a"`, `FLAG: --masquerade-all="true"`, `FLAG: --healthz-bind-address="0.0.0.0:10256"`} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("the log does not say %s:\n%s", want, buf.String())
		}
	}
}
