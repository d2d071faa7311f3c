// Package peer starts and stops the proxies the benchmark compares, each on
// ports of its own on 127.0.0.1, in front of the same backends: no proxy at
// all ("none", the limit), kube-userspace-proxy, HAProxy (mode tcp, splice),
// the nginx stream module, socat (fork) and a minimal Go io.Copy proxy
// ("go-iocopy").
//
// The package owns each peer's configuration file, command line, readiness
// check and version string. It leaves installing the programs to
// bench/run.sh, driving load to package load, and the order of the run to
// package suite.
//
//	in, err := peer.Start(ctx, "haproxy", env)
//	if err != nil { ... } // not installed, or did not come up
//	defer in.Stop()
//	load.Latency(ctx, load.LatencyConfig{Addr: in.Front.Echo})
package peer
