package suite

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/bench/internal/load"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/bench/internal/peer"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/bench/internal/procstat"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/bench/internal/report"
)

// runGroup runs one group of tests against a running peer.
func (r *runner) runGroup(ctx context.Context, group string, in *peer.Instance) []report.Result {
	switch group {
	case GroupThroughput:
		return []report.Result{
			r.throughput(ctx, in, TestThroughput1, 1),
			r.throughput(ctx, in, TestThroughput8, streamsMany),
		}
	case GroupConnRate:
		rate := r.connRate(ctx, in)
		return []report.Result{rate, cpuResult(TestConnCPU, rate, "conn")}
	case GroupLatency:
		return r.latency(ctx, in)
	case GroupUDP:
		rate := r.udpRate(ctx, in)
		return []report.Result{rate, cpuResult(TestUDPCPU, rate, "req")}
	case GroupIdle:
		return r.idle(ctx, in)
	}
	return nil
}

func (r *runner) throughput(ctx context.Context, in *peer.Instance, id string, streams int) report.Result {
	res := report.Result{Test: id, Peer: in.Name, Unit: "Gbit/s"}
	got, err := load.Throughput(ctx, load.ThroughputConfig{
		Addr:     in.Front.Bulk,
		Streams:  streams,
		Warmup:   r.params.warmup,
		Duration: r.params.throughput,
	})
	if err != nil {
		res.Err = err.Error()
		return res
	}
	res.Value = got.BitsPerSecond() / 1e9
	res.Extra = map[string]float64{"bytes": float64(got.Bytes), "seconds": got.Elapsed.Seconds(), "stream_errors": float64(got.StreamErrors)}
	if got.StreamErrors > 0 {
		res.Note = fmt.Sprintf("%d of %d streams failed early", got.StreamErrors, streams)
	}
	return res
}

func (r *runner) connRate(ctx context.Context, in *peer.Instance) report.Result {
	res := report.Result{Test: TestConnRate, Peer: in.Name, Unit: "conn/s"}
	cfg := r.params.connRate
	cfg.Addr = in.Front.Echo
	cpu := watchCPU(in.PIDs()) // what a connection costs (see cpuWatch)
	got, err := load.ConnRate(ctx, cfg)
	if err != nil {
		res.Err = err.Error()
		return res
	}
	res.Value = got.PerSecond()
	res.Extra = map[string]float64{"ok": float64(got.OK), "failed": float64(got.Failed), "seconds": got.Elapsed.Seconds()}
	notes := cpu.report(&res, got.OK, "conn")
	if got.Failed > 0 {
		notes = append(notes, fmt.Sprintf("%d failed, first: %v", got.Failed, got.FirstErr))
	}
	res.Note = strings.Join(notes, "; ")
	return res
}

func (r *runner) latency(ctx context.Context, in *peer.Instance) []report.Result {
	p50 := report.Result{Test: TestLatencyP50, Peer: in.Name, Unit: "µs"}
	p99 := report.Result{Test: TestLatencyP99, Peer: in.Name, Unit: "µs"}
	cfg := r.params.latency
	cfg.Addr = in.Front.Echo
	got, err := load.Latency(ctx, cfg)
	if err != nil {
		p50.Err, p99.Err = err.Error(), err.Error()
		return []report.Result{p50, p99}
	}
	extra := map[string]float64{
		"p50_us":       micros(got.P50),
		"p99_us":       micros(got.P99),
		"p999_us":      micros(got.P999),
		"max_us":       micros(got.Max),
		"requests":     float64(got.Requests),
		"achieved_rps": got.Achieved(),
		"errors":       float64(got.Errors),
	}
	p50.Value, p50.Extra = micros(got.P50), extra
	p99.Value, p99.Extra = micros(got.P99), extra
	p50.Note = fmt.Sprintf("achieved %.0f req/s", got.Achieved())
	p99.Note = fmt.Sprintf("p99.9 %.0f µs, max %.0f µs", micros(got.P999), micros(got.Max))
	if got.Errors > 0 {
		p50.Note += fmt.Sprintf(", %d failed, first: %v", got.Errors, got.FirstErr)
	}
	return []report.Result{p50, p99}
}

func micros(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

func (r *runner) udpRate(ctx context.Context, in *peer.Instance) report.Result {
	res := report.Result{Test: TestUDPRate, Peer: in.Name, Unit: "req/s"}
	if in.Front.UDP == "" {
		res.Err = peer.NoUDPReason(in.Name)
		return res
	}
	cfg := r.params.udp
	cfg.Addr = in.Front.UDP
	cpu := watchCPU(in.PIDs())
	got, err := load.UDPRate(ctx, cfg)
	if err != nil {
		res.Err = err.Error()
		return res
	}
	res.Value = got.PerSecond()
	res.Extra = map[string]float64{"ok": float64(got.OK), "lost": float64(got.Lost), "seconds": got.Elapsed.Seconds()}
	notes := cpu.report(&res, got.OK, "req")
	if got.Lost > 0 {
		notes = append(notes, fmt.Sprintf("%d lost", got.Lost))
	}
	res.Note = strings.Join(notes, "; ")
	return res
}

// cpuResult makes the proxy CPU per unit of work measured in rate a row of
// its own (lower is better), so that rounds pair it with the other peers'
// as they pair rates: CPU per operation varies less than the rate on a
// small shared machine.
func cpuResult(id string, rate report.Result, unit string) report.Result {
	res := report.Result{Test: id, Peer: rate.Peer, Unit: "µs"}
	per, ok := rate.Extra["proxy_cpu_us_per_"+unit]
	switch {
	case rate.Err != "":
		res.Err = rate.Err
	case rate.Peer == peer.None:
		res.Err = "no proxy: the client talks to the backends"
	case !ok:
		res.Err = "its CPU time could not be read"
	default:
		res.Value = per
		res.Extra = map[string]float64{"machine_cpu_us_per_" + unit: rate.Extra["machine_cpu_us_per_"+unit]}
		res.Note = fmt.Sprintf("machine %.0f µs/%s", rate.Extra["machine_cpu_us_per_"+unit], unit)
	}
	return res
}

// cpuWatch holds the CPU samples taken before a test: the peer's process
// tree, and the whole machine (client, backends and peer together). After
// the test, the growth per unit of work says what a unit cost, which
// varies less than the rate on a small shared machine, and the machine's
// busy share tells a rate gap apart: a lower rate at no more machine CPU
// per unit means the machine sat idle, waiting on somebody's wake-ups.
type cpuWatch struct {
	pids       []int
	tree       procstat.Usage
	treeErr    error
	machine    procstat.Machine
	machineErr error
}

func watchCPU(pids []int) cpuWatch {
	w := cpuWatch{pids: pids}
	if len(pids) > 0 {
		w.tree, w.treeErr = procstat.Tree(pids...)
	}
	w.machine, w.machineErr = procstat.System()
	return w
}

// report puts the CPU per unit of work into res.Extra
// (proxy_cpu_us_per_<unit>, machine_cpu_us_per_<unit>, machine_busy) and
// returns the notes to show. Samples that failed are left out.
func (w cpuWatch) report(res *report.Result, done int64, unit string) []string {
	if done <= 0 {
		return nil
	}
	var notes []string
	if len(w.pids) > 0 && w.treeErr == nil {
		if after, err := procstat.Tree(w.pids...); err == nil {
			per := (after.CPU - w.tree.CPU).Seconds() * 1e6 / float64(done)
			res.Extra["proxy_cpu_us_per_"+unit] = per
			notes = append(notes, fmt.Sprintf("proxy CPU %.0f µs/%s", per, unit))
		}
	}
	if w.machineErr == nil {
		if after, err := procstat.System(); err == nil {
			per := (after.Busy - w.machine.Busy).Seconds() * 1e6 / float64(done)
			busy := w.machine.Utilization(after)
			res.Extra["machine_cpu_us_per_"+unit] = per
			res.Extra["machine_busy"] = busy
			notes = append(notes, fmt.Sprintf("machine %.0f µs/%s, %.0f%% busy", per, unit, 100*busy))
		}
	}
	return notes
}
