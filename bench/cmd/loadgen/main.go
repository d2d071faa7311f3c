// Command loadgen runs the side-by-side benchmark of kube-userspace-proxy and
// its peers on 127.0.0.1 and prints one table per test; bench/run.sh builds
// everything and runs it. "loadgen hold ..." is the idle-connection holder it
// starts for itself.
//
//	loadgen -short -bin-dir bin/bench -proxy bin/kube-userspace-proxy
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/bench/internal/peer"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/bench/internal/report"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/bench/internal/suite"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if len(os.Args) > 1 && os.Args[1] == "hold" {
		os.Exit(hold(ctx, os.Args[2:]))
	}
	os.Exit(bench(ctx))
}

func hold(ctx context.Context, args []string) int {
	// Make stdin pollable so the holder can stop waiting on it by deadline.
	syscall.SetNonblock(0, true)
	stdin := os.NewFile(0, "stdin")
	if err := suite.Hold(ctx, args, stdin, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

func bench(ctx context.Context) int {
	var cfg suite.Config
	var peers, groups, jsonPath string
	self, _ := os.Executable()
	flag.BoolVar(&cfg.Short, "short", false, "smoke run: every test briefly (about 30s in all)")
	flag.StringVar(&peers, "peers", strings.Join(peer.Names(), ","), "comma-separated peers to run")
	flag.StringVar(&groups, "tests", strings.Join(suite.Groups(), ","), "comma-separated test groups to run")
	flag.StringVar(&cfg.BinDir, "bin-dir", filepath.Dir(self), "directory holding the backend and iocopy programs")
	flag.StringVar(&cfg.ProxyBin, "proxy", "bin/kube-userspace-proxy", "kube-userspace-proxy program (empty: not built)")
	flag.StringVar(&cfg.BaseProxyBin, "proxy-base", "", "another build of kube-userspace-proxy, run as the peer "+peer.OursBase+" (name it in -peers) to compare two builds")
	flag.IntVar(&cfg.IdleConns, "idle-conns", 0, "idle connections to hold (0: 9000, or 1000 with -short)")
	flag.IntVar(&cfg.Rounds, "rounds", 1, "run the peers this many times, interleaved, and report each value as the median of the rounds with its range")
	flag.StringVar(&jsonPath, "json", "bench/results/latest.json", "write the results as JSON here (empty: don't)")
	flag.Parse()
	cfg.Peers = splitList(peers)
	cfg.Groups = splitList(groups)
	if err := cfg.Validate(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}

	run, runErr := suite.Run(ctx, cfg)
	if runErr != nil && !errors.Is(runErr, context.Canceled) {
		fmt.Fprintln(os.Stderr, "bench:", runErr)
		return 1
	}
	if err := report.WriteText(cfg.Out, run); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		return 1
	}
	if jsonPath != "" {
		if err := report.WriteJSON(jsonPath, run); err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			return 1
		}
		fmt.Fprintf(cfg.Progress, "bench: results written to %s\n", jsonPath)
	}
	if runErr != nil {
		fmt.Fprintln(os.Stderr, "bench: interrupted")
		return 130
	}
	return 0
}

func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}
