package portal

import (
	"slices"
	"testing"
)

func TestKubeProxyInSave(t *testing.T) {
	cases := []struct {
		name          string
		save          string
		chains, jumps []string
	}{
		{
			name: "iptables mode left behind",
			save: `*nat
:PREROUTING ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:KUBE-SERVICES - [0:0]
:KUBE-NODEPORTS - [0:0]
:KUBE-PORTALS-CONTAINER - [0:0]
-A PREROUTING -m comment --comment "kube-userspace-proxy service portals; keep before the node port jump" -j KUBE-PORTALS-CONTAINER
-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A OUTPUT -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A KUBE-SERVICES -m comment --comment "kubernetes service nodeports; NOTE: this must be the last rule in this chain" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS
COMMIT
*filter
:KUBE-FORWARD - [0:0]
-A FORWARD -j KUBE-SERVICES
COMMIT
`,
			chains: []string{"KUBE-SERVICES", "KUBE-NODEPORTS"},
			jumps:  []string{"OUTPUT -j KUBE-SERVICES", "PREROUTING -j KUBE-SERVICES"},
		},
		{
			name:   "chains nothing jumps to",
			save:   "*nat\n:KUBE-SERVICES - [0:0]\n-A KUBE-SERVICES -j KUBE-NODEPORTS\nCOMMIT\n",
			chains: []string{"KUBE-SERVICES"},
		},
		{
			name:   "a jump straight to the node ports",
			save:   "*nat\n:KUBE-NODEPORTS - [0:0]\n[3:180] -A PREROUTING -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS\nCOMMIT\n",
			chains: []string{"KUBE-NODEPORTS"},
			jumps:  []string{"PREROUTING -j KUBE-NODEPORTS"},
		},
		{name: "ours only", save: "*nat\n:KUBE-PORTALS-HOST - [0:0]\n-A OUTPUT -j KUBE-PORTALS-HOST\nCOMMIT\n"},
		{name: "unparsable", save: "-A PREROUTING -j KUBE-SERVICES\n"},
		{name: "empty"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			chains, jumps := kubeProxyInSave(tc.save)
			if !slices.Equal(chains, tc.chains) || !slices.Equal(jumps, tc.jumps) {
				t.Errorf("kubeProxyInSave = %q, %q; want %q, %q", chains, jumps, tc.chains, tc.jumps)
			}
		})
	}
}

func TestKubeProxyJumpsListed(t *testing.T) {
	listed := map[string][]string{
		"PREROUTING": {"-P PREROUTING ACCEPT", `-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES`, "-A PREROUTING -j KUBE-PORTALS-CONTAINER"},
		"OUTPUT":     {"-P OUTPUT ACCEPT"},
	}
	if got, want := kubeProxyJumpsListed(listed), []string{"PREROUTING -j KUBE-SERVICES"}; !slices.Equal(got, want) {
		t.Errorf("kubeProxyJumpsListed = %q, want %q", got, want)
	}
}
