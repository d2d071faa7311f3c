// Command kube-userspace-proxy is a userspace L4 service proxy for
// Kubernetes: kube-proxy's removed userspace mode, rebuilt.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"

	"github.com/spf13/pflag"
	"k8s.io/klog/v2"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/internal/buildinfo"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/proxyserver"
)

func main() {
	cfg := proxyserver.NewConfig()
	fs := pflag.NewFlagSet("kube-userspace-proxy", pflag.ContinueOnError)
	fs.SetOutput(os.Stdout) // --help is asked for: it goes where `| less` reads
	// As kube-proxy's: --log_dir and --log-dir, --kube_api_qps and
	// --kube-api-qps are the same flag.
	fs.SetNormalizeFunc(func(_ *pflag.FlagSet, name string) pflag.NormalizedName {
		return pflag.NormalizedName(strings.ReplaceAll(name, "_", "-"))
	})
	cfg.AddFlags(fs)
	showVersion := proxyserver.AddVersionFlag(fs)
	proxyserver.SetUsage(fs)
	klogFlags := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(klogFlags)
	fs.AddGoFlagSet(klogFlags)
	// klog's file and header options still work, but --help shows only
	// the two a user of this proxy needs, as kube-proxy's does.
	klogFlags.VisitAll(func(f *flag.Flag) {
		if f.Name != "v" && f.Name != "vmodule" {
			_ = fs.MarkHidden(f.Name)
		}
	})
	fs.Lookup("v").Usage = "Log verbosity: 2 logs syncs and listener changes, 4 every connection and UDP session."
	if err := fs.Parse(os.Args[1:]); err != nil {
		if err == pflag.ErrHelp {
			os.Exit(0)
		}
		fmt.Fprintln(os.Stderr, "kube-userspace-proxy:", err)
		os.Exit(2)
	}
	switch *showVersion {
	case "true":
		fmt.Println("kube-userspace-proxy", buildinfo.String())
		os.Exit(0)
	case "raw":
		fmt.Printf("%#v\n", buildinfo.Info())
		os.Exit(0)
	case "false":
	default:
		fmt.Fprintf(os.Stderr, "kube-userspace-proxy: --version=%s: want true, false or raw (this proxy cannot report another version, as kube-proxy's --version=vX.Y.Z does)\n", *showVersion)
		os.Exit(2)
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "kube-userspace-proxy: unexpected arguments %q (every option is a flag)\n", fs.Args())
		os.Exit(2)
	}
	// As kube-proxy, first of all: which build this is (before what
	// reading the --config file logs).
	proxyserver.LogVersion()
	proxyserver.LogFlags(fs) // at -v=1, as kube-proxy
	if err := cfg.LoadConfigFile(fs); err != nil {
		fmt.Fprintln(os.Stderr, "kube-userspace-proxy:", err)
		os.Exit(2)
	}
	if cfg.LogVerbosity != nil {
		_ = klogFlags.Set("v", fmt.Sprint(*cfg.LogVerbosity))
	}
	if cfg.LogVModule != "" {
		if err := klogFlags.Set("vmodule", cfg.LogVModule); err != nil {
			fmt.Fprintf(os.Stderr, "kube-userspace-proxy: --config %s: logging.vmodule: %v\n", cfg.ConfigFile, err)
			os.Exit(2)
		}
	}
	if err := cfg.Validate(); err != nil {
		fmt.Fprintf(os.Stderr, "kube-userspace-proxy: invalid options:\n%v\n", err)
		os.Exit(2)
	}
	if cfg.WriteConfigTo != "" {
		verbosity, _ := strconv.Atoi(klogFlags.Lookup("v").Value.String())
		keep, err := cfg.WriteConfigFile(verbosity)
		if err != nil {
			fmt.Fprintf(os.Stderr, "kube-userspace-proxy: %v\n", err)
			os.Exit(2)
		}
		fmt.Printf("Wrote %s; run with --config %s", cfg.WriteConfigTo, cfg.WriteConfigTo)
		if len(keep) > 0 {
			fmt.Printf(" and the options it cannot hold: %s", strings.Join(keep, " "))
		}
		fmt.Println()
		os.Exit(0)
	}
	if err := cfg.LoadKubeconfig(); err != nil {
		fmt.Fprintln(os.Stderr, "kube-userspace-proxy:", err)
		os.Exit(2)
	}
	// SIGHUP too: a closed terminal or a stray reload request ends the
	// proxy as cleanly, and as visibly, as SIGTERM.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	defer stop()
	err := proxyserver.Run(ctx, cfg)
	klog.Flush()
	if err != nil {
		fmt.Fprintln(os.Stderr, "kube-userspace-proxy:", err)
		os.Exit(1)
	}
}
