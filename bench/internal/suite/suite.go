package suite

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/bench/internal/peer"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/bench/internal/procstat"
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
	// BaseProxyBin is another build of kube-userspace-proxy, run as the
	// peer peer.OursBase to compare two builds. Required when Peers has
	// that peer.
	BaseProxyBin string
	// IdleConns is the number of idle connections of the idle test. If
	// zero, 9000 (1000 when Short).
	IdleConns int
	// Rounds runs every peer this many times, interleaved (all peers, then
	// all peers again), and reports each value as the median of its
	// rounds with their range: on a small, shared machine one round's
	// ratios move by more than the differences worth knowing. If zero, 1.
	Rounds int
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
		if !slices.Contains(peer.Known(), p) {
			return fmt.Errorf("suite: unknown peer %q (known: %s)", p, strings.Join(peer.Known(), ", "))
		}
	}
	if slices.Contains(c.Peers, peer.OursBase) && c.BaseProxyBin == "" {
		return fmt.Errorf("suite: peer %s needs the program of the build to compare with (loadgen -proxy-base)", peer.OursBase)
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
	if c.Rounds < 0 {
		return fmt.Errorf("suite: Rounds is %d; want 1 or more", c.Rounds)
	}
	if c.Rounds == 0 {
		c.Rounds = 1
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
		Dir:          dir,
		Ports:        peer.NewPorts(),
		IOCopyBin:    filepath.Join(cfg.BinDir, "iocopy"),
		ProxyBin:     cfg.ProxyBin,
		BaseProxyBin: cfg.BaseProxyBin,
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
	var rounds [][]report.Result
	for round := range max(cfg.Rounds, 1) {
		if cfg.Rounds > 1 {
			fmt.Fprintf(cfg.Progress, "bench: round %d of %d\n", round+1, cfg.Rounds)
		}
		var results []report.Result
		for _, name := range cfg.Peers {
			if ctx.Err() != nil {
				break
			}
			info, got := r.runPeer(ctx, name)
			if round == 0 {
				run.Peers = append(run.Peers, info)
			}
			results = append(results, got...)
		}
		if ctx.Err() != nil && round > 0 {
			break // keep the rounds that completed
		}
		rounds = append(rounds, results)
	}
	run.Results = medianOfRounds(rounds)
	pairRatios(run.Results, rounds, run.Ours, run.Base)
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
	h.BusyAtStart = busyOver(time.Second)
	return h
}

// busyOver returns the busy share of the machine's CPU time over the next
// d, or -1 if it cannot be read.
func busyOver(d time.Duration) float64 {
	before, err := procstat.System()
	if err != nil {
		return -1
	}
	time.Sleep(d)
	after, err := procstat.System()
	if err != nil {
		return -1
	}
	return before.Utilization(after)
}

// medianOfRounds merges the results of several rounds: each test and peer
// gets the median of its values, with the range and the number of rounds
// in the note (and min, max and rounds in Extra). A round that failed is
// left out; if every round failed, the first failure stands. One round is
// returned as it is.
func medianOfRounds(rounds [][]report.Result) []report.Result {
	if len(rounds) == 1 {
		return rounds[0]
	}
	type key struct{ test, peer string }
	var order []key
	byKey := map[key][]report.Result{}
	for _, results := range rounds {
		for _, r := range results {
			k := key{r.Test, r.Peer}
			if _, seen := byKey[k]; !seen {
				order = append(order, k)
			}
			byKey[k] = append(byKey[k], r)
		}
	}
	out := make([]report.Result, 0, len(order))
	for _, k := range order {
		all := byKey[k]
		var ok []report.Result
		for _, r := range all {
			if r.OK() {
				ok = append(ok, r)
			}
		}
		if len(ok) == 0 {
			out = append(out, all[0])
			continue
		}
		slices.SortFunc(ok, func(a, b report.Result) int { return cmp.Compare(a.Value, b.Value) })
		values := make([]float64, len(ok))
		for i, r := range ok {
			values[i] = r.Value
		}
		mid := ok[len(ok)/2] // the round whose value is the median keeps its note and extras
		r := mid
		r.Value = median(values)
		r.Extra = maps.Clone(mid.Extra)
		if r.Extra == nil {
			r.Extra = map[string]float64{}
		}
		r.Extra["rounds"] = float64(len(ok))
		r.Extra["min"] = ok[0].Value
		r.Extra["max"] = ok[len(ok)-1].Value
		summary := fmt.Sprintf("median of %d rounds, %s–%s", len(ok), roundedValue(ok[0].Value), roundedValue(ok[len(ok)-1].Value))
		if failed := len(all) - len(ok); failed > 0 {
			summary += fmt.Sprintf(", %d failed", failed)
		}
		if r.Note != "" {
			summary += "; " + r.Note
		}
		r.Note = summary
		out = append(out, r)
	}
	return out
}

// pairRatios gives every merged result of a run of several rounds the
// ratios its table shows, taken round by round: ours to the peer, and the
// peer to the base (no proxy). The peers of a round run one after another,
// so a round's ratio compares numbers taken under the same load on the
// machine; the median of those ratios moves less than the ratio of two
// medians, whose rounds may come from quieter and busier minutes. The
// median and range go in Extra (report.OursRatio, report.BaseRatio and
// their _min and _max), from the rounds in which both peers have a value,
// and only when there are two or more such rounds.
func pairRatios(merged []report.Result, rounds [][]report.Result, ours, base string) {
	if len(rounds) < 2 {
		return
	}
	type key struct{ test, peer string }
	value := make([]map[key]float64, len(rounds))
	for i, results := range rounds {
		value[i] = map[key]float64{}
		for _, r := range results {
			if r.OK() {
				value[i][key{r.Test, r.Peer}] = r.Value
			}
		}
	}
	// ratios collects num/den over the rounds where both have a value.
	ratios := func(test, num, den string) []float64 {
		var out []float64
		for _, v := range value {
			n, okN := v[key{test, num}]
			d, okD := v[key{test, den}]
			if okN && okD && d != 0 {
				out = append(out, n/d)
			}
		}
		return out
	}
	set := func(r *report.Result, name string, rs []float64) {
		if len(rs) < 2 {
			return
		}
		if r.Extra == nil {
			r.Extra = map[string]float64{}
		}
		slices.Sort(rs)
		r.Extra[name] = median(rs)
		r.Extra[name+"_min"] = rs[0]
		r.Extra[name+"_max"] = rs[len(rs)-1]
	}
	for i := range merged {
		r := &merged[i]
		if !r.OK() {
			continue
		}
		if r.Peer != ours {
			set(r, report.OursRatio, ratios(r.Test, ours, r.Peer))
		}
		if r.Peer != base {
			set(r, report.BaseRatio, ratios(r.Test, r.Peer, base))
		}
	}
}

// median is the middle of sorted values, or the mean of the middle two.
func median(sorted []float64) float64 {
	mid := len(sorted) / 2
	if len(sorted)%2 == 0 {
		return (sorted[mid-1] + sorted[mid]) / 2
	}
	return sorted[mid]
}

// roundedValue prints v as the tables do: whole numbers from 100 up, three
// significant digits below.
func roundedValue(v float64) string {
	if v >= 100 || v <= -100 {
		return strconv.FormatFloat(v, 'f', 0, 64)
	}
	return strconv.FormatFloat(v, 'g', 3, 64)
}
