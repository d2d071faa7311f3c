// Command iocopy is the "go-iocopy" peer: a minimal Go TCP proxy, io.Copy in
// both directions, one listener per -map, until SIGINT or SIGTERM.
//
//	iocopy -map 127.0.0.1:30001=127.0.0.1:31001 -map 127.0.0.1:30002=127.0.0.1:31002
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/bench/internal/iocopy"
)

// maps collects repeated -map LISTEN=TARGET flags.
type maps [][2]string

func (m *maps) String() string { return fmt.Sprint(*m) }

func (m *maps) Set(v string) error {
	listen, target, ok := strings.Cut(v, "=")
	if !ok || listen == "" || target == "" {
		return fmt.Errorf("want LISTEN=TARGET, got %q", v)
	}
	*m = append(*m, [2]string{listen, target})
	return nil
}

func main() {
	var m maps
	flag.Var(&m, "map", "LISTEN=TARGET, repeatable")
	flag.Parse()
	if len(m) == 0 {
		fmt.Fprintln(os.Stderr, "iocopy: at least one -map is required")
		os.Exit(2)
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var proxies []*iocopy.Proxy
	for _, lt := range m {
		p, err := iocopy.Listen(lt[0], lt[1])
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		p.Serve()
		proxies = append(proxies, p)
	}
	<-ctx.Done()
	for _, p := range proxies {
		p.Close()
	}
}
