//go:build integration && linux

package integration

import (
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestBinaryHealthzListensInBothFamilies: /healthz and /metrics on an
// unspecified address (0.0.0.0, kube-proxy's default for /healthz, or
// [::]) take both families, as kube-proxy's do (netutils.MultiListen with
// "tcp": a dual-stack socket), so a node monitor or load balancer that
// checks over IPv6 reaches the default /healthz; a specific address stays
// that address alone. 0.0.0.0 took IPv4 only and [::] IPv6 only.
func TestBinaryHealthzListensInBothFamilies(t *testing.T) {
	w := newWorld(t)
	file := filepath.Join(t.TempDir(), "services.yaml")
	writeFile(t, file, hcFamilyManifest("node", "other"))
	v4, v6 := nodeOutSide, "[fd5e:b1b5:11::1]"
	for _, tc := range []struct {
		name    string
		args    []string
		logged  string            // the "Serving /healthz and /livez" line's addresses
		healthz map[string]string // host → curl's code
		metrics map[string]string
	}{
		{"0.0.0.0", []string{"--metrics-bind-address=0.0.0.0:10249"}, `addr="0.0.0.0:10256" families="IPv4,IPv6"`,
			map[string]string{v4: "200", v6: "200"}, map[string]string{v4: "200", v6: "200"}},
		{"[::]", []string{"--healthz-bind-address=[::]:10256", "--metrics-bind-address=[::]:10249"}, `addr="\[::\]:10256" families="IPv4,IPv6"`,
			map[string]string{v4: "200", v6: "200"}, map[string]string{v4: "200", v6: "200"}},
		{"specific", []string{"--healthz-bind-address=" + v4 + ":10256", "--metrics-bind-address=" + v6 + ":10249"}, `addr="198.18.11.1:10256"(\n|$)`,
			map[string]string{v4: "200", v6: "000"}, map[string]string{v4: "000", v6: "200"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			px := startNodeProxy(t, w, file, append([]string{"--portal=none"}, tc.args...)...)
			px.waitLog(0, `"Serving /healthz and /livez"`, 1, 20*time.Second)
			px.waitLog(0, `"Serving /metrics"`, 1, 20*time.Second)
			for host, code := range tc.healthz {
				if got, body := curlCodeIn(t, w.outside, "http://"+host+":10256/healthz"); got != code || code == "200" && !strings.Contains(body, `"healthy":true`) {
					t.Errorf("/healthz over %s: %s %q; want %s", host, got, body, code)
				}
			}
			for host, code := range tc.metrics {
				if got, body := curlCodeIn(t, w.outside, "http://"+host+":10249/metrics"); got != code || code == "200" && !strings.Contains(body, "kubeproxy_sync_proxy_rules_last_timestamp_seconds") {
					t.Errorf("/metrics over %s: %s (%d bytes); want %s", host, got, len(body), code)
				}
			}
			if !regexp.MustCompile(`"Serving /healthz and /livez" ` + tc.logged).MatchString(px.log()) {
				t.Errorf("the log does not say where /healthz is served (%s):\n%s", tc.logged, px.log())
			}
			if _, ok := px.terminate(10 * time.Second); !ok {
				t.Fatal("the proxy did not exit on SIGTERM")
			}
		})
	}
}
