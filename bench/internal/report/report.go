package report

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"
)

// Test describes one table: a single number per peer.
type Test struct {
	ID    string `json:"id"`
	Title string `json:"title"`
	Unit  string `json:"unit"`
	// LowerIsBetter is set for costs (latency, memory, fds); otherwise a
	// higher value is better.
	LowerIsBetter bool `json:"lower_is_better,omitempty"`
}

// Result is one peer's number in one test.
type Result struct {
	Test  string  `json:"test"`
	Peer  string  `json:"peer"`
	Value float64 `json:"value"`
	Unit  string  `json:"unit"`
	// Err says why there is no value: the peer does not support the test,
	// is not installed, or failed. Value is meaningless when it is set.
	Err string `json:"error,omitempty"`
	// Note is a short remark printed next to the value.
	Note string `json:"note,omitempty"`
	// Extra holds further numbers of the same measurement.
	Extra map[string]float64 `json:"extra,omitempty"`
}

// OK reports whether the result has a value.
func (r Result) OK() bool { return r.Err == "" }

// Peer describes one peer of the run.
type Peer struct {
	Name    string `json:"name"`
	Version string `json:"version,omitempty"`
	// Status is empty when the peer ran, or says why it did not.
	Status string `json:"status,omitempty"`
}

// Host describes the machine the run was on.
type Host struct {
	CPUs       int    `json:"cpus"`
	GOMAXPROCS int    `json:"gomaxprocs"`
	Kernel     string `json:"kernel,omitempty"`
	Go         string `json:"go"`
	// LoadAvg is the 1-minute load average when the run started. It
	// stays high for minutes after a burst of processes that has ended
	// (the idle test with socat runs 9,000), so BusyAtStart, not this,
	// says whether other work shared the machine.
	LoadAvg float64 `json:"loadavg"`
	// BusyAtStart is the share of the machine's CPU time that was busy
	// in the second before the run started (0 to 1); negative if it
	// could not be measured. Above BusyMachine, other work shared the
	// machine and the numbers are noisy.
	BusyAtStart float64 `json:"busy_at_start"`
}

// BusyMachine is the BusyAtStart above which the header warns that the
// numbers are noisy: an idle machine measures a few percent at most.
const BusyMachine = 0.2

// Run is everything one benchmark run produced.
type Run struct {
	Started     time.Time `json:"started"`
	Finished    time.Time `json:"finished"`
	Short       bool      `json:"short"`
	Interrupted bool      `json:"interrupted,omitempty"`
	Host        Host      `json:"host"`
	// Ours names the peer every other peer is compared with; Base names
	// the limit (no proxy).
	Ours    string   `json:"ours"`
	Base    string   `json:"base"`
	Peers   []Peer   `json:"peers"`
	Tests   []Test   `json:"tests"`
	Results []Result `json:"results"`
}

// find returns the result of peer in test.
func (r Run) find(test, peer string) (Result, bool) {
	for _, res := range r.Results {
		if res.Test == test && res.Peer == peer {
			return res, true
		}
	}
	return Result{}, false
}

// WriteText writes a header, then one table per test that has results.
func WriteText(w io.Writer, run Run) error {
	var b strings.Builder
	writeHeader(&b, run)
	for _, t := range run.Tests {
		writeTable(&b, run, t)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func writeHeader(b *strings.Builder, run Run) {
	mode := "full"
	if run.Short {
		mode = "short (smoke)"
	}
	fmt.Fprintf(b, "kube-userspace-proxy benchmark, %s run, %s, %d CPUs (GOMAXPROCS %d), %s, kernel %s\n",
		mode, run.Started.Format(time.RFC3339), run.Host.CPUs, run.Host.GOMAXPROCS, run.Host.Go, run.Host.Kernel)
	if run.Interrupted {
		b.WriteString("INTERRUPTED: the results below are partial\n")
	}
	if run.Host.BusyAtStart >= 0 {
		fmt.Fprintf(b, "Machine busy at start: %.0f%% of its CPU time over 1s (load average %.2f)", 100*run.Host.BusyAtStart, run.Host.LoadAvg)
	} else {
		fmt.Fprintf(b, "Machine busy at start: not measured (load average %.2f)", run.Host.LoadAvg)
	}
	if run.Host.BusyAtStart > BusyMachine {
		b.WriteString(" (busy machine: expect noisy numbers; run again when idle)")
	}
	b.WriteString("\nAll traffic on 127.0.0.1; load generator, backends and proxy share the CPUs.\n\npeers:\n")
	tw := tabwriter.NewWriter(b, 0, 0, 2, ' ', 0)
	for _, p := range run.Peers {
		status := "ran"
		if p.Status != "" {
			status = "NOT RUN: " + p.Status
		}
		version := p.Version
		if version == "" {
			version = "-"
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\n", p.Name, version, status)
	}
	tw.Flush()
}

func writeTable(b *strings.Builder, run Run, t Test) {
	better := "higher is better"
	if t.LowerIsBetter {
		better = "lower is better"
	}
	fmt.Fprintf(b, "\n%s [%s; %s]\n", t.Title, t.Unit, better)
	base, haveBase := run.find(t.ID, run.Base)
	ours, haveOurs := run.find(t.ID, run.Ours)
	tw := tabwriter.NewWriter(b, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "  peer\tvalue\tunit\tvs %s\t%s / peer\tnote\n", run.Base, run.Ours)
	for _, p := range run.Peers {
		r, ok := run.find(t.ID, p.Name)
		if !ok {
			continue
		}
		if !r.OK() {
			why := r.Err
			if p.Status != "" {
				why = "not run (see peers above)"
			}
			fmt.Fprintf(tw, "  %s\tn/a\t\t-\t-\t%s\n", p.Name, clip(why, noteWidth))
			continue
		}
		vsBase := ratio(r, base, haveBase, r.Extra, BaseRatio)
		oursVs := ratio(ours, r, haveOurs, r.Extra, OursRatio)
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\t%s\n", p.Name, FormatValue(r.Value), r.Unit, vsBase, oursVs, clip(r.Note, noteWidth))
	}
	tw.Flush()
}

// noteWidth keeps table rows readable; the JSON keeps the whole text.
const noteWidth = 90

// clip shortens s to at most n runes, marking the cut.
func clip(s string, n int) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n-1]) + "…"
}

// Keys of Result.Extra for a run of several rounds: the median of the
// ratios taken round by round, of ours to this peer and of this peer to
// the base, with name+"_min" and name+"_max" for their range. The tables
// show them in place of the ratio of the medians.
const (
	OursRatio = "ours_ratio"
	BaseRatio = "base_ratio"
)

// ratio formats num/den as "1.23x", or "-" when either is missing or den is
// zero. When extra holds the round-by-round ratio under name, that is
// shown instead, with its range: "1.23x (1.10–1.31)".
func ratio(num, den Result, have bool, extra map[string]float64, name string) string {
	if !have || !num.OK() || !den.OK() || den.Value == 0 {
		return "-"
	}
	if med, ok := extra[name]; ok {
		return fmt.Sprintf("%.2fx (%.2f–%.2f)", med, extra[name+"_min"], extra[name+"_max"])
	}
	return fmt.Sprintf("%.2fx", num.Value/den.Value)
}

// FormatValue prints v with three significant digits at most, without an
// exponent.
func FormatValue(v float64) string {
	a := math.Abs(v)
	switch {
	case a >= 100 || v == math.Trunc(v):
		return fmt.Sprintf("%.0f", v)
	case a >= 10:
		return fmt.Sprintf("%.1f", v)
	case a >= 1:
		return fmt.Sprintf("%.2f", v)
	default:
		return fmt.Sprintf("%.3f", v)
	}
}

// WriteJSON writes run to path, creating its directory.
func WriteJSON(path string, run Run) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("report: %w", err)
	}
	data, err := json.MarshalIndent(run, "", "  ")
	if err != nil {
		return fmt.Errorf("report: %w", err)
	}
	if err := os.WriteFile(path, append(data, '\n'), 0o644); err != nil {
		return fmt.Errorf("report: %w", err)
	}
	return nil
}
