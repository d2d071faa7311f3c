package source

import "testing"

func TestParseIP(t *testing.T) {
	tests := []struct {
		in, want string // want "" means an error
	}{
		{"10.0.0.1", "10.0.0.1"},
		{"fd5e:b1b5::1", "fd5e:b1b5::1"},
		{"::ffff:10.0.0.1", "::ffff:10.0.0.1"}, // unmapped by the caller
		{"010.000.000.001", "10.0.0.1"},        // decimal, as ParseIPSloppy reads it
		{"192.168.000.255", "192.168.0.255"},
		{"10.0.0.256", ""},
		{"10.0.0", ""},
		{"10..0.1", ""},
		{"+10.0.0.1", ""},
		{"fe80::1%eth0", ""},
		{"", ""},
	}
	for _, tc := range tests {
		got, err := parseIP(tc.in)
		switch {
		case tc.want == "" && err == nil:
			t.Errorf("parseIP(%q) = %s, want an error", tc.in, got)
		case tc.want != "" && (err != nil || got.String() != tc.want):
			t.Errorf("parseIP(%q) = %s, %v; want %s", tc.in, got, err, tc.want)
		}
	}
}
