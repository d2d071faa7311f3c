// Package integration holds the end-to-end tests of kube-userspace-proxy:
// the real binary, real sockets and real clients (curl, nc), and, for the
// kernel and cluster paths, network namespaces and a real kube-apiserver.
//
// The tests are behind the build tag "integration", which `make test`
// always sets. Tests that need root or a missing tool skip with the reason,
// except under CI=true, where they fail. They need Linux (network
// namespaces, netfilter, veth): elsewhere the package builds empty.
//
// Tests run one at a time, so that timings and descriptor counts are the
// proxy's own. The few that spend half a minute or more mostly waiting
// (on client-go's back-off, on periodic resyncs), and that share nothing
// with each other, call t.Parallel: they run together once the others are
// done, which takes over a minute off a run. A test that stops the shared
// API server must never be one of them.
package integration
