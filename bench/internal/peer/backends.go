package peer

import (
	"context"
	"errors"
	"fmt"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/bench/internal/process"
)

// StartBackends starts the backend servers (bench/cmd/backend at bin) on
// fresh ports in a process of their own and waits until all three answer.
// The returned Instance's Front holds their addresses, to be used as
// Env.Backends.
func StartBackends(ctx context.Context, env Env, bin string) (*Instance, error) {
	addrs, err := frontends(env.Ports, true)
	if err != nil {
		return nil, err
	}
	p, err := launch(env, "backend", bin, "-echo", addrs.Echo, "-bulk", addrs.Bulk, "-udp", addrs.UDP)
	if err != nil {
		return nil, err
	}
	in := &Instance{Name: "backend", Front: addrs, procs: []*process.Process{p}}
	if err := waitReady(ctx, in); err != nil {
		in.Stop()
		return nil, fmt.Errorf("peer: backends: %w", err)
	}
	if in.Front.UDP == "" {
		in.Stop()
		return nil, errors.New("peer: backends: the UDP echo server does not answer")
	}
	return in, nil
}
