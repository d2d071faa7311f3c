package suite

import (
	"strings"
	"testing"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/bench/internal/peer"
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
