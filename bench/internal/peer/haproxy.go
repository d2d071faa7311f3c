package peer

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/bench/internal/process"
)

// HAProxy 2.6 has no UDP proxying. Its maxconn is set so that 9,000 proxied
// connections (two fds each) fit in RLIMIT_NOFILE 20000 with room for the
// splice pipes, which it allocates only while data moves.
const haproxyMaxConn = 9500

func startHAProxy(_ context.Context, env Env) (*Instance, error) {
	front, err := frontends(env.Ports, false)
	if err != nil {
		return nil, err
	}
	cfg := filepath.Join(env.Dir, "haproxy.cfg")
	if err := os.WriteFile(cfg, []byte(haproxyConfig(front, env.Backends)), 0o644); err != nil {
		return nil, fmt.Errorf("peer: %w", err)
	}
	// -db: stay in the foreground as one process, so the pid we started is
	// the pid to measure and to stop.
	p, err := launch(env, "haproxy", "haproxy", "-db", "-f", cfg)
	if err != nil {
		return nil, err
	}
	return &Instance{Name: HAProxy, Front: front, procs: []*process.Process{p}}, nil
}

// haproxyConfig renders a mode tcp configuration with one frontend and one
// backend per TCP service, splicing in both directions when it pays.
func haproxyConfig(front, back Addrs) string {
	var b strings.Builder
	fmt.Fprintf(&b, `global
	maxconn %[1]d
	maxpipes 200

defaults
	mode tcp
	maxconn %[1]d
	option splice-auto
	timeout connect 5s
	timeout client 5m
	timeout server 5m
`, haproxyMaxConn)
	for _, svc := range []struct{ name, front, back string }{
		{"echo", front.Echo, back.Echo},
		{"bulk", front.Bulk, back.Bulk},
	} {
		fmt.Fprintf(&b, `
frontend %[1]s
	bind %[2]s
	default_backend %[1]s

backend %[1]s
	server %[1]s %[3]s
`, svc.name, svc.front, svc.back)
	}
	return b.String()
}
