package source

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/state"
)

// watchTimeout bounds every wait; edits must apply well within it.
const watchTimeout = 5 * time.Second

// manifestWith returns a manifest of Service demo/web whose one endpoint
// is at addr, on port 8080.
func manifestWith(addr string) string {
	return `apiVersion: v1
kind: Service
metadata: {name: web, namespace: demo}
spec:
  ports: [{name: http, port: 80}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-1
  namespace: demo
  labels: {kubernetes.io/service-name: web}
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints: [{addresses: [` + addr + `]}]
`
}

type reloadResult struct {
	outcome reloadOutcome
	err     error
}

// watchRun is a Manifests.Run in progress.
type watchRun struct {
	t       *testing.T
	snaps   chan state.Snapshot
	reloads chan reloadResult
}

// startWatch runs Manifests on path until the test ends, and waits for the
// first snapshot.
func startWatch(t *testing.T, path string) (*watchRun, state.Snapshot) {
	t.Helper()
	return startWatchWith(t, path, nil)
}

// startWatchWith is startWatch with the file read by read (nil: as Run
// reads it).
func startWatchWith(t *testing.T, path string, read func(string) ([]byte, error)) (*watchRun, state.Snapshot) {
	t.Helper()
	m := &Manifests{
		Path:     path,
		Options:  Options{AllowLoopback: true, AllowNoClusterIP: true},
		Debounce: 20 * time.Millisecond,
		Resync:   -1,
		read:     read,
	}
	return runManifests(t, m)
}

// runManifests runs m until the test ends, with its reloads reported to
// the returned watchRun, and waits for the first snapshot.
func runManifests(t *testing.T, m *Manifests) (*watchRun, state.Snapshot) {
	t.Helper()
	w := &watchRun{t: t, snaps: make(chan state.Snapshot, 16), reloads: make(chan reloadResult, 64)}
	m.reloaded = func(o reloadOutcome, err error) { w.reloads <- reloadResult{o, err} }
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx, func(s state.Snapshot) { w.snaps <- s }) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(watchTimeout):
			t.Fatal("Run did not return after cancel")
		}
		checkNoWatcherGoroutines(t)
	})
	select {
	case s := <-w.snaps:
		return w, s
	case err := <-done:
		t.Fatalf("Run returned at start: %v", err)
	case <-time.After(watchTimeout):
		t.Fatal("no first snapshot")
	}
	return nil, state.Snapshot{}
}

// waitFor waits until a read of the file ends with want, and returns the
// outcomes seen before it.
func (w *watchRun) waitFor(want reloadOutcome) (before []reloadOutcome, err error) {
	w.t.Helper()
	timeout := time.After(watchTimeout)
	for {
		select {
		case r := <-w.reloads:
			if r.outcome == want {
				return before, r.err
			}
			before = append(before, r.outcome)
		case <-timeout:
			w.t.Fatalf("no reload with outcome %d within %s; saw %v", want, watchTimeout, before)
		}
	}
}

// snapshot returns the snapshot applied last, failing if none was.
func (w *watchRun) snapshot() state.Snapshot {
	w.t.Helper()
	select {
	case s := <-w.snaps:
		return s
	default:
		w.t.Fatal("apply was not called")
	}
	return state.Snapshot{}
}

func (w *watchRun) noSnapshot() {
	w.t.Helper()
	select {
	case s := <-w.snaps:
		w.t.Fatalf("apply was called with %v", s.Names())
	default:
	}
}

func webEndpoints(t *testing.T, s state.Snapshot) []string {
	t.Helper()
	sp := s.Get(state.ServicePortName{Namespace: "demo", Name: "web", Port: "http", Protocol: state.TCP})
	if sp == nil {
		t.Fatalf("no demo/web:http in %v", s.Names())
	}
	return addrs(sp.ClusterEndpoints)
}

// writeByRename writes data to a new file and renames it over path, as
// many editors and tools do.
func writeByRename(t *testing.T, path, data string) {
	t.Helper()
	tmp := filepath.Join(filepath.Dir(path), "."+filepath.Base(path)+".tmp")
	if err := os.WriteFile(tmp, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// checkNoWatcherGoroutines checks that fsnotify's reader goroutine is gone.
// fsnotify's Close signals it and may return while it runs its last
// lines, so the check allows it a bounded moment to finish.
func checkNoWatcherGoroutines(t *testing.T) {
	t.Helper()
	buf := make([]byte, 1<<20)
	var stacks string
	for deadline := time.Now().Add(2 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		stacks = string(buf[:runtime.Stack(buf, true)])
		if !strings.Contains(stacks, "fsnotify") {
			return
		}
		if time.Now().After(deadline) {
			break
		}
	}
	t.Errorf("fsnotify goroutine still running 2s after Run returned:\n%s", stacks)
}

func TestManifestsWatch(t *testing.T) {
	path := filepath.Join(t.TempDir(), "demo.yaml")
	if err := os.WriteFile(path, []byte(manifestWith("127.0.0.1")), 0o644); err != nil {
		t.Fatal(err)
	}
	w, first := startWatch(t, path)
	if got := webEndpoints(t, first); !slices.Equal(got, []string{"127.0.0.1:8080"}) {
		t.Fatalf("first snapshot: got %q", got)
	}

	// An edit in place applies.
	if err := os.WriteFile(path, []byte(manifestWith("127.0.0.2")), 0o644); err != nil {
		t.Fatal(err)
	}
	w.waitFor(outcomeApplied)
	if got := webEndpoints(t, w.snapshot()); !slices.Equal(got, []string{"127.0.0.2:8080"}) {
		t.Fatalf("after edit: got %q", got)
	}

	// A broken edit is reported, with file, document and field, and the
	// last good state stays.
	broken := strings.Replace(manifestWith("127.0.0.3"), "port: 80}", "port: 70000}", 1)
	writeByRename(t, path, broken)
	_, err := w.waitFor(outcomeRejected)
	for _, want := range []string{"demo.yaml: document 1 (Service demo/web): spec.ports[0].port: 70000 is out of range"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("rejection: got %v, want it to contain %q", err, want)
		}
	}
	w.noSnapshot()

	// The same broken content again is not reported again.
	writeByRename(t, path, broken)
	if before, _ := w.waitFor(outcomeUnchanged); slices.Contains(before, outcomeRejected) {
		t.Errorf("unchanged broken file reported again: %v", before)
	}
	w.noSnapshot()

	// A fix written by rename applies.
	writeByRename(t, path, manifestWith("127.0.0.4"))
	w.waitFor(outcomeApplied)
	if got := webEndpoints(t, w.snapshot()); !slices.Equal(got, []string{"127.0.0.4:8080"}) {
		t.Fatalf("after fix: got %q", got)
	}

	// Deleting the file keeps the last good state.
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if _, err := w.waitFor(outcomeRejected); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("after delete: got %v, want a not-exist error", err)
	}
	w.noSnapshot()

	// Putting back what is served does not call apply again.
	writeByRename(t, path, manifestWith("127.0.0.4"))
	w.waitFor(outcomeSame)
	w.noSnapshot()

	// An empty file (an editor truncating it) is not "serve nothing".
	writeByRename(t, path, "")
	if _, err := w.waitFor(outcomeRejected); !errors.Is(err, ErrEmptyManifest) {
		t.Errorf("empty file: got %v, want ErrEmptyManifest", err)
	}

	// And the next good edit applies again.
	if err := os.WriteFile(path, []byte(manifestWith("127.0.0.5")), 0o644); err != nil {
		t.Fatal(err)
	}
	w.waitFor(outcomeApplied)
	if got := webEndpoints(t, w.snapshot()); !slices.Equal(got, []string{"127.0.0.5:8080"}) {
		t.Fatalf("after second fix: got %q", got)
	}
}

// TestManifestsConfigMap follows a file in a ConfigMap volume, where kubelet
// writes a new directory and swaps the "..data" symbolic link to it.
// TestManifestsReadAgainAfterExhaustion: an edit whose read fails for want
// of descriptors is not a broken edit and waits for no other event: the
// file is read again at the next poll, and the edit applies then.
func TestManifestsReadAgainAfterExhaustion(t *testing.T) {
	path := filepath.Join(t.TempDir(), "svc.yaml")
	if err := os.WriteFile(path, []byte(manifestWith("10.0.0.1")), 0o644); err != nil {
		t.Fatal(err)
	}
	var failures atomic.Int32
	w, first := startWatchWith(t, path, func(p string) ([]byte, error) {
		if failures.Load() > 0 {
			failures.Add(-1)
			return nil, &os.PathError{Op: "open", Path: p, Err: syscall.EMFILE}
		}
		return readManifest(p)
	})
	if got := webEndpoints(t, first); !slices.Equal(got, []string{"10.0.0.1:8080"}) {
		t.Fatalf("first endpoints %v", got)
	}
	failures.Store(2) // the read after the edit, and the next
	if err := os.WriteFile(path, []byte(manifestWith("10.0.0.2")), 0o644); err != nil {
		t.Fatal(err)
	}
	before, err := w.waitFor(outcomeApplied)
	if err != nil {
		t.Fatal(err)
	}
	rejected := 0
	for _, o := range before {
		if o == outcomeRejected {
			rejected++
		}
	}
	if rejected != 2 {
		t.Errorf("outcomes before the edit applied: %v; want the two failed reads", before)
	}
	if got := webEndpoints(t, w.snapshot()); !slices.Equal(got, []string{"10.0.0.2:8080"}) {
		t.Errorf("endpoints after the edit %v", got)
	}
}

func TestManifestsConfigMap(t *testing.T) {
	dir := t.TempDir()
	version := func(name, data string) {
		if err := os.Mkdir(filepath.Join(dir, name), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name, "demo.yaml"), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(name, filepath.Join(dir, "..data_tmp")); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(filepath.Join(dir, "..data_tmp"), filepath.Join(dir, "..data")); err != nil {
			t.Fatal(err)
		}
	}
	version("..v1", manifestWith("127.0.0.1"))
	if err := os.Symlink("..data/demo.yaml", filepath.Join(dir, "demo.yaml")); err != nil {
		t.Fatal(err)
	}
	w, first := startWatch(t, filepath.Join(dir, "demo.yaml"))
	if got := webEndpoints(t, first); !slices.Equal(got, []string{"127.0.0.1:8080"}) {
		t.Fatalf("first snapshot: got %q", got)
	}

	version("..v2", manifestWith("127.0.0.2"))
	if err := os.RemoveAll(filepath.Join(dir, "..v1")); err != nil {
		t.Fatal(err)
	}
	w.waitFor(outcomeApplied)
	if got := webEndpoints(t, w.snapshot()); !slices.Equal(got, []string{"127.0.0.2:8080"}) {
		t.Fatalf("after swap: got %q", got)
	}
}

// TestManifestsSymlinkElsewhere follows edits made to the target of a
// symbolic link that lives in another directory.
func TestManifestsSymlinkElsewhere(t *testing.T) {
	real := filepath.Join(t.TempDir(), "real.yaml")
	link := filepath.Join(t.TempDir(), "demo.yaml")
	if err := os.WriteFile(real, []byte(manifestWith("127.0.0.1")), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(real, link); err != nil {
		t.Fatal(err)
	}
	w, _ := startWatch(t, link)
	writeByRename(t, real, manifestWith("127.0.0.2"))
	w.waitFor(outcomeApplied)
	if got := webEndpoints(t, w.snapshot()); !slices.Equal(got, []string{"127.0.0.2:8080"}) {
		t.Fatalf("after editing the target: got %q", got)
	}
}

// TestManifestsDirectoryReplaced: the file's directory is deleted and made
// again (a deployment tool that replaces the whole directory); the new file
// and later edits to it are applied, though the directory watch ended with
// the old directory. The periodic re-read is off, so only the watch and
// the poll can see the edits.
func TestManifestsDirectoryReplaced(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "conf")
	path := filepath.Join(dir, "demo.yaml")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(manifestWith("127.0.0.1")), 0o644); err != nil {
		t.Fatal(err)
	}
	w, _ := startWatch(t, path)
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	w.waitFor(outcomeRejected) // the file is gone for a moment
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(manifestWith("127.0.0.2")), 0o644); err != nil {
		t.Fatal(err)
	}
	w.waitFor(outcomeApplied)
	if got := webEndpoints(t, w.snapshot()); !slices.Equal(got, []string{"127.0.0.2:8080"}) {
		t.Fatalf("after the directory was replaced: got %q", got)
	}
	writeByRename(t, path, manifestWith("127.0.0.3"))
	w.waitFor(outcomeApplied)
	if got := webEndpoints(t, w.snapshot()); !slices.Equal(got, []string{"127.0.0.3:8080"}) {
		t.Fatalf("after an edit in the new directory: got %q", got)
	}
}

// TestManifestsSymlinkedDirectorySwap: the path goes through a symbolic
// link to a release directory ("current" -> "r1"), which a deployment
// swaps to another ("current" -> "r2"); the new release's file and later
// edits to it are applied, though the directory watch was on r1.
func TestManifestsSymlinkedDirectorySwap(t *testing.T) {
	root := t.TempDir()
	for i, addr := range []string{"127.0.0.1", "127.0.0.2"} {
		release := filepath.Join(root, []string{"r1", "r2"}[i])
		if err := os.Mkdir(release, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(release, "demo.yaml"), []byte(manifestWith(addr)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	current := filepath.Join(root, "current")
	if err := os.Symlink("r1", current); err != nil {
		t.Fatal(err)
	}
	w, _ := startWatch(t, filepath.Join(current, "demo.yaml"))
	if err := os.Symlink("r2", current+".tmp"); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(current+".tmp", current); err != nil {
		t.Fatal(err)
	}
	w.waitFor(outcomeApplied)
	if got := webEndpoints(t, w.snapshot()); !slices.Equal(got, []string{"127.0.0.2:8080"}) {
		t.Fatalf("after the swap: got %q", got)
	}
	writeByRename(t, filepath.Join(root, "r2", "demo.yaml"), manifestWith("127.0.0.3"))
	w.waitFor(outcomeApplied)
	if got := webEndpoints(t, w.snapshot()); !slices.Equal(got, []string{"127.0.0.3:8080"}) {
		t.Fatalf("after an edit in the new release: got %q", got)
	}
}

func TestManifestsStartupErrors(t *testing.T) {
	dir := t.TempDir()
	broken := filepath.Join(dir, "broken.yaml")
	if err := os.WriteFile(broken, []byte("apiVersion: v1\nkind: Service\nmetadata: {name: web}\nspec: {ports: [{port: 0}]}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, path, want string
	}{
		{"no path", "", "no file given"},
		{"a directory", dir, "not a regular file (a directory)"},
		{"missing file", filepath.Join(dir, "missing.yaml"), "no such file"},
		{"missing directory", filepath.Join(dir, "nope", "x.yaml"), "nope"},
		// With the line, as an editor takes it, since no log line gives
		// it as one does for a broken edit.
		{"broken file", broken, "broken.yaml:4: document 1 (Service default/web): spec.ports[0].port: 0 is out of range 1-65535"},
	}
	fifo := filepath.Join(dir, "fifo.yaml")
	switch err := mkfifo(fifo); {
	case err == nil:
		tests = append(tests, struct{ name, path, want string }{
			"a named pipe, whose open would wait for a writer", fifo, "fifo.yaml: not a regular file (a named pipe)"})
	case !errors.Is(err, errors.ErrUnsupported):
		t.Fatal(err)
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			// Run returns at start or only when ctx is done: a file it
			// takes as usable ends the run at once, and a Run that
			// blocks is bounded, so neither hangs the package.
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			m := &Manifests{Path: tc.path}
			done := make(chan error, 1)
			go func() {
				done <- m.Run(ctx, func(state.Snapshot) {
					t.Error("apply called: Run took the file as usable")
					cancel()
				})
			}()
			select {
			case err := <-done:
				if err == nil || !strings.Contains(err.Error(), tc.want) {
					t.Errorf("got %v, want an error containing %q", err, tc.want)
				}
			case <-time.After(watchTimeout):
				t.Fatalf("Run did not return within %s, want an error containing %q", watchTimeout, tc.want)
			}
		})
	}
	checkNoWatcherGoroutines(t)
}

// TestManifestsStopDuringFirstParse: a Run stopped while it parses the
// file (a SIGTERM during a large file's seconds of parsing) returns nil at
// once, without finishing the parse or serving what it read. Before, the
// whole file was parsed and applied first.
func TestManifestsStopDuringFirstParse(t *testing.T) {
	path := filepath.Join(t.TempDir(), "big.yaml")
	data := generatedManifest(2000, 3)
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	m := &Manifests{Path: path,
		// The stop comes once the file is read, before its parse.
		read: func(p string) ([]byte, error) { cancel(); return readManifest(p) }}
	applied := 0
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx, func(state.Snapshot) { applied++ }) }()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Run stopped during its first parse: %v, want nil", err)
		}
	case <-time.After(watchTimeout):
		t.Fatalf("Run did not return within %s of its stop", watchTimeout)
	}
	if applied != 0 {
		t.Errorf("apply called %d times after the stop, want none", applied)
	}
	checkNoWatcherGoroutines(t)
}

// TestManifestsNameChangedServices: each snapshot of the file names the
// Services an edit changed, as a Service change (its ports, frontends or
// settings) or an endpoint change; the first names every Service, and
// Services the edit left alone are not named.
func TestManifestsNameChangedServices(t *testing.T) {
	api := `
---
apiVersion: v1
kind: Service
metadata: {name: api, namespace: demo}
spec:
  ports: [{name: grpc, port: 9000}]
`
	path := filepath.Join(t.TempDir(), "demo.yaml")
	if err := os.WriteFile(path, []byte(manifestWith("127.0.0.1")+api), 0o644); err != nil {
		t.Fatal(err)
	}
	web := []state.ServiceName{{Namespace: "demo", Name: "web"}}
	apiName := []state.ServiceName{{Namespace: "demo", Name: "api"}}
	w, first := startWatch(t, path)
	if want := (state.Changes{Services: append(slices.Clone(apiName), web...), Endpoints: web}); !reflect.DeepEqual(first.Changes, want) {
		t.Errorf("first snapshot: changes %+v, want %+v", first.Changes, want)
	}
	for _, step := range []struct {
		name, content string
		want          state.Changes
	}{
		{"web's endpoint moves", manifestWith("127.0.0.2") + api, state.Changes{Endpoints: web}},
		{"api's port changes", manifestWith("127.0.0.2") + strings.Replace(api, "9000", "9001", 1), state.Changes{Services: apiName}},
		{"api goes", manifestWith("127.0.0.2"), state.Changes{Services: apiName}},
		{"web's port and endpoint change", strings.Replace(manifestWith("127.0.0.3"), "port: 80}", "port: 81}", 1), state.Changes{Services: web, Endpoints: web}},
	} {
		writeByRename(t, path, step.content)
		w.waitFor(outcomeApplied)
		if got := w.snapshot().Changes; !reflect.DeepEqual(got, step.want) {
			t.Errorf("%s: changes %+v, want %+v", step.name, got, step.want)
		}
	}
}

// TestManifestsUnmatchedSlicePortSaidOnce: the manifest checks and
// BuildSnapshot both find a slice port that matches no port of its
// Service, or has no port number (the API's "all ports"); Status lists it
// once.
func TestManifestsUnmatchedSlicePortSaidOnce(t *testing.T) {
	for _, tc := range []struct{ name, port, want string }{
		{"unmatched name", "{name: htp, port: 8080}", `port name "htp" with protocol TCP matches no port of Service demo/web`},
		{"no port number", "{name: http}", "(EndpointSlice demo/web-1): ports[0].port: not set: the port is skipped, as kube-proxy skips it"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "demo.yaml")
			if err := os.WriteFile(path, []byte(strings.Replace(manifestWith("10.0.0.1"), "{name: http, port: 8080}", tc.port, 1)), 0o644); err != nil {
				t.Fatal(err)
			}
			var ignored []error
			m := &Manifests{
				Path:    path,
				Options: Options{AllowLoopback: true, AllowNoClusterIP: true},
				Resync:  -1,
				Status:  func(_ error, w, i []error) { ignored = append(slices.Clone(w), i...) },
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			done := make(chan error, 1)
			applied := make(chan struct{}, 1)
			go func() {
				done <- m.Run(ctx, func(state.Snapshot) {
					select {
					case applied <- struct{}{}:
					default:
					}
				})
			}()
			select {
			case <-applied:
			case err := <-done:
				t.Fatalf("Run returned at start: %v", err)
			case <-time.After(watchTimeout):
				t.Fatal("no first snapshot")
			}
			cancel()
			if err := <-done; err != nil {
				t.Fatalf("Run: %v", err)
			}
			n := 0
			for _, e := range ignored {
				if strings.Contains(e.Error(), tc.want) {
					n++
				}
			}
			if n != 1 {
				t.Errorf("said %d times, want once: %q", n, ignored)
			}
		})
	}
}

// TestManifestsIgnoredInDocumentOrder: Status lists the manifest's
// warnings and what BuildSnapshot leaves unused each in the order of the
// file.
func TestManifestsIgnoredInDocumentOrder(t *testing.T) {
	path := filepath.Join(t.TempDir(), "demo.yaml")
	data := `apiVersion: v1
kind: Service
metadata: {name: zeta, namespace: x}
spec: {externalIPs: [169.254.169.254], ports: [{port: 80}]}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: c, namespace: x}
---
apiVersion: v1
kind: Service
metadata: {name: alpha, namespace: x}
spec: {externalIPs: [169.254.169.254], ports: [{port: 81}]}
`
	if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
	ignored := make(chan []error, 1)
	m := &Manifests{
		Path:    path,
		Options: Options{AllowNoClusterIP: true},
		Resync:  -1,
		Status:  func(_ error, w, i []error) { ignored <- slices.Concat(w, []error{nil}, i) },
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx, func(state.Snapshot) {}) }()
	var got []string
	select {
	case errs := <-ignored:
		for _, e := range errs {
			var oe *ObjectError
			if e == nil {
				got = append(got, "then ignored:")
				continue
			}
			if !errors.As(e, &oe) {
				t.Fatalf("%v: not an ObjectError", e)
			}
			got = append(got, fmt.Sprintf("%d %s", oe.Document, oe.Object()))
		}
	case err := <-done:
		t.Fatalf("Run returned at start: %v", err)
	case <-time.After(watchTimeout):
		t.Fatal("no status")
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	want := []string{"2 ConfigMap x/c", "then ignored:", "1 Service x/zeta", "3 Service x/alpha"}
	if !slices.Equal(got, want) {
		t.Errorf("ignored in this order: %q, want %q", got, want)
	}
}

// TestManifestsStatusNamesLines: what Status is told (shown by
// /debug/services) names each problem's line as the start-up error and the
// log do: a warning of a taken file and the reason a file was refused.
func TestManifestsStatusNamesLines(t *testing.T) {
	good := "apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: x}\nspec: {ports: [{port: 80}]}\n---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: c, namespace: x}\n"
	bad := "apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: x}\nspec:\n  ports:\n  - port: x\n"
	for _, tc := range []struct {
		name, data, want string
		rejected         bool
	}{
		{"warning", good, "demo.yaml:6: document 2 (ConfigMap x/c): ", false},
		{"rejected", bad, "demo.yaml:6: document 1 (Service x/web): spec.ports[0].port: ", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "demo.yaml")
			if err := os.WriteFile(path, []byte(tc.data), 0o644); err != nil {
				t.Fatal(err)
			}
			told := make(chan []error, 1)
			m := &Manifests{
				Path:    path,
				Options: Options{AllowNoClusterIP: true},
				Resync:  -1,
				Status: func(r error, w, _ []error) {
					if tc.rejected {
						w = []error{r}
					}
					select {
					case told <- w:
					default:
					}
				},
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			done := make(chan error, 1)
			go func() { done <- m.Run(ctx, func(state.Snapshot) {}) }()
			select {
			case errs := <-told:
				var msgs []string
				for _, e := range errs {
					if e != nil {
						msgs = append(msgs, e.Error())
					}
				}
				if !slices.ContainsFunc(msgs, func(m string) bool { return strings.HasPrefix(m, path+":") && strings.Contains(m, tc.want) }) {
					t.Errorf("Status was told %q, want one starting with the file and containing %q", msgs, tc.want)
				}
			case <-time.After(watchTimeout):
				t.Fatal("Status was told nothing")
			}
			cancel()
			<-done
		})
	}
}

// TestManifestsCheck: Check reads the file as Run's first read does: a
// good file is nil, and a broken or missing one is the error that stops
// Run, naming the file, the line and the field.
func TestManifestsCheck(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.yaml")
	broken := filepath.Join(dir, "broken.yaml")
	if err := os.WriteFile(good, []byte(manifestWith("127.0.0.1")), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(broken, []byte(strings.Replace(manifestWith("127.0.0.1"), "127.0.0.1", "127.0.0.300", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ path, want string }{
		{good, ""},
		{broken, "manifests: " + broken + ":"},
		{filepath.Join(dir, "none.yaml"), "no such file or directory"},
	} {
		m := &Manifests{Path: tc.path, Options: Options{AllowLoopback: true}}
		err := m.Check(context.Background())
		t.Logf("%s: %v", filepath.Base(tc.path), err)
		if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("Check(%s) = %v, want %q", filepath.Base(tc.path), err, tc.want)
		}
		if tc.want == "" {
			continue
		}
		runErr := m.Run(context.Background(), func(state.Snapshot) { t.Errorf("Run applied %s", tc.path) })
		if runErr == nil || runErr.Error() != err.Error() {
			t.Errorf("Run(%s) = %v; Check said %v", filepath.Base(tc.path), runErr, err)
		}
	}
}
