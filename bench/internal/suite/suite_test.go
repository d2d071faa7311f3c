package suite

import (
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/bench/internal/peer"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/bench/internal/report"
)

func TestValidate(t *testing.T) {
	tests := []struct {
		name    string
		cfg     Config
		wantErr string
	}{
		{name: "defaults", cfg: Config{BinDir: "bin/bench"}},
		{name: "unknown peer", cfg: Config{BinDir: "x", Peers: []string{"envoy"}}, wantErr: "unknown peer"},
		{name: "unknown group", cfg: Config{BinDir: "x", Groups: []string{"http"}}, wantErr: "unknown test group"},
		{name: "no bin dir", cfg: Config{}, wantErr: "BinDir"},
		{name: "negative rounds", cfg: Config{BinDir: "x", Rounds: -1}, wantErr: "Rounds is -1"},
		{name: "base build", cfg: Config{BinDir: "x", Peers: []string{peer.Ours, peer.OursBase}, BaseProxyBin: "/tmp/base/kube-userspace-proxy"}},
		{name: "base build without its program", cfg: Config{BinDir: "x", Peers: []string{peer.Ours, peer.OursBase}}, wantErr: "loadgen -proxy-base"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.Validate()
			if tc.wantErr == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("Validate() = %v, want an error containing %q", err, tc.wantErr)
			}
		})
	}
}

func TestValidateDefaults(t *testing.T) {
	full := Config{BinDir: "x"}
	short := Config{BinDir: "x", Short: true}
	if err := full.Validate(); err != nil {
		t.Fatal(err)
	}
	if err := short.Validate(); err != nil {
		t.Fatal(err)
	}
	if full.IdleConns != 9000 || short.IdleConns != 1000 {
		t.Fatalf("IdleConns = %d full, %d short; want 9000 and 1000", full.IdleConns, short.IdleConns)
	}
	if len(full.Peers) != len(peer.Names()) || len(full.Groups) != len(Groups()) {
		t.Fatalf("defaults: peers %v, groups %v", full.Peers, full.Groups)
	}
	if slices.Contains(full.Peers, peer.OursBase) {
		t.Fatalf("defaults: peers %v include %s, which needs a program of its own", full.Peers, peer.OursBase)
	}
}

func TestEveryGroupHasTests(t *testing.T) {
	seen := make(map[string]bool)
	for _, g := range Groups() {
		tests := fullParams(9000).tests([]string{g})
		if len(tests) == 0 {
			t.Errorf("group %s has no tests", g)
		}
		for _, tc := range tests {
			if seen[tc.ID] {
				t.Errorf("test id %s appears twice", tc.ID)
			}
			seen[tc.ID] = true
		}
	}
}

func TestMedianOfRounds(t *testing.T) {
	res := func(peer string, v float64, errText string) report.Result {
		return report.Result{Test: "tcp-connect-rate", Peer: peer, Value: v, Unit: "conn/s", Err: errText, Note: "n" + peer}
	}
	rounds := [][]report.Result{
		{res("ours", 5, ""), res("nginx", 9, ""), res("gone", 0, "not installed")},
		{res("ours", 1, ""), res("nginx", 7, ""), res("gone", 0, "not installed")},
		{res("ours", 3, ""), res("nginx", 0, "crashed"), res("gone", 0, "not installed")},
	}
	got := medianOfRounds(rounds)
	if len(got) != 3 {
		t.Fatalf("got %d results, want 3: %+v", len(got), got)
	}
	ours, nginx, gone := got[0], got[1], got[2]
	if ours.Peer != "ours" || ours.Value != 3 || ours.Extra["min"] != 1 || ours.Extra["max"] != 5 || ours.Extra["rounds"] != 3 {
		t.Errorf("ours = %+v; want median 3 of 1..5 over 3 rounds", ours)
	}
	if !strings.HasPrefix(ours.Note, "median of 3 rounds, 1–5; nours") {
		t.Errorf("ours note = %q", ours.Note)
	}
	// Two good rounds: the mean of the middle two; the failure is counted.
	if nginx.Value != 8 || !strings.Contains(nginx.Note, "median of 2 rounds, 7–9, 1 failed") || !nginx.OK() {
		t.Errorf("nginx = %+v; want 8 from 7 and 9, one round failed", nginx)
	}
	if gone.OK() || gone.Err != "not installed" {
		t.Errorf("gone = %+v; want the failure kept", gone)
	}
	// One round passes through untouched.
	one := medianOfRounds(rounds[:1])
	if one[0].Value != 5 || one[0].Note != "nours" || one[0].Extra != nil {
		t.Errorf("one round changed: %+v", one[0])
	}
}

func TestPairRatios(t *testing.T) {
	res := func(peer string, v float64, errText string) report.Result {
		return report.Result{Test: "udp-rate", Peer: peer, Value: v, Err: errText}
	}
	// The machine gets faster and slower from round to round; within a
	// round, ours is always above nginx.
	rounds := [][]report.Result{
		{res("none", 100, ""), res("ours", 40, ""), res("nginx", 36, "")},
		{res("none", 200, ""), res("ours", 80, ""), res("nginx", 64, "")},
		{res("none", 60, ""), res("ours", 30, ""), res("nginx", 0, "crashed")},
		{res("none", 300, ""), res("ours", 66, ""), res("nginx", 60, "")},
	}
	got := medianOfRounds(rounds)
	pairRatios(got, rounds, "ours", "none")
	byPeer := map[string]report.Result{}
	for _, r := range got {
		byPeer[r.Peer] = r
	}
	near := func(a, b float64) bool { return math.Abs(a-b) < 1e-9 }
	// Ours to nginx over the three rounds both ran: 40/36, 80/64, 66/60.
	// The ratio of the medians, 53/60 = 0.88, would put ours below nginx,
	// though ours was above it in every round.
	if r := byPeer["ours"].Value / byPeer["nginx"].Value; !near(r, 53.0/60) {
		t.Fatalf("ratio of medians %v; the example no longer shows the point", r)
	}
	ng := byPeer["nginx"].Extra
	if !near(ng[report.OursRatio], 1.1111111111111112) || !near(ng[report.OursRatio+"_min"], 1.1) || !near(ng[report.OursRatio+"_max"], 1.25) {
		t.Errorf("nginx ours ratio = %v; want median 40/36 of 1.10..1.25", ng)
	}
	// nginx to none: 0.36, 0.32, 0.2.
	if !near(ng[report.BaseRatio], 0.32) || !near(ng[report.BaseRatio+"_min"], 0.2) || !near(ng[report.BaseRatio+"_max"], 0.36) {
		t.Errorf("nginx base ratio = %v; want median 0.32 of 0.2..0.36", ng)
	}
	// Ours to none over four rounds: 0.4, 0.4, 0.5, 0.22: the mean of the middle two.
	o := byPeer["ours"].Extra
	if !near(o[report.BaseRatio], 0.4) || !near(o[report.BaseRatio+"_min"], 0.22) {
		t.Errorf("ours base ratio = %v; want median 0.4 from 0.22", o)
	}
	if _, ok := o[report.OursRatio]; ok {
		t.Errorf("ours has a ratio to itself: %v", o)
	}
	if _, ok := byPeer["none"].Extra[report.BaseRatio]; ok {
		t.Errorf("none has a ratio to itself: %v", byPeer["none"].Extra)
	}
	// A peer with one round beside ours gets no round-by-round ratio.
	short := [][]report.Result{
		{res("ours", 40, ""), res("nginx", 36, "")},
		{res("ours", 80, ""), res("nginx", 0, "crashed")},
	}
	got = medianOfRounds(short)
	pairRatios(got, short, "ours", "none")
	if _, ok := got[1].Extra[report.OursRatio]; ok {
		t.Errorf("one paired round gave a ratio: %v", got[1].Extra)
	}
}

func TestRoundedValue(t *testing.T) {
	for v, want := range map[float64]string{26834.6: "26835", 100: "100", 12.345: "12.3", 0.305: "0.305"} {
		if got := roundedValue(v); got != want {
			t.Errorf("roundedValue(%v) = %q, want %q", v, got, want)
		}
	}
}

func TestCPUResult(t *testing.T) {
	rate := func(name string, extra map[string]float64, errText string) report.Result {
		return report.Result{Test: TestUDPRate, Peer: name, Value: 1000, Unit: "req/s", Extra: extra, Err: errText}
	}
	measured := map[string]float64{"proxy_cpu_us_per_req": 27.5, "machine_cpu_us_per_req": 61}
	tests := []struct {
		name      string
		rate      report.Result
		wantValue float64
		wantErr   string
	}{
		{name: "measured", rate: rate(peer.Nginx, measured, ""), wantValue: 27.5},
		{name: "the rate failed", rate: rate(peer.Nginx, nil, "crashed"), wantErr: "crashed"},
		{name: "no proxy", rate: rate(peer.None, map[string]float64{"machine_cpu_us_per_req": 30}, ""), wantErr: "no proxy"},
		{name: "not sampled", rate: rate(peer.Ours, map[string]float64{}, ""), wantErr: "could not be read"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := cpuResult(TestUDPCPU, tc.rate, "req")
			if got.Test != TestUDPCPU || got.Peer != tc.rate.Peer || got.Unit != "µs" {
				t.Fatalf("row %+v", got)
			}
			if tc.wantErr != "" {
				if !strings.Contains(got.Err, tc.wantErr) {
					t.Fatalf("error %q, want it to say %q", got.Err, tc.wantErr)
				}
				return
			}
			if got.Err != "" || got.Value != tc.wantValue || !strings.Contains(got.Note, "machine 61 µs/req") {
				t.Fatalf("row %+v, want %v µs and the machine's 61 µs/req in the note", got, tc.wantValue)
			}
		})
	}
}
