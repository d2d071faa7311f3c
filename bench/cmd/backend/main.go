// Command backend runs the benchmark's backend servers: TCP echo, TCP bulk
// source/sink and UDP echo, until SIGINT or SIGTERM.
//
//	backend -echo 127.0.0.1:31001 -bulk 127.0.0.1:31002 -udp 127.0.0.1:31003
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/bench/internal/backend"
)

func main() {
	var cfg backend.Config
	flag.StringVar(&cfg.Echo, "echo", "", "TCP echo listen address (empty: off)")
	flag.StringVar(&cfg.Bulk, "bulk", "", "TCP bulk source/sink listen address (empty: off)")
	flag.StringVar(&cfg.UDP, "udp", "", "UDP echo listen address (empty: off)")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	s, err := backend.Listen(cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	s.Serve()
	<-ctx.Done()
	s.Close()
}
