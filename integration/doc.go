// Package integration holds the end-to-end tests of kube-userspace-proxy:
// the real binary, real sockets and real clients (curl, nc), and, for the
// kernel and cluster paths, network namespaces and a real kube-apiserver.
//
// The tests are behind the build tag "integration", which `make test`
// always sets. Tests that need root or a missing tool skip with the reason,
// except under CI=true, where they fail. They need Linux (network
// namespaces, netfilter, veth): elsewhere the package builds empty.
package integration
