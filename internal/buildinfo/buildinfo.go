// Package buildinfo says which build of the proxy is running: for
// --version, the start-up log, the kubernetes_build_info metric and the
// API client's User-Agent. It owns the version the Makefile stamps
// (-ldflags "-X .../internal/buildinfo.version=..."); what the go command
// stamped (module version, VCS revision) fills in the rest.
//
//	fmt.Println(buildinfo.String()) // v0.3.0-12-gabc go1.26.8 linux/amd64
package buildinfo

import (
	"cmp"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strings"

	k8sversion "k8s.io/apimachinery/pkg/version"
)

// version is set by the Makefile (-ldflags -X) to `git describe` of the
// checkout it builds; go build and go install leave it empty.
var version string

// Name is the binary's name, for the User-Agent when os.Args[0] has none.
const Name = "kube-userspace-proxy"

// String describes the build: version, else the module version (or
// "(devel)") with the commit when the go command stamped one, and the Go
// toolchain and platform.
func String() string {
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

// Info is the build as kube-proxy's --version=raw shows its own: what
// String says, field by field. GitVersion is "(devel)" for a build nobody
// stamped.
func Info() k8sversion.Info {
	info := k8sversion.Info{GitVersion: cmp.Or(version, "(devel)"), GoVersion: runtime.Version(),
		Compiler: runtime.Compiler, Platform: runtime.GOOS + "/" + runtime.GOARCH}
	if bi, ok := debug.ReadBuildInfo(); ok {
		if version == "" && bi.Main.Version != "" {
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

// UserAgent is the API client's User-Agent, in client-go's shape
// (rest.DefaultKubernetesUserAgent) but with this proxy's name and version
// where client-go would put its own (v0.0.0, $Format): e.g.
// "kube-userspace-proxy/v0.3.0 (linux/amd64) kubernetes/abc1234".
func UserAgent() string {
	info := Info()
	name := Name
	if len(os.Args) > 0 {
		if b := filepath.Base(os.Args[0]); b != "" && b != "." && b != "/" {
			name = b
		}
	}
	v := strings.Trim(info.GitVersion, "()") // "(devel)" is no product version
	commit := cmp.Or(info.GitCommit, "unknown")
	return fmt.Sprintf("%s/%s (%s) kubernetes/%s", name, v, info.Platform, commit[:min(7, len(commit))])
}
