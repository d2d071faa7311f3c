package peer

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/bench/internal/process"
)

// Peer names, in the order the benchmark runs them.
const (
	None    = "none"
	Ours    = "kube-userspace-proxy"
	HAProxy = "haproxy"
	Nginx   = "nginx"
	// NginxHalfClose is nginx with proxy_half_close on: it passes a client's
	// half-close on to the upstream, as we do, where plain nginx closes both
	// sides at the client's FIN.
	NginxHalfClose = "nginx-halfclose"
	Socat          = "socat"
	IOCopy         = "go-iocopy"
	// OursBase is another build of kube-userspace-proxy (Env.BaseProxyBin),
	// run like Ours: the ratios of Ours to it, round by round, compare two
	// builds. Only run when asked for by name.
	OursBase = "kube-userspace-proxy-base"
)

// Names returns the peers a run has by default, in the order the
// benchmark runs them.
func Names() []string {
	return []string{None, Ours, HAProxy, Nginx, NginxHalfClose, Socat, IOCopy}
}

// Known returns every peer a run may ask for: Names and OursBase.
func Known() []string {
	return append(Names(), OursBase)
}

// ErrUnknown is returned for a peer name this package does not know.
var ErrUnknown = errors.New("peer: unknown peer")

// Addrs are the three services of the benchmark as host:port strings.
type Addrs struct {
	Echo string // TCP echo
	Bulk string // TCP bulk source/sink
	UDP  string // UDP echo; "" when the peer does not proxy UDP
}

// Env is what starting a peer needs.
type Env struct {
	Dir      string // private directory for configuration files and logs
	Backends Addrs  // the servers every peer forwards to
	Ports    *Ports // hands out the peers' listening ports
	// IOCopyBin is the go-iocopy program. If empty, "iocopy" from PATH.
	IOCopyBin string
	// ProxyBin is the kube-userspace-proxy program. If empty, that peer is
	// unavailable.
	ProxyBin string
	// BaseProxyBin is the program of the OursBase peer. If empty, that
	// peer is unavailable.
	BaseProxyBin string
}

// ourBin returns the program of our peer name, Ours or OursBase.
func (env Env) ourBin(name string) string {
	if name == OursBase {
		return env.BaseProxyBin
	}
	return env.ProxyBin
}

// Instance is a running peer.
type Instance struct {
	Name  string
	Front Addrs // where the load generator connects

	procs []*process.Process
}

// PIDs returns the process ids the peer was started as (none for "none").
// Their descendants belong to the peer too.
func (in *Instance) PIDs() []int {
	pids := make([]int, 0, len(in.procs))
	for _, p := range in.procs {
		pids = append(pids, p.PID())
	}
	return pids
}

// Check returns an error when one of the peer's processes has exited.
func (in *Instance) Check() error {
	for _, p := range in.procs {
		if exited, err := p.Exited(); exited {
			return fmt.Errorf("peer: %s exited (%v): %s", in.Name, err, p.LogTail())
		}
	}
	return nil
}

// Stop stops every process of the peer and waits for them.
func (in *Instance) Stop() {
	for _, p := range in.procs {
		p.Stop()
	}
}

// Start starts the named peer and waits until it accepts connections on
// all its frontends.
func Start(ctx context.Context, name string, env Env) (*Instance, error) {
	var start func(context.Context, Env) (*Instance, error)
	switch name {
	case None:
		return &Instance{Name: None, Front: env.Backends}, nil
	case Ours, OursBase:
		start = func(ctx context.Context, env Env) (*Instance, error) { return startOurs(ctx, env, name) }
	case HAProxy:
		start = startHAProxy
	case Nginx, NginxHalfClose:
		start = func(ctx context.Context, env Env) (*Instance, error) { return startNginx(ctx, env, name) }
	case Socat:
		start = startSocat
	case IOCopy:
		start = startIOCopy
	default:
		return nil, fmt.Errorf("%w %q", ErrUnknown, name)
	}
	in, err := start(ctx, env)
	if err != nil {
		return nil, err
	}
	if err := waitReady(ctx, in); err != nil {
		in.Stop()
		return nil, err
	}
	return in, nil
}

// launch starts one process of a peer, logging to Dir/<logName>.log.
func launch(env Env, logName string, argv ...string) (*process.Process, error) {
	if _, err := exec.LookPath(argv[0]); err != nil {
		return nil, fmt.Errorf("peer: %s is not installed: %w", argv[0], err)
	}
	p, err := process.Start(process.Config{Argv: argv, Log: filepath.Join(env.Dir, logName+".log")})
	if err != nil {
		return nil, fmt.Errorf("peer: %w", err)
	}
	return p, nil
}

// Version returns the peer's version string, or "" when it is unknown.
func Version(ctx context.Context, name string, env Env) string {
	var argv []string
	var trim string
	switch name {
	case Ours, OursBase:
		bin := env.ourBin(name)
		if bin == "" {
			return ""
		}
		// "kube-userspace-proxy c3d5c44 commit …": the build's version.
		argv, trim = []string{bin, "--version"}, "kube-userspace-proxy "
	case HAProxy:
		argv, trim = []string{"haproxy", "-v"}, "HAProxy version "
	case Nginx, NginxHalfClose:
		argv, trim = []string{"nginx", "-v"}, "nginx version: "
	case Socat:
		argv, trim = []string{"socat", "-V"}, "socat version "
	default:
		return ""
	}
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, argv[0], argv[1:]...).CombinedOutput()
	if err != nil {
		return ""
	}
	for _, line := range strings.Split(string(out), "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), trim); ok && v != "" {
			if fields := strings.Fields(v); len(fields) > 0 {
				return fields[0]
			}
		}
	}
	return ""
}

// NoUDPReason says why a peer has no UDP frontend.
func NoUDPReason(name string) string {
	switch name {
	case HAProxy:
		return "HAProxy 2.6 has no UDP proxying"
	case Socat, IOCopy:
		return "TCP only in this benchmark"
	default:
		return "its UDP frontend did not echo during startup"
	}
}
