package userspace

import (
	"errors"
	"flag"
	"fmt"
	"regexp"
	"testing"
	"time"

	"k8s.io/klog/v2"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/state"
)

// TestConnectionLinesUnderVModule: the per-connection lines follow
// --vmodule as the README shows it. The line that ends a connection is
// logged from another file than the one that starts it, so naming only
// the first must still give its true duration (it gave the largest
// time.Duration, measured from the zero time), and tcp*=4 gives both
// lines in either build.
func TestConnectionLinesUnderVModule(t *testing.T) {
	for _, tc := range []struct {
		vmodule   string
		wantStart bool // the start line must be logged too
	}{
		// Each build has one of these files; it logs the end (and, in
		// the goroutine build, the start).
		{"tcploop_linux=4,tcp_goroutine=4", false},
		{"tcp*=4", true},
	} {
		t.Run(tc.vmodule, func(t *testing.T) {
			logs := captureLog(t, "0")
			setVModule(t, tc.vmodule)
			be := startTCPBackend(t, "a")
			p := newTestProxier(t, Config{})
			name := spn("web", "", state.TCP)
			mustApply(t, p, state.ServicePort{Name: name, Port: 80, ClusterEndpoints: eps(be.addr())})
			start := time.Now()
			tcpWho(t, proxyAddr(t, p, name))
			var line string
			settle(t, "the end is logged", func() error {
				klog.Flush()
				if line = logs.lineWith(`"Connection ended"`); line == "" {
					return errors.New("no line yet")
				}
				return nil
			})
			m := regexp.MustCompile(`duration="([^"]+)"`).FindStringSubmatch(line)
			if m == nil {
				t.Fatalf("no duration in %s", line)
			}
			// The line rounds the duration to the millisecond, up by
			// half of one at most.
			d, err := time.ParseDuration(m[1])
			if err != nil || d > time.Since(start)+time.Millisecond/2 {
				t.Errorf("duration %q (%v), want at most the %v the connection could have lasted: %s", m[1], err, time.Since(start), line)
			}
			if tc.wantStart && logs.lineWith(`"Proxying connection"`) == "" {
				t.Error("no start line")
			}
		})
	}
}

// setVModule sets klog's --vmodule for the test.
func setVModule(t *testing.T, spec string) {
	t.Helper()
	fs := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(fs)
	if err := fs.Set("vmodule", spec); err != nil {
		t.Fatal(fmt.Errorf("vmodule %q: %w", spec, err))
	}
	t.Cleanup(func() { _ = fs.Set("vmodule", "") })
}
