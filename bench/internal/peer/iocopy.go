package peer

import (
	"context"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/bench/internal/process"
)

func startIOCopy(_ context.Context, env Env) (*Instance, error) {
	front, err := frontends(env.Ports, false)
	if err != nil {
		return nil, err
	}
	bin := env.IOCopyBin
	if bin == "" {
		bin = "iocopy"
	}
	p, err := launch(env, "go-iocopy", bin,
		"-map", front.Echo+"="+env.Backends.Echo,
		"-map", front.Bulk+"="+env.Backends.Bulk)
	if err != nil {
		return nil, err
	}
	return &Instance{Name: IOCopy, Front: front, procs: []*process.Process{p}}, nil
}
