package suite

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"time"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/bench/internal/load"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/bench/internal/peer"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/bench/internal/process"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/bench/internal/procstat"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/bench/internal/report"
)

const (
	// holdReportSlack is how long past its deadline a holder may take to
	// report.
	holdReportSlack = 15 * time.Second
	// holdExitWait is how long a holder may take to exit once released.
	holdExitWait = 10 * time.Second
	// holderMaxLife bounds a holder that is never released.
	holderMaxLife = 5 * time.Minute
)

// idle holds the configured number of idle connections through the peer and
// samples the peer's process tree before and after.
func (r *runner) idle(ctx context.Context, in *peer.Instance) []report.Result {
	var out []report.Result
	for _, t := range r.params.groupTests(GroupIdle) {
		out = append(out, report.Result{Test: t.ID, Peer: in.Name, Unit: t.Unit})
	}
	held, rss, fds, rssConn, fdsConn := &out[0], &out[1], &out[2], &out[3], &out[4]
	failAll := func(err error) []report.Result {
		for i := range out {
			out[i].Err = err.Error()
		}
		return out
	}

	pids := in.PIDs()
	var before procstat.Usage
	if len(pids) > 0 {
		var err error
		if before, err = procstat.Tree(pids...); err != nil {
			return failAll(err)
		}
	}
	h, err := startHolders(ctx, r.cfg.Self, in.Front.Echo, r.params.hold)
	if err != nil {
		return failAll(err)
	}
	defer h.release()
	if err := sleepCtx(ctx, r.params.settle); err != nil {
		return failAll(err)
	}

	want := r.params.hold.Conns
	held.Value = float64(h.ok)
	held.Extra = map[string]float64{"wanted": float64(want), "failed": float64(h.failed)}
	held.Note = "all held"
	if h.ok < want {
		held.Note = fmt.Sprintf("FAILED to hold all %d: %s", want, h.firstErr)
	}
	if len(pids) == 0 {
		for _, res := range []*report.Result{rss, fds, rssConn, fdsConn} {
			res.Err = "no proxy process"
		}
		return out
	}
	after, err := procstat.Tree(pids...)
	if err != nil {
		for _, res := range []*report.Result{rss, fds, rssConn, fdsConn} {
			res.Err = err.Error()
		}
		return out
	}
	fillUsage(rss, fds, before, after, h.ok, want)
	fillPerConn(rssConn, fdsConn, before, after, h.ok)
	return out
}

func fillUsage(rss, fds *report.Result, before, after procstat.Usage, held, want int) {
	rss.Value = mib(after.RSSBytes)
	fds.Value = float64(after.FDs)
	rss.Extra = map[string]float64{
		"baseline_mib":     mib(before.RSSBytes),
		"pss_mib":          mib(after.PSSBytes),
		"baseline_pss_mib": mib(before.PSSBytes),
		"procs":            float64(after.Procs),
	}
	fds.Extra = map[string]float64{"baseline": float64(before.FDs), "procs": float64(after.Procs)}
	rss.Note = fmt.Sprintf("PSS %.1f MiB; before the test %.1f MiB", mib(after.PSSBytes), mib(before.RSSBytes))
	fds.Note = fmt.Sprintf("before the test %d", before.FDs)
	if after.Procs > 1 {
		rss.Note += fmt.Sprintf(", %d processes", after.Procs)
		fds.Note += fmt.Sprintf(", %d processes", after.Procs)
	}
	if held < want {
		rss.Note += fmt.Sprintf("; only %d conns held", held)
		fds.Note += fmt.Sprintf("; only %d conns held", held)
	}
}

func mib(b int64) float64 { return float64(b) / (1 << 20) }

func fillPerConn(rssConn, fdsConn *report.Result, before, after procstat.Usage, held int) {
	if held == 0 {
		rssConn.Err, fdsConn.Err = "no connection held", "no connection held"
		return
	}
	perConn := func(growth int64) float64 { return float64(growth) / 1024 / float64(held) }
	rssConn.Value = perConn(after.PSSBytes - before.PSSBytes)
	rssConn.Note = fmt.Sprintf("VmRSS growth %.1f KiB/conn", perConn(after.RSSBytes-before.RSSBytes))
	rssConn.Extra = map[string]float64{"rss_kib_per_conn": perConn(after.RSSBytes - before.RSSBytes)}
	fdsConn.Value = float64(after.FDs-before.FDs) / float64(held)
}

// holders are the child processes holding the idle client sockets.
type holders struct {
	procs      []*process.Process
	ok, failed int
	firstErr   string
}

// holdReport is the line a holder writes once its connections are open.
type holdReport struct {
	OK     int    `json:"ok"`
	Failed int    `json:"failed"`
	Err    string `json:"error,omitempty"`
}

// startHolders spreads cfg.Conns connections to addr over enough holder
// processes that none holds more than holdersPerSocket, and waits until
// every holder has reported.
func startHolders(ctx context.Context, self, addr string, cfg load.HoldConfig) (*holders, error) {
	n := (cfg.Conns + holdersPerSocket - 1) / holdersPerSocket
	h := &holders{}
	for i := range n {
		share := cfg.Conns / n
		if i < cfg.Conns%n {
			share++
		}
		p, err := process.Start(process.Config{Pipes: true, Argv: []string{
			self, "hold",
			"-addr", addr,
			"-conns", strconv.Itoa(share),
			"-concurrency", strconv.Itoa(max(1, cfg.Concurrency/n)),
			"-timeout", cfg.Timeout.String(),
			"-max-failures", strconv.Itoa(max(1, cfg.MaxFailures/n)),
			"-deadline", cfg.Deadline.String(),
		}})
		if err != nil {
			h.abort()
			return nil, err
		}
		h.procs = append(h.procs, p)
	}
	if err := h.collect(ctx, cfg.Deadline+holdReportSlack); err != nil {
		h.abort()
		return nil, err
	}
	return h, nil
}

// collect reads every holder's report, giving up after timeout or when ctx
// is done.
func (h *holders) collect(ctx context.Context, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for _, p := range h.procs {
		p.Stdout.SetReadDeadline(deadline)
	}
	stop := context.AfterFunc(ctx, func() {
		for _, p := range h.procs {
			p.Stdout.SetReadDeadline(time.Now())
		}
	})
	defer stop()
	for _, p := range h.procs {
		line, err := bufio.NewReader(p.Stdout).ReadBytes('\n')
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("suite: holder %d did not report: %w", p.PID(), err)
		}
		var rep holdReport
		if err := json.Unmarshal(line, &rep); err != nil {
			return fmt.Errorf("suite: holder %d: %w", p.PID(), err)
		}
		h.ok += rep.OK
		h.failed += rep.Failed
		if h.firstErr == "" {
			h.firstErr = rep.Err
		}
	}
	return nil
}

// abort stops holders that may still be opening connections: SIGTERM
// cancels their work at once.
func (h *holders) abort() {
	for _, p := range h.procs {
		p.Stop()
	}
}

// release tells holders that have reported to close their connections and
// exit, and waits for them.
func (h *holders) release() {
	for _, p := range h.procs {
		p.Stdin.Close()
	}
	timeout := time.After(holdExitWait)
	for _, p := range h.procs {
		select {
		case <-p.Done():
		case <-timeout:
		}
		p.Stop()
	}
}

// Hold is the "hold" subcommand of the load generator: it opens the
// connections, writes a holdReport line to stdout, then holds them until
// stdin is closed, ctx is done or holderMaxLife has passed.
func Hold(ctx context.Context, args []string, stdin *os.File, stdout io.Writer) error {
	fs := flag.NewFlagSet("hold", flag.ContinueOnError)
	var cfg load.HoldConfig
	fs.StringVar(&cfg.Addr, "addr", "", "echo service to connect to")
	fs.IntVar(&cfg.Conns, "conns", 1000, "connections to open")
	fs.IntVar(&cfg.Concurrency, "concurrency", 32, "connections opened at once")
	fs.DurationVar(&cfg.Timeout, "timeout", 3*time.Second, "bound on opening one connection and its echo")
	fs.IntVar(&cfg.MaxFailures, "max-failures", 200, "stop opening after this many failures")
	fs.DurationVar(&cfg.Deadline, "deadline", time.Minute, "bound on the whole opening phase")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if cfg.Addr == "" {
		return errors.New("hold: -addr is required")
	}
	h := load.Hold(ctx, cfg)
	defer h.Close()
	rep := holdReport{OK: h.OK(), Failed: h.Failed}
	if h.FirstErr != nil {
		rep.Err = h.FirstErr.Error()
	}
	if err := json.NewEncoder(stdout).Encode(rep); err != nil {
		return fmt.Errorf("hold: report: %w", err)
	}
	// Wait for EOF on stdin, bounded in time and by ctx.
	stdin.SetReadDeadline(time.Now().Add(holderMaxLife))
	stop := context.AfterFunc(ctx, func() { stdin.SetReadDeadline(time.Now()) })
	defer stop()
	io.Copy(io.Discard, stdin)
	return nil
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
