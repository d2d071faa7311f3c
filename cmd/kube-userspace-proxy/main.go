// Command kube-userspace-proxy is a userspace L4 service proxy for
// Kubernetes: kube-proxy's removed userspace mode, rebuilt.
package main

import (
	"cmp"
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"syscall"

	"github.com/spf13/pflag"
	k8sversion "k8s.io/apimachinery/pkg/version"
	"k8s.io/klog/v2"

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
	showVersion := fs.String("version", "false", "Print the version and exit; --version=raw prints it field by field, as kube-proxy does.")
	fs.Lookup("version").NoOptDefVal = "true"
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
	case "false":
	case "true":
		fmt.Println("kube-userspace-proxy", buildVersion())
		os.Exit(0)
	case "raw":
		fmt.Printf("%#v\n", rawVersion())
		os.Exit(0)
	default:
		fmt.Fprintf(os.Stderr, "kube-userspace-proxy: --version=%s: want true, false or raw (this proxy cannot report another version, as kube-proxy's --version=vX.Y.Z does)\n", *showVersion)
		os.Exit(2)
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "kube-userspace-proxy: unexpected arguments %q (every option is a flag)\n", fs.Args())
		os.Exit(2)
	}
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

// version is set by the Makefile (-ldflags -X) to `git describe` of the
// checkout it builds; go build and go install leave it empty.
var version string

// buildVersion describes the build: version, else the module version (or
// "(devel)") with the commit when the go command stamped one, and the Go
// toolchain and platform.
func buildVersion() string {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return cmp.Or(version, "(unknown)") + " " + runtime.Version()
	}
	if version != "" {
		return fmt.Sprintf("%s %s %s/%s", version, info.GoVersion, runtime.GOOS, runtime.GOARCH)
	}
	v := info.Main.Version
	var rev, modified string
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			if s.Value == "true" {
				modified = " (modified)"
			}
		}
	}
	if rev != "" {
		v += " commit " + rev[:min(12, len(rev))] + modified
	}
	return fmt.Sprintf("%s %s %s/%s", v, info.GoVersion, runtime.GOOS, runtime.GOARCH)
}

// rawVersion is the build as kube-proxy's --version=raw shows its own:
// what buildVersion says, field by field.
func rawVersion() k8sversion.Info {
	info := k8sversion.Info{GitVersion: cmp.Or(version, "(devel)"), GoVersion: runtime.Version(),
		Compiler: runtime.Compiler, Platform: runtime.GOOS + "/" + runtime.GOARCH}
	if bi, ok := debug.ReadBuildInfo(); ok {
		if version == "" {
			info.GitVersion = bi.Main.Version
		}
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				info.GitCommit = s.Value
			case "vcs.modified":
				info.GitTreeState = map[string]string{"true": "dirty", "false": "clean"}[s.Value]
			case "vcs.time":
				info.BuildDate = s.Value
			}
		}
	}
	return info
}
