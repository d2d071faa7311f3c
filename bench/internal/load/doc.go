// Package load generates the benchmark's traffic and measures it: bulk TCP
// throughput, TCP connection rate, request/response latency at a fixed rate,
// UDP request/response rate, and holding many idle TCP connections open.
//
// Every function is bounded both in count and in time and stops early when
// its context is cancelled. The functions talk to the servers of package
// backend, directly or through a proxy; they know nothing of which peer sits
// in between, which is the job of package suite.
//
//	r, err := load.Latency(ctx, load.LatencyConfig{Addr: "127.0.0.1:30001", Rate: 5000, Duration: 5 * time.Second})
//	fmt.Println(r.P50, r.P99)
package load
