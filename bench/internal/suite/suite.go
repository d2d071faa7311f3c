package suite

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/bench/internal/peer"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/bench/internal/report"
)

// Test groups, as the -tests flag names them.
const (
	GroupThroughput = "throughput"
	GroupConnRate   = "connrate"
	GroupLatency    = "latency"
	GroupUDP        = "udp"
	GroupIdle       = "idle"
)

// Groups returns every test group in the order they run.
func Groups() []string {
	return []string{GroupThroughput, GroupConnRate, GroupLatency, GroupUDP, GroupIdle}
}

// Config describes one benchmark run.
type Config struct {
	// Short runs every test briefly, as a smoke test (about 30s in all).
	Short bool
	// Peers to run, in order. If empty, peer.Names().
	Peers []string
	// Groups of tests to run. If empty, Groups().
	Groups []string
	// BinDir holds the backend and iocopy programs.
	BinDir string
	// Self is the load generator's own program, re-executed with "hold" for
	// the idle test. If empty, os.Executable().
	Self string
	// ProxyBin is the kube-userspace-proxy program. If empty, that peer is
	// reported as not built.
	ProxyBin string
	// IdleConns is the number of idle connections of the idle test. If
	// zero, 9000 (1000 when Short).
	IdleConns int
	// Out receives the result tables. If nil, os.Stdout.
	Out io.Writer
	// Progress receives a line per measurement as the run goes. If nil,
	// os.Stderr.
	Progress io.Writer
}

// Validate checks the configuration and fills in the defaults.
func (c *Config) Validate() error {
	if len(c.Peers) == 0 {
		c.Peers = peer.Names()
	}
	for _, p := range c.Peers {
		if !slices.Contains(peer.Names(), p) {
			return fmt.Errorf("suite: unknown peer %q (known: %s)", p, strings.Join(peer.Names(), ", "))
		}
	}
	if len(c.Groups) == 0 {
		c.Groups = Groups()
	}
	for _, g := range c.Groups {
		if !slices.Contains(Groups(), g) {
			return fmt.Errorf("suite: unknown test group %q (known: %s)", g, strings.Join(Groups(), ", "))
		}
	}
	if c.BinDir == "" {
		return errors.New("suite: BinDir is required")
	}
	if c.Self == "" {
		self, err := os.Executable()
		if err != nil {
			return fmt.Errorf("suite: %w", err)
		}
		c.Self = self
	}
	if c.IdleConns <= 0 {
		c.IdleConns = 9000
		if c.Short {
			c.IdleConns = 1000
		}
	}
	if c.Out == nil {
		c.Out = os.Stdout
	}
	if c.Progress == nil {
		c.Progress = os.Stderr
	}
	return nil
}

// Run runs the benchmark and returns what it measured. On cancellation it
// returns the partial results, marked Interrupted, with ctx's error. It
// always stops every process it started and removes its temporary files.
func Run(ctx context.Context, cfg Config) (report.Run, error) {
	params := fullParams(cfg.IdleConns)
	if cfg.Short {
		params = shortParams(cfg.IdleConns)
	}
	run := report.Run{
		Started: time.Now(),
		Short:   cfg.Short,
		Host:    host(),
		Ours:    peer.Ours,
		Base:    peer.None,
		Tests:   params.tests(cfg.Groups),
	}
	dir, err := os.MkdirTemp("", "kube-userspace-proxy-bench-")
	if err != nil {
		return run, fmt.Errorf("suite: %w", err)
	}
	defer os.RemoveAll(dir)

	env := peer.Env{
		Dir:       dir,
		Ports:     peer.NewPorts(),
		IOCopyBin: filepath.Join(cfg.BinDir, "iocopy"),
		ProxyBin:  cfg.ProxyBin,
	}
	backends, err := peer.StartBackends(ctx, env, filepath.Join(cfg.BinDir, "backend"))
	if err != nil {
		return run, err
	}
	defer backends.Stop()
	env.Backends = backends.Front
	fmt.Fprintf(cfg.Progress, "bench: backends on echo %s, bulk %s, udp %s; temp dir %s\n",
		env.Backends.Echo, env.Backends.Bulk, env.Backends.UDP, dir)

	r := &runner{cfg: cfg, params: params, env: env, backends: backends}
	for _, name := range cfg.Peers {
		if ctx.Err() != nil {
			break
		}
		info, results := r.runPeer(ctx, name)
		run.Peers = append(run.Peers, info)
		run.Results = append(run.Results, results...)
	}
	run.Finished = time.Now()
	if err := ctx.Err(); err != nil {
		run.Interrupted = true
		return run, err
	}
	return run, nil
}

// runner carries what every peer's tests share.
type runner struct {
	cfg      Config
	params   params
	env      peer.Env
	backends *peer.Instance
}

// runPeer starts one peer, runs the selected groups against it and stops it.
func (r *runner) runPeer(ctx context.Context, name string) (report.Peer, []report.Result) {
	info := report.Peer{Name: name, Version: peer.Version(ctx, name, r.env)}
	if name == peer.IOCopy {
		info.Version = runtime.Version()
	}
	fmt.Fprintf(r.cfg.Progress, "bench: starting %s\n", name)
	in, err := peer.Start(ctx, name, r.env)
	if err != nil {
		info.Status = err.Error()
		fmt.Fprintf(r.cfg.Progress, "bench: %s not run: %v\n", name, err)
		return info, r.unavailable(name, err.Error())
	}
	defer in.Stop()

	var results []report.Result
	for _, g := range r.cfg.Groups {
		if ctx.Err() != nil {
			break
		}
		if err := in.Check(); err != nil {
			results = append(results, r.failGroup(g, name, err.Error())...)
			continue
		}
		if err := r.backends.Check(); err != nil {
			results = append(results, r.failGroup(g, name, err.Error())...)
			continue
		}
		got := r.runGroup(ctx, g, in)
		for _, res := range got {
			r.progress(res)
		}
		results = append(results, got...)
	}
	return info, results
}

// unavailable records every selected test of a peer that did not start.
func (r *runner) unavailable(name, why string) []report.Result {
	var out []report.Result
	for _, g := range r.cfg.Groups {
		out = append(out, r.failGroup(g, name, why)...)
	}
	return out
}

func (r *runner) failGroup(group, name, why string) []report.Result {
	var out []report.Result
	for _, t := range r.params.tests([]string{group}) {
		out = append(out, report.Result{Test: t.ID, Peer: name, Unit: t.Unit, Err: why})
	}
	return out
}

func (r *runner) progress(res report.Result) {
	if res.OK() {
		fmt.Fprintf(r.cfg.Progress, "bench: %-22s %-18s %s %s %s\n", res.Peer, res.Test, report.FormatValue(res.Value), res.Unit, res.Note)
		return
	}
	fmt.Fprintf(r.cfg.Progress, "bench: %-22s %-18s n/a: %s\n", res.Peer, res.Test, res.Err)
}

func host() report.Host {
	h := report.Host{CPUs: runtime.NumCPU(), GOMAXPROCS: runtime.GOMAXPROCS(0), Go: runtime.Version()}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		h.Kernel = strings.TrimSpace(string(b))
	}
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		if f := strings.Fields(string(b)); len(f) > 0 {
			h.LoadAvg, _ = strconv.ParseFloat(f[0], 64)
		}
	}
	return h
}
