package source

import (
	"cmp"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/fsnotify/fsnotify"
	"k8s.io/klog/v2"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/internal/regularfile"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/state"
)

// maxManifestBytes bounds how much of a manifest file is read, so that
// pointing --manifests at the wrong file cannot exhaust memory.
const maxManifestBytes = 64 << 20

// maxLoggedErrors bounds how many problems of one bad edit are logged.
const maxLoggedErrors = 20

// Manifests serves the Services and EndpointSlices of one manifest file
// (--manifests PATH) and follows edits to it.
type Manifests struct {
	// Path is the manifest file. Required. It may be a symbolic link, as
	// in a ConfigMap volume.
	Path string
	// Options are passed to BuildSnapshot as they are. Manifest mode
	// normally sets AllowLoopback and AllowNoClusterIP, and NodeName to this
	// host's name so that endpoints with that nodeName are local.
	Options Options
	// Debounce is how long the file must stay quiet after a change before
	// it is read, so that an editor's several writes are read once. A file
	// that keeps changing is read at the latest after ten times Debounce.
	// If zero, 100ms.
	Debounce time.Duration
	// Resync is how often the file is read even without a change event,
	// for filesystems that deliver none (some network and FUSE mounts).
	// If zero, 1 minute. Negative disables it.
	Resync time.Duration

	// Status, if set, is told what came of every read of changed content,
	// the first included: rejected is why the file was refused (the last
	// good state keeps serving), nil when it was taken; warnings are those
	// of a taken file (some say what they skip, some only what may not be
	// what its author expects), and ignored the problems that left its
	// objects partly unused, as the log says them ("Manifest warning",
	// "Manifest object partly ignored"), each in the order of the file,
	// their messages naming the line as the start-up error does
	// ("demo.yaml:12: document 3 ..."). It is called from Run's goroutine.
	Status func(rejected error, warnings, ignored []error)
	// HostChanged, if set, says this host's addresses changed: the file is
	// built again, as an endpoint at one of them with a node port is
	// ignored (see Options.HostAddrs); only new problems are logged.
	HostChanged <-chan struct{}

	// reloaded, if set, is told what came of every read after the first;
	// tests wait on it instead of sleeping.
	reloaded func(reloadOutcome, error)
	// read, if set, reads the file in place of readManifest, for tests.
	read func(path string) ([]byte, error)
}

// reloadOutcome is what came of reading the file again.
type reloadOutcome int

const (
	outcomeUnchanged reloadOutcome = iota // same bytes (or same failure) as last time
	outcomeRejected                       // broken: the last good state is kept
	outcomeSame                           // good, but the snapshot did not change
	outcomeApplied                        // good and new: apply was called
)

// Run reads the file and calls apply with its snapshot, then watches the
// file and calls apply again after every edit that changes the snapshot.
//
// If the first read fails, Run returns the error at once: the proxy must not
// start on a broken file. After that, a broken edit (bad YAML, a bad field,
// the file deleted or empty for a moment while an editor rewrites it) is
// logged once and the last good snapshot keeps serving; apply is not
// called until the file is good again. Unchanged content never calls apply.
//
// The parent directory is watched rather than the file, so that editors that
// write a new file and rename it over the old one, and ConfigMap volumes
// (where kubelet swaps a "..data" symbolic link), are followed; the path is
// resolved again after every change. Twice a second the file and its
// directory are looked at too, for what the watch cannot see: the
// directory replaced, or reached through a symbolic link that now points
// elsewhere.
//
// apply is called from Run's goroutine, one call at a time. Run returns nil
// when ctx is done, after every goroutine it started has finished.
func (m *Manifests) Run(ctx context.Context, apply func(state.Snapshot)) error {
	l, err := m.newLoader()
	if err != nil {
		return err
	}
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("manifests: watch %s: %w", l.path, err)
	}
	defer w.Close() // waits for the watcher's goroutine
	l.watcher = w
	// Watch before the first read, so no edit falls between the two.
	if err := w.Add(l.dir); err != nil {
		return fmt.Errorf("manifests: watch %s: %w", l.dir, err)
	}
	l.dirInfo, _ = os.Stat(l.dir)
	l.fileInfo, _ = os.Stat(l.path)
	snap, err := l.first(ctx)
	if err != nil || ctx.Err() != nil {
		return err
	}
	l.current = snap
	l.follow()
	klog.InfoS("Loaded manifests", "file", l.name, "servicePorts", snap.Len())
	snap.Changes = state.ChangesBetween(state.Snapshot{}, snap) // every Service is new
	apply(snap)

	debounce := cmp.Or(m.Debounce, 100*time.Millisecond)
	timer := time.NewTimer(debounce)
	timer.Stop()
	var pendingSince time.Time // zero when no read is pending
	schedule := func() {
		now := time.Now()
		if pendingSince.IsZero() {
			pendingSince = now
		} else if now.Sub(pendingSince) >= 10*debounce {
			return // let the timer fire: the file keeps changing
		}
		timer.Reset(debounce)
	}
	var resync <-chan time.Time
	if every := cmp.Or(m.Resync, time.Minute); every > 0 {
		t := time.NewTicker(every)
		defer t.Stop()
		resync = t.C
	}
	poll := time.NewTicker(statPoll)
	defer poll.Stop()

	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-w.Events:
			if !ok {
				return errors.New("manifests: file watcher closed")
			}
			if l.relevant(ev) {
				klog.V(4).InfoS("Manifest file event", "file", l.name, "event", ev.String())
				schedule()
			}
		case err, ok := <-w.Errors:
			if !ok {
				return errors.New("manifests: file watcher closed")
			}
			// An overflow loses events: read the file to be sure.
			klog.ErrorS(err, "Watching the manifest file", "file", l.name)
			schedule()
		case <-timer.C:
			pendingSince = time.Time{}
			l.reload(ctx, apply)
		case <-resync:
			l.reload(ctx, apply)
		case <-m.HostChanged:
			l.rebuild = true
			l.reload(ctx, apply)
		case <-poll.C:
			l.rewatch()
			if l.statChanged() || l.readAgain {
				schedule()
			}
		}
	}
}

// Check reads the file once, as Run's first read does, and returns the
// error that would stop Run from starting, or nil; it watches nothing and
// applies nothing (--init-only). Warnings are logged as Run logs them.
func (m *Manifests) Check(ctx context.Context) error {
	l, err := m.newLoader()
	if err != nil {
		return err
	}
	_, err = l.first(ctx)
	return err
}

// newLoader is the loader of m's file, without a watcher yet.
func (m *Manifests) newLoader() (*loader, error) {
	if m.Path == "" {
		return nil, errors.New("manifests: no file given")
	}
	path, err := filepath.Abs(m.Path)
	if err != nil {
		return nil, fmt.Errorf("manifests: %w", err)
	}
	l := &loader{name: m.Path, path: path, dir: filepath.Dir(path), opts: m.Options, reloaded: m.reloaded, status: m.Status,
		read: m.read}
	if l.read == nil {
		l.read = readManifest
	}
	return l, nil
}

// first is the first read of the file, which must be good for the proxy
// to start. Stopped meanwhile (ctx done), it returns no error.
func (l *loader) first(ctx context.Context) (state.Snapshot, error) {
	snap, _, err := l.load(ctx)
	if ctx.Err() != nil {
		return state.Snapshot{}, nil // stopped while the file was parsed
	}
	if err != nil {
		// Nothing logs the problems of a first read, as logRejected
		// does an edit's: their lines go in the message.
		return state.Snapshot{}, fmt.Errorf("manifests: %w", withLines(err))
	}
	return snap, nil
}

// loader reads the manifest file and remembers what it last saw, so that
// every distinct problem is logged once and unchanged content is ignored.
type loader struct {
	name    string // the path as given, for messages
	path    string // absolute
	dir     string
	opts    Options
	watcher *fsnotify.Watcher
	// reloaded is Manifests.reloaded, or nil.
	reloaded func(reloadOutcome, error)
	status   func(rejected error, warnings, ignored []error)

	target    string      // path with symbolic links resolved, or ""
	targetDir string      // extra directory watched for target, or ""
	dirInfo   os.FileInfo // the directory watched as dir, or nil
	fileInfo  os.FileInfo // the file at the last poll, or nil

	read func(path string) ([]byte, error)
	// rebuild asks the next load to build the snapshot again though the
	// file has not changed (this host's addresses did); problems are
	// those the last build logged, so it logs only new ones.
	rebuild  bool
	rebuilt  bool // the last load was such a build
	problems map[string]bool
	seen     string         // content hash or error of the last read
	current  state.Snapshot // last applied
	broken   bool           // the last read was rejected
	// docs is what the documents of the last read decoded to, so that
	// the next decodes only those an edit changed.
	docs docCache
	// readAgain says the last read failed for want of descriptors or
	// memory, not for the file's content: the file is read again at the
	// next poll, changed or not.
	readAgain bool
}

// load reads and parses the file, logging warnings and the problems that
// leave the rest usable. changed is false when the file holds what the last
// load saw (or fails the same way), and then nothing else is returned. A
// returned error means nothing of the file is usable. Stopped by ctx, it
// returns ctx's error with changed false, and says nothing.
func (l *loader) load(ctx context.Context) (snap state.Snapshot, changed bool, err error) {
	data, err := l.read(l.path)
	if err != nil && isExhausted(err) {
		// Nothing to say about the file: read it again soon, and take
		// whatever it holds then as news.
		first := !l.readAgain
		l.seen, l.readAgain = "", true
		return state.Snapshot{}, true, errReadAgain{err, first}
	}
	l.readAgain = false
	seen := "error: "
	if err != nil {
		seen += err.Error()
	} else {
		seen = fmt.Sprintf("sha256:%x", sha256.Sum256(data))
	}
	rebuild := l.rebuild && seen == l.seen && err == nil
	l.rebuild, l.rebuilt = false, rebuild
	if seen == l.seen && !rebuild {
		return state.Snapshot{}, false, nil
	}
	l.seen = seen
	if err != nil {
		l.tell(err, nil, nil)
		return state.Snapshot{}, true, err
	}
	m, err := parseManifests(ctx, l.name, data, l.docs)
	if ctx.Err() != nil {
		// Stopped: nothing was read, and nothing is said.
		l.seen = ""
		return state.Snapshot{}, false, ctx.Err()
	}
	if m != nil {
		l.docs = m.docs
	}
	if err != nil {
		l.tell(err, nil, nil)
		return state.Snapshot{}, true, err
	}
	for i, w := range m.warnings {
		if rebuild {
			break // the same file: said when it was read
		}
		if i == maxLoggedErrors {
			klog.InfoS("More manifest warnings not shown", "file", l.name, "count", len(m.warnings)-i)
			break
		}
		klog.InfoS("Manifest warning", append(logValues(w), "reason", reason(w))...)
	}
	snap, built := BuildSnapshot(m.services, m.slices, l.opts)
	for i, p := range built {
		built[i] = m.locate(p)
	}
	inFileOrder(built)
	warned := make(map[string]bool, len(m.warnings))
	for _, w := range m.warnings {
		warned[w.Error()] = true
	}
	said := l.problems
	l.problems = make(map[string]bool, len(built))
	var problems []error
	for _, p := range built {
		if warned[p.Error()] {
			continue // a warning said it (a slice port that matches no port)
		}
		problems = append(problems, p)
		l.problems[p.Error()] = true
		if !rebuild || !said[p.Error()] {
			klog.ErrorS(p, "Manifest object partly ignored", logValues(p)...)
		}
	}
	l.tell(nil, m.warnings, problems)
	return snap, true, nil
}

// tell passes what came of a read to Manifests.Status.
func (l *loader) tell(rejected error, warnings, ignored []error) {
	if l.status != nil {
		l.status(withLines(rejected), lined(warnings), lined(ignored))
	}
}

// reload reads the file again after a change and applies it if it is good
// and different from what is served.
func (l *loader) reload(ctx context.Context, apply func(state.Snapshot)) {
	defer l.follow()
	outcome, err := l.update(ctx, apply)
	if l.reloaded != nil {
		l.reloaded(outcome, err)
	}
}

func (l *loader) update(ctx context.Context, apply func(state.Snapshot)) (reloadOutcome, error) {
	snap, changed, err := l.load(ctx)
	var again errReadAgain
	switch {
	case !changed:
		return outcomeUnchanged, nil // nothing new to say or do
	case errors.As(err, &again):
		if again.first {
			klog.ErrorS(again.err, "Cannot read the manifest file for now; keeping the last good state and reading it again every half second", "file", l.name)
		}
		return outcomeRejected, err
	case err != nil:
		l.broken = true
		logRejected(l.name, err)
		return outcomeRejected, err
	case l.broken:
		klog.InfoS("Manifest file is valid again", "file", l.name)
		l.broken = false
	}
	if sameSnapshot(snap, l.current) {
		if !l.rebuilt {
			klog.V(2).InfoS("Manifest file changed but its services did not", "file", l.name)
		}
		return outcomeSame, nil
	}
	snap.Changes = state.ChangesBetween(l.current, snap)
	l.current = snap
	msg := "Applying edited manifests"
	if l.rebuilt {
		msg = "Applying the manifests again: this host's addresses changed what they serve"
	}
	klog.InfoS(msg, "file", l.name, "servicePorts", snap.Len(),
		"servicesChanged", len(snap.Changes.Services), "endpointsChanged", len(snap.Changes.Endpoints))
	apply(snap)
	return outcomeApplied, nil
}

// logRejected logs each problem of a rejected edit once.
func logRejected(path string, err error) {
	errs := flatten(err)
	for i, e := range errs {
		if i == maxLoggedErrors {
			klog.ErrorS(nil, "More problems in the manifest file not shown", "file", path, "count", len(errs)-i)
			return
		}
		kv := logValues(e)
		if kv == nil {
			kv = []any{"file", path}
		}
		klog.ErrorS(e, "Manifest edit rejected; keeping the last good state", kv...)
	}
}

// errReadAgain is a read of the manifest file that failed for want of
// descriptors or memory; first says the one before it did not.
type errReadAgain struct {
	err   error
	first bool
}

func (e errReadAgain) Error() string { return e.err.Error() }
func (e errReadAgain) Unwrap() error { return e.err }

// isExhausted reports errors that say this process or host is out of file
// descriptors or memory, not that the file is bad.
func isExhausted(err error) bool {
	return errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE) ||
		errors.Is(err, syscall.ENOMEM) || errors.Is(err, syscall.ENOBUFS)
}

// reason is the message of err without the location an ObjectError adds.
func reason(err error) string {
	var oe *ObjectError
	if errors.As(err, &oe) && oe.Err != nil {
		return oe.Err.Error()
	}
	return err.Error()
}

// readManifest reads at most maxManifestBytes of the file, which must be a
// regular file: opening a named pipe would wait for a writer, and even
// SIGTERM could not end that wait.
func readManifest(path string) ([]byte, error) {
	data, err := regularfile.Read(path, maxManifestBytes)
	if r := (*regularfile.RefusedError)(nil); errors.As(err, &r) && r.Kind != "" {
		return nil, fmt.Errorf("%w: it is read again after every change", err)
	}
	return data, err
}

// statPoll is how often the file and its directory are looked at, for the
// changes a directory watch cannot see: the directory deleted and made
// again (the watch ends with the old one), or reached through a symbolic
// link that now points elsewhere (the watch stays on the old target).
const statPoll = 500 * time.Millisecond

// rewatch watches dir again when it is no longer the directory watched:
// another directory is at its path, or the watch ended with the one that
// was (a directory deleted and made again often gets the freed inode
// number back, so it looks like the same one, but the watch is gone).
func (l *loader) rewatch() {
	fi, err := os.Stat(l.dir)
	if err != nil || l.dirInfo != nil && os.SameFile(fi, l.dirInfo) && slices.Contains(l.watcher.WatchList(), l.dir) {
		return // gone for now, or still the one watched
	}
	_ = l.watcher.Remove(l.dir) // its watch may have ended with it
	if err := l.watcher.Add(l.dir); err != nil {
		klog.V(2).InfoS("Cannot watch the manifest file's directory", "file", l.name, "dir", l.dir, "err", err)
		return
	}
	klog.V(2).InfoS("Watching the manifest file's directory again: it was replaced", "file", l.name, "dir", l.dir)
	l.dirInfo = fi
}

// statChanged reports whether the file is another file, or has another size
// or modification time, than at the last poll.
func (l *loader) statChanged() bool {
	fi, err := os.Stat(l.path)
	if err != nil {
		fi = nil
	}
	prev := l.fileInfo
	l.fileInfo = fi
	switch {
	case fi == nil || prev == nil:
		return (fi == nil) != (prev == nil)
	default:
		return !os.SameFile(fi, prev) || fi.Size() != prev.Size() || !fi.ModTime().Equal(prev.ModTime())
	}
}

// follow resolves symbolic links in the path again and, when the file
// really lives in another directory, watches that directory too, so that
// edits made through the link's target are seen.
func (l *loader) follow() {
	target, err := filepath.EvalSymlinks(l.path)
	if err != nil {
		return // missing for now; the directory watch will see it return
	}
	l.target = target
	want := filepath.Dir(target)
	// A ConfigMap's ..2024_01_01_00_00_00.123 directory is replaced, never
	// edited, and the "..data" swap shows in the watched directory.
	if want == l.dir || filepath.Dir(want) == l.dir && strings.HasPrefix(filepath.Base(want), "..") {
		want = ""
	}
	if want == l.targetDir {
		return
	}
	if l.targetDir != "" {
		_ = l.watcher.Remove(l.targetDir) // it may be gone already
		l.targetDir = ""
	}
	if want == "" {
		return
	}
	if err := l.watcher.Add(want); err != nil {
		klog.V(2).InfoS("Cannot watch the directory of the manifest file's target", "file", l.name, "dir", want, "err", err)
		return
	}
	l.targetDir = want
}

// relevant reports whether ev may have changed the file: an event on the
// path or its resolved target, or a ConfigMap volume's "..data" swap.
func (l *loader) relevant(ev fsnotify.Event) bool {
	name := filepath.Clean(ev.Name)
	if name == l.path || name == l.target && l.target != "" {
		return true
	}
	return filepath.Dir(name) == l.dir && strings.HasPrefix(filepath.Base(name), "..")
}

// sameSnapshot reports whether two snapshots hold identical service ports.
func sameSnapshot(a, b state.Snapshot) bool {
	if a.Len() != b.Len() {
		return false
	}
	for _, n := range a.Names() {
		pb := b.Get(n)
		if pb == nil || !a.Get(n).Equal(pb) {
			return false
		}
	}
	return true
}
