package source

import (
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"

	"k8s.io/klog/v2"
)

// logLines collects what klog writes while a test runs. The watch logs
// from its own goroutine, so writes and reads take a lock.
type logLines struct {
	mu  sync.Mutex
	buf strings.Builder
}

func (l *logLines) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

// since returns the lines written after the first n bytes, and the
// length to pass next time.
func (l *logLines) since(n int) (string, int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.buf.String()
	return s[n:], len(s)
}

// captureLog sends klog's output to the returned logLines until the test
// ends. No test of this package runs in parallel, so the lines are this
// test's.
func captureLog(t *testing.T) *logLines {
	t.Helper()
	l := &logLines{}
	klog.LogToStderr(false)
	klog.SetOutputBySeverity("INFO", l) // the other severities write here too
	klog.SetOutputBySeverity("WARNING", io.Discard)
	klog.SetOutputBySeverity("ERROR", io.Discard)
	t.Cleanup(func() {
		klog.Flush()
		klog.SetOutput(os.Stderr)
		klog.LogToStderr(true)
	})
	return l
}

// linesMatching returns how many lines of s match the regular expression re.
func linesMatching(s, re string) int {
	return len(regexp.MustCompile(re).FindAllStringIndex(s, -1))
}

// TestManifestRebuildLogsWhatIsNew: when this host's addresses change
// what the file serves, the log says what the change ignores anew (an
// endpoint now on an address of this host) and nothing it said when the
// file was read: not its warnings, not what was ignored already.
func TestManifestRebuildLogsWhatIsNew(t *testing.T) {
	logs := captureLog(t)
	data := webAndNodePort(29999, "192.0.2.9", "10.0.0.4", "127.0.0.1")
	w, _, path, hostBecomes := runWithHostAddrs(t, data)
	read, n := logs.since(0)
	for _, want := range []struct {
		re string
		n  int
	}{
		{`"Manifest warning".*nodePort`, 1},
		{`"Manifest object partly ignored".*127\.0\.0\.1`, 1},
		{`"Manifest object partly ignored"`, 1},
	} {
		if got := linesMatching(read, want.re); got != want.n {
			t.Errorf("the first read logged %d lines matching %s, want %d:\n%s", got, want.re, want.n, read)
		}
	}

	hostBecomes("192.0.2.9")
	if r := w.next(); r.outcome != outcomeApplied || r.err != nil {
		t.Fatalf("after the host change: outcome %d (%v), want applied", r.outcome, r.err)
	}
	after, n := logs.since(n)
	for _, want := range []struct {
		re string
		n  int
	}{
		{`"Manifest object partly ignored".*192\.0\.2\.9:29999 is an address of this host`, 1},
		{`"Manifest object partly ignored"`, 1}, // not 127.0.0.1 again
		{`"Manifest warning"`, 0},
		{`"Applying the manifests again: this host's addresses changed`, 1},
	} {
		if got := linesMatching(after, want.re); got != want.n {
			t.Errorf("after the host change, %d lines matching %s, want %d:\n%s", got, want.re, want.n, after)
		}
	}

	// An edit is read afresh: all it warns of and ignores is said again.
	if err := os.WriteFile(path, []byte(data+"# edited\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	w.waitFor(outcomeSame)
	edited, _ := logs.since(n)
	for _, want := range []struct {
		re string
		n  int
	}{
		{`"Manifest warning".*nodePort`, 1},
		{`"Manifest object partly ignored".*127\.0\.0\.1`, 1},
		{`"Manifest object partly ignored".*192\.0\.2\.9`, 1},
	} {
		if got := linesMatching(edited, want.re); got != want.n {
			t.Errorf("after an edit, %d lines matching %s, want %d:\n%s", got, want.re, want.n, edited)
		}
	}
}

// TestManifestValidAgainLogged: the log says the file is valid again once,
// at the first good read after a rejected edit, and at no other read.
func TestManifestValidAgainLogged(t *testing.T) {
	logs := captureLog(t)
	path := filepath.Join(t.TempDir(), "demo.yaml")
	if err := os.WriteFile(path, []byte(manifestWith("127.0.0.1")), 0o644); err != nil {
		t.Fatal(err)
	}
	w, _ := startWatch(t, path)
	const validAgain = `"Manifest file is valid again"`
	n := 0
	step := func(what, content string, outcome reloadOutcome, wantValid int) {
		t.Helper()
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := w.waitFor(outcome); outcome != outcomeRejected && err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		var s string
		s, n = logs.since(n)
		if got := linesMatching(s, validAgain); got != wantValid {
			t.Errorf("%s: %d lines %s, want %d:\n%s", what, got, validAgain, wantValid, s)
		}
	}
	step("a good edit", manifestWith("127.0.0.2"), outcomeApplied, 0)
	step("a broken edit", "kind: Service\nspec: [", outcomeRejected, 0)
	step("another broken edit", "kind: Service\nspec: {", outcomeRejected, 0)
	step("the fix", manifestWith("127.0.0.3"), outcomeApplied, 1)
	step("a good edit after it", manifestWith("127.0.0.4"), outcomeApplied, 0)
}
