//go:build integration && linux

package integration

import (
	"context"
	"io"
	"net"
	"net/http"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestMakeDemo runs `make demo` as a newcomer does: it must build, send
// traffic through the proxy, report what each backend served and exit 0.
// Then it runs it with the health port held by another program: it must
// not take that program's answer, or silence, for the proxy's. Then with
// one of its node ports held by another program: it must stop at once and
// say which ports it needs.
func TestMakeDemo(t *testing.T) {
	requireTool(t, "make")
	requireTool(t, "curl")
	run := func() (string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, "make", "--no-print-directory", "demo")
		cmd.Dir = ".."
		out, err := cmd.CombinedOutput()
		return string(out), err
	}

	out, err := run()
	if err != nil {
		t.Fatalf("make demo: %v\n%s", err, out)
	}
	for _, want := range []*regexp.Regexp{
		// Round robin: 12 requests over three backends, four each.
		regexp.MustCompile(`served:\s+4 hello from web-1`),
		regexp.MustCompile(`served:\s+4 hello from web-2`),
		regexp.MustCompile(`served:\s+4 hello from web-3`),
		// ClientIP affinity: all six from one backend.
		regexp.MustCompile(`served:\s+6 hello from web-\d`),
		// UDP: ten new client ports alternate over two backends.
		regexp.MustCompile(`served:\s+5 udp-1`),
		regexp.MustCompile(`served:\s+5 udp-2`),
		regexp.MustCompile(`demo: done`),
	} {
		if !want.MatchString(out) {
			t.Errorf("make demo output lacks %q:\n%s", want, out)
		}
	}

	// The health port held by another program: by a socket that never
	// answers, then by one that answers HTTP on every address (a
	// kube-proxy on 0.0.0.0:10256). The demo must not ask it, so neither
	// waits out curl's timeout (printing a stray "(HTTP 000)") nor shows
	// the other program's answer as the proxy's; it says why and goes on.
	for _, holder := range []struct {
		name string
		hold func(t *testing.T) net.Listener
	}{
		{"a socket that never answers on 127.0.0.1:10256", func(t *testing.T) net.Listener {
			ln, err := net.Listen("tcp4", "127.0.0.1:10256")
			if err != nil {
				t.Fatalf("hold the health port: %v", err)
			}
			return ln // never accepts
		}},
		{"another HTTP server on 0.0.0.0:10256", func(t *testing.T) net.Listener {
			ln, err := net.Listen("tcp4", "0.0.0.0:10256")
			if err != nil {
				t.Fatalf("hold the health port: %v", err)
			}
			go func() {
				_ = http.Serve(ln, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
					_, _ = io.WriteString(w, "somebody else's healthz\n")
				}))
			}()
			return ln
		}},
	} {
		ln := holder.hold(t)
		start := time.Now()
		out, err := run()
		took := time.Since(start)
		ln.Close()
		if err != nil {
			t.Fatalf("make demo with %s: %v\n%s", holder.name, err, out)
		}
		_, health, ok := strings.Cut(out, "== the proxy's health")
		if !ok {
			t.Fatalf("make demo with %s shows no health:\n%s", holder.name, out)
		}
		for _, bad := range []string{"HTTP 000", "somebody else's"} {
			if strings.Contains(health, bad) {
				t.Errorf("make demo with %s shows %q as the proxy's health:\n%s", holder.name, bad, health)
			}
		}
		for _, want := range []string{"not asked: the proxy does not serve 127.0.0.1:10256", "proxy: \"Cannot serve /healthz", "demo: done"} {
			if !strings.Contains(health, want) {
				t.Errorf("make demo with %s does not say %q:\n%s", holder.name, want, health)
			}
		}
		t.Logf("make demo with %s took %v", holder.name, took.Round(100*time.Millisecond))
	}

	busy, err := net.ListenPacket("udp4", "127.0.0.1:30053")
	if err != nil {
		t.Fatalf("hold the demo's UDP node port: %v", err)
	}
	defer busy.Close()
	start := time.Now()
	out, err = run()
	if err == nil {
		t.Fatalf("make demo succeeded with 30053/udp held by another program:\n%s", out)
	}
	if !strings.Contains(out, "could not open the demo's node ports") || !strings.Contains(out, "30053") {
		t.Errorf("make demo does not say which port it could not open:\n%s", out)
	}
	if d := time.Since(start); d > time.Minute {
		t.Errorf("make demo took %v to give up", d)
	}
}
