package proxyserver

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"time"

	"github.com/fsnotify/fsnotify"
	"k8s.io/klog/v2"
	"sigs.k8s.io/yaml"
)

// errConfigChanged is why Run stops when the --config file, or the
// kubeconfig it names, changes.
var errConfigChanged = errors.New("a file the options were read from changed")

// configWatch follows the --config file (or the kubeconfig it names) as
// kube-proxy follows its --config file: it does not reload it, but
// reports a change, so that the proxy exits and its DaemonSet starts it
// again with the new content.
type configWatch struct {
	// Path is the file; it may be a symbolic link, as in a ConfigMap
	// volume, where the kubelet swaps a ..data link to a new directory.
	Path string
	// What names the file in messages. If empty, "the --config file".
	What string
	// Loaded is the content the options were read from.
	Loaded []byte
	// Same, if set, reports whether content other than Loaded still
	// says the same (only comments or layout differ): that is no change.
	// If nil, any other content is a change.
	Same func(loaded, now []byte) bool
	// Debounce is how long the directory must stay quiet after an event
	// before the file is read again, so a swap in several steps is read
	// once it is done; a read that finds the file empty, or gone, or
	// that differs from the read one Debounce later, is a write or a swap
	// still under way and is read again. If zero, 100ms.
	Debounce time.Duration
	// Resync is how often the file is read without an event, for
	// filesystems that deliver none. If zero, 1 minute.
	Resync time.Duration
}

// run waits until the file's content differs from Loaded (or the file is
// gone) and returns an error wrapping errConfigChanged that says how; or
// nil when ctx is done. Edits that leave the content as it was (a touch,
// a ConfigMap update of another key, a slow rewrite of the same bytes)
// are no change. A file that readOptionsFile refuses (a named pipe, a
// device, one too large) is no change either, as it would be refused
// again at start-up: that is logged once, and the watch goes on, for a
// usable file later.
func (w *configWatch) run(ctx context.Context) error {
	debounce := cmp.Or(w.Debounce, 100*time.Millisecond)
	resync := cmp.Or(w.Resync, time.Minute)
	what := w.what()
	fw, err := fsnotify.NewWatcher()
	if err != nil {
		klog.ErrorS(err, "Cannot watch a file for changes; it is read again every minute", "file", w.Path, "what", what)
	} else {
		defer fw.Close()
	}
	// watched maps each directory watched to what it was when the watch
	// was set: a directory moved away (mv dir dir.old; mv dir.new dir)
	// keeps its watch, which then sees nothing of the new one at the
	// path, so the watch is set again on what is at the path now.
	watched := make(map[string]os.FileInfo)
	rewatch := func() {
		if fw == nil {
			return
		}
		want := w.dirs()
		for d, fi := range watched {
			// A directory deleted and made again often gets the freed
			// inode number back: SameFile, but its watch ended with the
			// old one.
			now, err := os.Stat(d)
			if slices.Contains(want, d) && err == nil && os.SameFile(fi, now) && slices.Contains(fw.WatchList(), d) {
				continue
			}
			_ = fw.Remove(d) // may be gone with the directory
			delete(watched, d)
		}
		for _, d := range want {
			if _, ok := watched[d]; ok {
				continue
			}
			fi, err := os.Stat(d)
			if err == nil {
				err = fw.Add(d)
			}
			if err != nil {
				klog.ErrorS(err, "Cannot watch a file's directory; the file is read again every minute", "dir", d, "what", what)
				continue
			}
			watched[d] = fi
		}
	}
	rewatch()
	var events <-chan fsnotify.Event
	var errs <-chan error
	if fw != nil {
		events, errs = fw.Events, fw.Errors
	}
	tick := time.NewTicker(resync)
	defer tick.Stop()
	quiet := time.NewTimer(0) // read once at start: it may have changed since it was loaded
	var pending []byte        // what the last read found while a write seemed under way
	var pendingHow string     // or how it found the file gone or unreadable
	var unsettled bool
	var emptySince time.Time // when reads began to find the file empty
	var toldSame []byte      // the content last said to differ in form only
	var toldRefused string   // why the file was last said to be refused
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-events:
			quiet.Reset(debounce)
			continue
		case err := <-errs:
			klog.ErrorS(err, "Watching a file", "file", w.Path, "what", what)
			continue
		case <-tick.C:
		case <-quiet.C:
		}
		rewatch()
		data, how, refused := w.read()
		if refused != nil {
			if refused.Error() != toldRefused {
				klog.ErrorS(refused, "A file the options were read from cannot be used: going on with the options read before, and watching it for a usable one", "file", w.Path, "what", what)
				toldRefused = refused.Error()
			}
			pending, pendingHow, unsettled, emptySince = nil, "", false, time.Time{}
			continue
		}
		if toldRefused != "" {
			klog.InfoS("A file the options were read from can be used again", "file", w.Path, "what", what)
			toldRefused = ""
		}
		if len(data) > 0 || how != "" {
			emptySince = time.Time{}
		} else if emptySince.IsZero() {
			emptySince = time.Now()
		}
		switch {
		case how != "" && (!unsettled || how != pendingHow):
			// Gone or unreadable for the first time: perhaps a swap in
			// several steps (mv conf conf.old; mv conf.new conf) read
			// between them. Gone a pause later too, it is.
			pending, pendingHow, unsettled = nil, how, true
			quiet.Reset(debounce)
			continue
		case how != "" || bytes.Equal(data, w.Loaded):
			unsettled = false
		case len(data) > 0 && w.Same != nil && w.Same(w.Loaded, data):
			unsettled = false
			if !bytes.Equal(data, toldSame) {
				klog.InfoS("A file the options were read from was rewritten, but says the same (only comments or layout differ): not restarting", "file", w.Path, "what", what)
				toldSame = data
			}
		case len(data) == 0 && time.Since(emptySince) >= emptyGrace:
			how = w.Path + " is empty"
		case len(data) == 0 || !unsettled || !bytes.Equal(data, pending):
			// Empty (truncated, not yet written) or not yet read twice
			// alike: perhaps a write under way. Read again after a pause.
			pending, pendingHow, unsettled = data, "", true
			quiet.Reset(debounce)
			continue
		default:
			how = w.Path + " has new content"
		}
		if how != "" {
			return fmt.Errorf("%w: %s (%s): exiting so that it is read again, as kube-proxy does (a DaemonSet restarts the proxy)", errConfigChanged, what, how)
		}
	}
}

// emptyGrace is how long the file may stay empty (truncated by a write
// that has not written yet) before that is its new content.
const emptyGrace = 5 * time.Second

func (w *configWatch) what() string {
	if w.What == "" {
		return "the --config file"
	}
	return w.What
}

// dirs are the directories whose events may mean a change of the file:
// its own, which sees it replaced (an editor's rename, a ConfigMap's
// ..data swap), and, where it is a link, the directory of what it points
// at now, which sees it written in place.
func (w *configWatch) dirs() []string {
	dirs := []string{filepath.Dir(w.Path)}
	if real, err := filepath.EvalSymlinks(w.Path); err == nil && filepath.Dir(real) != dirs[0] {
		dirs = append(dirs, filepath.Dir(real))
	}
	return dirs
}

// read returns the file's content, or says how it is gone or unreadable,
// or returns readOptionsFile's refusal of it.
func (w *configWatch) read() ([]byte, string, error) {
	data, err := readOptionsFile(w.Path)
	switch {
	case isRefusedFile(err):
		return nil, "", err
	case errors.Is(err, os.ErrNotExist):
		return nil, w.Path + " is gone", nil
	case err != nil:
		return nil, fmt.Sprintf("%s cannot be read: %v", w.Path, err), nil
	}
	return data, "", nil
}

// sameYAML reports whether YAML (or JSON) documents a and b hold the same
// values: comments, layout, quoting and the order of keys aside. Either
// failing to parse is a difference.
func sameYAML(a, b []byte) bool {
	var va, vb any
	if yaml.Unmarshal(a, &va) != nil || yaml.Unmarshal(b, &vb) != nil {
		return false
	}
	return reflect.DeepEqual(va, vb)
}
