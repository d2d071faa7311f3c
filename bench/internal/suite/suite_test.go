package suite

import (
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

func TestRoundedValue(t *testing.T) {
	for v, want := range map[float64]string{26834.6: "26835", 100: "100", 12.345: "12.3", 0.305: "0.305"} {
		if got := roundedValue(v); got != want {
			t.Errorf("roundedValue(%v) = %q, want %q", v, got, want)
		}
	}
}
