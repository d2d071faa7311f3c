package proxyserver

import (
	"fmt"
	"testing"

	v1 "k8s.io/api/core/v1"
)

func TestPrimaryIPs(t *testing.T) {
	addr := func(t v1.NodeAddressType, a string) v1.NodeAddress { return v1.NodeAddress{Type: t, Address: a} }
	tests := []struct {
		name  string
		addrs []v1.NodeAddress
		want  string
	}{
		{"none", nil, "[]"},
		{"first InternalIP of each family", []v1.NodeAddress{
			addr(v1.NodeHostName, "node-a"), addr(v1.NodeExternalIP, "203.0.113.1"), addr(v1.NodeInternalIP, "fd5e:b1b5:1::1"),
			addr(v1.NodeInternalIP, "198.18.1.1"), addr(v1.NodeInternalIP, "198.18.1.2"),
		}, "[198.18.1.1 fd5e:b1b5:1::1]"},
		{"ExternalIP when a family has no InternalIP", []v1.NodeAddress{
			addr(v1.NodeInternalIP, "198.18.1.1"), addr(v1.NodeExternalIP, "2001:db8::1"), addr(v1.NodeExternalIP, "203.0.113.1"),
		}, "[198.18.1.1 2001:db8::1]"},
		{"garbage skipped", []v1.NodeAddress{addr(v1.NodeInternalIP, "node-a"), addr(v1.NodeInternalIP, "198.18.1.1")}, "[198.18.1.1]"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			n := &v1.Node{Status: v1.NodeStatus{Addresses: tc.addrs}}
			if got := fmt.Sprint(primaryIPs(n)); got != tc.want {
				t.Errorf("primaryIPs = %s, want %s", got, tc.want)
			}
		})
	}
}

func TestValidateNodePortAddressesPrimary(t *testing.T) {
	for _, tc := range []struct {
		list    []string
		primary bool
		err     bool
	}{
		{[]string{"primary"}, true, false},
		{[]string{" primary ", ""}, true, false},
		{[]string{"primary", "10.0.0.0/8"}, true, true},
		{[]string{"10.0.0.0/8"}, false, false},
	} {
		c := NewConfig()
		c.Manifests = "x"
		c.NodePortAddresses = tc.list
		err := c.Validate()
		if (err != nil) != tc.err || c.nodePortsPrimary != tc.primary {
			t.Errorf("--nodeport-addresses=%q: primary %v, %v; want primary %v, error %v", tc.list, c.nodePortsPrimary, err, tc.primary, tc.err)
		}
	}
}
