package buildinfo

import (
	"regexp"
	"testing"
)

// TestUserAgent: client-go's shape, name/version (os/arch)
// kubernetes/commit, with a version that is neither client-go's v0.0.0
// nor an unexpanded $Format.
func TestUserAgent(t *testing.T) {
	for _, v := range []string{"", "v0.3.0-4-gabcdef0"} {
		version = v
		ua := UserAgent()
		if !regexp.MustCompile(`^[^/ ]+/[^ ()]+ \([a-z0-9]+/[a-z0-9]+\) kubernetes/[^ ]+$`).MatchString(ua) {
			t.Errorf("version %q: User-Agent %q is not name/version (os/arch) kubernetes/commit", v, ua)
		}
		if regexp.MustCompile(`v0\.0\.0|\$Format`).MatchString(ua) {
			t.Errorf("version %q: User-Agent %q has client-go's placeholder version", v, ua)
		}
		if v != "" && !regexp.MustCompile(`/`+regexp.QuoteMeta(v)+` `).MatchString(ua) {
			t.Errorf("User-Agent %q does not carry the stamped version %s", ua, v)
		}
	}
	version = ""
}

// TestStampedCommit: the commit the Makefile stamps is in String, Info
// and the User-Agent, and the User-Agent's product is the proxy's name.
func TestStampedCommit(t *testing.T) {
	version, commit = "v0.3.0-4-gabcdef0-dirty", "abcdef0123456789abcdef0123456789abcdef01"
	defer func() { version, commit = "", "" }()
	if s := String(); !regexp.MustCompile(`^v0\.3\.0-4-gabcdef0-dirty commit abcdef012345 `).MatchString(s) {
		t.Errorf("String() = %q, want the version and commit", s)
	}
	if i := Info(); i.GitCommit != commit || i.GitTreeState != "dirty" {
		t.Errorf("Info() = %+v, want GitCommit %s and GitTreeState dirty", i, commit)
	}
	if ua := UserAgent(); !regexp.MustCompile(`^kube-userspace-proxy/v0\.3\.0-4-gabcdef0-dirty \(.*\) kubernetes/abcdef0$`).MatchString(ua) {
		t.Errorf("UserAgent() = %q", ua)
	}
}

// TestStringNamesDataPlane: String ends with the data plane this build
// runs, so that --version tells the goroutine build from the event loops.
func TestStringNamesDataPlane(t *testing.T) {
	if s := String(); !regexp.MustCompile(`^\S.* [a-z0-9]+/[a-z0-9]+, (event loops|goroutines)$`).MatchString(s) || !regexp.MustCompile(", "+DataPlane+"$").MatchString(s) {
		t.Errorf("String() = %q, want it to end with the platform and %q", s, DataPlane)
	}
}
