package portal

import (
	"fmt"
	"strings"
)

// Backend is an iptables backend: the kernel interface that the iptables
// binaries drive. Rules written through the wrong one are silently
// ignored by the host's other tools' view, so the portal writes where the
// host's existing rules live.
type Backend string

// The iptables backends.
const (
	BackendNFT    Backend = "nft"
	BackendLegacy Backend = "legacy"
)

// hintChains are chains Kubernetes components create to mark the backend
// they use (kubelet's canary and kube-proxy's hint).
var hintChains = []string{":KUBE-IPTABLES-HINT ", ":KUBE-KUBELET-CANARY "}

// chooseBackend picks a backend from the iptables-save outputs of both
// (IPv4 and IPv6 concatenated). A Kubernetes hint chain wins; otherwise the
// backend holding more rules; on a tie, nft, Debian's default. It returns
// the reason, for the log.
func chooseBackend(legacySave, nftSave string) (Backend, string) {
	hinted := func(s string) bool {
		for _, h := range hintChains {
			if strings.Contains(s, h) {
				return true
			}
		}
		return false
	}
	switch l, n := hinted(legacySave), hinted(nftSave); {
	case l && !n:
		return BackendLegacy, "Kubernetes hint chain found in the legacy backend"
	case n && !l:
		return BackendNFT, "Kubernetes hint chain found in the nft backend"
	}
	l, n := countRules(legacySave), countRules(nftSave)
	if l > n {
		return BackendLegacy, fmt.Sprintf("legacy backend holds more rules (%d legacy, %d nft)", l, n)
	}
	return BackendNFT, fmt.Sprintf("nft backend holds as many rules or more (%d nft, %d legacy)", n, l)
}

// ownsAnything reports whether iptables-save output holds any of our chains.
func ownsAnything(save string) bool {
	for _, chains := range ownedChains {
		for _, c := range chains {
			if strings.Contains(save, ":"+c+" ") {
				return true
			}
		}
	}
	return false
}
