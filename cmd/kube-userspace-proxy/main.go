// Command kube-userspace-proxy is a userspace L4 service proxy for
// Kubernetes: kube-proxy's removed userspace mode, rebuilt.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/pflag"
	"k8s.io/klog/v2"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/proxyserver"
)

func main() {
	cfg := proxyserver.NewConfig()
	fs := pflag.NewFlagSet("kube-userspace-proxy", pflag.ContinueOnError)
	cfg.AddFlags(fs)
	klogFlags := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(klogFlags)
	fs.AddGoFlagSet(klogFlags)
	if err := fs.Parse(os.Args[1:]); err != nil {
		if err == pflag.ErrHelp {
			os.Exit(0)
		}
		fmt.Fprintln(os.Stderr, "kube-userspace-proxy:", err)
		os.Exit(2)
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "kube-userspace-proxy: unexpected arguments %q (every option is a flag)\n", fs.Args())
		os.Exit(2)
	}
	if err := cfg.Validate(); err != nil {
		fmt.Fprintf(os.Stderr, "kube-userspace-proxy: invalid options:\n%v\n", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := proxyserver.Run(ctx, cfg)
	klog.Flush()
	if err != nil {
		fmt.Fprintln(os.Stderr, "kube-userspace-proxy:", err)
		os.Exit(1)
	}
}
