// Package suite runs the whole benchmark: it starts the backends, then each
// peer in turn, runs every test against it, stops it, and reports the
// results side by side.
//
// It owns the order of the run, the parameters of each test (full and
// short), and the idle-connection holders, which run as separate processes
// (the load generator re-executed with "hold") so that no process of ours
// holds more than a few thousand of the client sockets. Measuring is left to
// package load, peers to package peer, and formatting to package report.
//
//	run, err := suite.Run(ctx, suite.Config{Short: true, BinDir: "bin/bench", Out: os.Stdout})
package suite
