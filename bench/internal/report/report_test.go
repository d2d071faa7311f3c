package report

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestFormatValue(t *testing.T) {
	tests := []struct {
		v    float64
		want string
	}{
		{9000, "9000"},
		{123.456, "123"},
		{12.345, "12.3"},
		{1.2345, "1.23"},
		{0.12345, "0.123"},
		{3, "3"},
	}
	for _, tc := range tests {
		t.Run(tc.want, func(t *testing.T) {
			if got := FormatValue(tc.v); got != tc.want {
				t.Fatalf("FormatValue(%v) = %q, want %q", tc.v, got, tc.want)
			}
		})
	}
}

func sampleRun() Run {
	return Run{
		Ours: "ours",
		Base: "none",
		Peers: []Peer{
			{Name: "none"},
			{Name: "ours"},
			{Name: "haproxy", Version: "2.6.12"},
			{Name: "socat", Status: "not installed"},
		},
		Tests: []Test{
			{ID: "rate", Title: "Connection rate", Unit: "conn/s"},
			{ID: "lat", Title: "Latency", Unit: "µs", LowerIsBetter: true},
		},
		Results: []Result{
			{Test: "rate", Peer: "none", Value: 20000, Unit: "conn/s"},
			{Test: "rate", Peer: "ours", Value: 10000, Unit: "conn/s"},
			{Test: "rate", Peer: "haproxy", Value: 8000, Unit: "conn/s", Note: "failed 3"},
			{Test: "rate", Peer: "socat", Err: "not installed"},
			{Test: "lat", Peer: "none", Value: 20, Unit: "µs"},
			{Test: "lat", Peer: "ours", Err: "UDP not supported"},
			{Test: "lat", Peer: "haproxy", Value: 40, Unit: "µs"},
		},
	}
}

func TestWriteText(t *testing.T) {
	var b strings.Builder
	if err := WriteText(&b, sampleRun()); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{
		"Connection rate [conn/s; higher is better]",
		"Latency [µs; lower is better]",
		"vs none",
		"ours / peer",
		"NOT RUN: not installed",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	// ours/haproxy = 10000/8000; haproxy/none = 8000/20000.
	if !lineHas(out, "haproxy", "8000", "0.40x", "1.25x", "failed 3") {
		t.Errorf("haproxy rate row wrong:\n%s", out)
	}
	// No value of ours: no ratio of ours to anyone.
	if !lineHas(out, "haproxy", "40", "2.00x", "-") {
		t.Errorf("haproxy latency row wrong:\n%s", out)
	}
	if !lineHas(out, "ours", "n/a", "UDP not supported") {
		t.Errorf("ours latency row wrong:\n%s", out)
	}
}

// With round-by-round ratios in Extra, the ratio columns show their
// median and range, not the ratio of the two medians.
func TestWriteTextPairedRatios(t *testing.T) {
	run := sampleRun()
	for i, r := range run.Results {
		if r.Test == "rate" && r.Peer == "haproxy" {
			run.Results[i].Extra = map[string]float64{
				OursRatio: 1.1, OursRatio + "_min": 0.95, OursRatio + "_max": 1.3,
				BaseRatio: 0.5, BaseRatio + "_min": 0.45, BaseRatio + "_max": 0.55,
			}
		}
	}
	var b strings.Builder
	if err := WriteText(&b, run); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	if !lineHas(out, "haproxy", "8000", "0.50x (0.45–0.55)", "1.10x (0.95–1.30)", "failed 3") {
		t.Errorf("haproxy rate row wrong:\n%s", out)
	}
	// Rows without them keep the ratio of the values.
	if !lineHas(out, "ours", "10000", "0.50x", "1.00x") {
		t.Errorf("ours rate row wrong:\n%s", out)
	}
}

// lineHas reports whether some line starts with peer (after indentation) and
// holds every field, in order.
func lineHas(out, peer string, fields ...string) bool {
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || f[0] != peer {
			continue
		}
		rest := strings.Join(f[1:], " ")
		ok := true
		for _, want := range fields {
			i := strings.Index(rest, want)
			if i < 0 {
				ok = false
				break
			}
			rest = rest[i+len(want):]
		}
		if ok {
			return true
		}
	}
	return false
}

func TestWriteJSON(t *testing.T) {
	path := filepath.Join(t.TempDir(), "results", "latest.json")
	if err := WriteJSON(path, sampleRun()); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var back Run
	if err := json.Unmarshal(data, &back); err != nil {
		t.Fatal(err)
	}
	if len(back.Results) != 7 || back.Results[3].Err != "not installed" {
		t.Fatalf("round trip lost results: %+v", back.Results)
	}
}

// The header warns of a busy machine by what was busy when the run
// started, not by the load average, which stays high for minutes after a
// burst of processes has ended.
func TestWriteTextBusyMachine(t *testing.T) {
	const warning = "busy machine: expect noisy numbers"
	tests := []struct {
		name       string
		busy, load float64
		want       string
	}{
		{name: "idle after a burst", busy: 0.01, load: 163, want: "Machine busy at start: 1% of its CPU time over 1s (load average 163.00)"},
		{name: "busy", busy: 0.6, load: 1.5, want: "Machine busy at start: 60% of its CPU time over 1s (load average 1.50) (" + warning},
		{name: "not measured", busy: -1, load: 0.3, want: "Machine busy at start: not measured (load average 0.30)"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			run := sampleRun()
			run.Host = Host{CPUs: 2, LoadAvg: tc.load, BusyAtStart: tc.busy}
			var b strings.Builder
			if err := WriteText(&b, run); err != nil {
				t.Fatal(err)
			}
			out := b.String()
			if !strings.Contains(out, tc.want) {
				t.Errorf("header lacks %q:\n%s", tc.want, out)
			}
			if warned := strings.Contains(out, warning); warned != (tc.busy > BusyMachine) {
				t.Errorf("warned %v at %.0f%% busy, load average %.2f:\n%s", warned, 100*tc.busy, tc.load, out)
			}
		})
	}
}
