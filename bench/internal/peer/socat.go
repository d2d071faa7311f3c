package peer

import (
	"context"
	"fmt"
	"net"
)

// startSocat runs one forking socat per TCP service. socat forks a child per
// connection; the children stay in the parent's process group, so they are
// measured and stopped with it.
func startSocat(_ context.Context, env Env) (*Instance, error) {
	front, err := frontends(env.Ports, false)
	if err != nil {
		return nil, err
	}
	in := &Instance{Name: Socat, Front: front}
	for _, svc := range []struct{ name, front, back string }{
		{"socat-echo", front.Echo, env.Backends.Echo},
		{"socat-bulk", front.Bulk, env.Backends.Bulk},
	} {
		argv, err := socatArgs(svc.front, svc.back)
		if err != nil {
			in.Stop()
			return nil, err
		}
		p, err := launch(env, svc.name, argv...)
		if err != nil {
			in.Stop()
			return nil, err
		}
		in.procs = append(in.procs, p)
	}
	return in, nil
}

func socatArgs(front, back string) ([]string, error) {
	host, port, err := net.SplitHostPort(front)
	if err != nil {
		return nil, fmt.Errorf("peer: socat frontend: %w", err)
	}
	return []string{
		"socat",
		fmt.Sprintf("TCP4-LISTEN:%s,bind=%s,reuseaddr,fork,backlog=4096", port, host),
		"TCP4:" + back,
	}, nil
}
