// Package buildinfo says which build of the proxy is running: for
// --version, the start-up log, the kubernetes_build_info metric and the
// API client's User-Agent. It owns the version and commit the Makefile
// stamps (-ldflags "-X .../internal/buildinfo.version=... -X
// .../internal/buildinfo.commit=..."); what the go command stamped
// (module version, VCS revision) fills in the rest.
//
//	fmt.Println(buildinfo.String()) // v0.3.0-12-gabc commit abc0123def45 go1.26.8 linux/amd64, event loops
package buildinfo

import (
	"cmp"
	"fmt"
	"runtime"
	"runtime/debug"
	"strings"

	k8sversion "k8s.io/apimachinery/pkg/version"
)

// version is set by the Makefile (-ldflags -X) to `git describe` of the
// checkout it builds; go build and go install leave it empty.
var version string

// commit is set by the Makefile (-ldflags -X) to the full hash of the
// commit it builds (git rev-parse HEAD); empty when git could not tell.
// The Makefile turns the go command's own VCS stamping off, so without it
// no commit is known.
var commit string

// commitDate is set by the Makefile (-ldflags -X) to the committer date of
// that commit (RFC 3339), the build date kubernetes_build_info reports: the
// same for every build of a commit, as the go command's vcs.time is.
var commitDate string

// Name is the proxy's name, the product in its User-Agent whatever the
// binary is called.
const Name = "kube-userspace-proxy"

// String describes the build: version, else the module version (or
// "(devel)") with the commit when the go command stamped one, the Go
// toolchain and platform, and the data plane (DataPlane).
func String() string { return describe() + ", " + DataPlane }

func describe() string {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return cmp.Or(version, "(unknown)") + " " + runtime.Version()
	}
	if version != "" {
		v := version
		if commit != "" {
			v += " commit " + commit[:min(12, len(commit))]
		}
		return fmt.Sprintf("%s %s %s/%s", v, info.GoVersion, runtime.GOOS, runtime.GOARCH)
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
	if commitDate != "" {
		info.BuildDate = commitDate
	}
	if commit != "" {
		info.GitCommit = commit
		// git describe --dirty, as the Makefile runs it, marks a tree
		// with uncommitted changes.
		info.GitTreeState = "clean"
		if strings.HasSuffix(version, "-dirty") {
			info.GitTreeState = "dirty"
		}
	}
	return info
}

// UserAgent is the API client's User-Agent, in client-go's shape
// (rest.DefaultKubernetesUserAgent) but with this proxy's name and version
// where client-go would put its own (v0.0.0, $Format): e.g.
// "kube-userspace-proxy/v0.3.0 (linux/amd64) kubernetes/abc1234". The
// product is always Name, whatever the binary is called, so audit logs
// and API priority rules can match it.
func UserAgent() string {
	info := Info()
	v := strings.Trim(info.GitVersion, "()") // "(devel)" is no product version
	rev := cmp.Or(info.GitCommit, "unknown")
	return fmt.Sprintf("%s/%s (%s) kubernetes/%s", Name, v, info.Platform, rev[:min(7, len(rev))])
}
