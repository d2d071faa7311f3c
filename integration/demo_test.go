//go:build integration

package integration

import (
	"context"
	"net"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestMakeDemo runs `make demo` as a newcomer does: it must build, send
// traffic through the proxy, report what each backend served and exit 0.
// Then it runs it again with one of its node ports held by another
// program: it must stop at once and say which ports it needs.
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
