package proxyserver

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/fsnotify/fsnotify"
	"k8s.io/klog/v2"
)

// errConfigChanged is why Run stops when the --config file changes.
var errConfigChanged = errors.New("the --config file changed")

// configWatch follows the --config file as kube-proxy does: it does not
// reload it, but reports a change, so that the proxy exits and its
// DaemonSet starts it again with the new content.
type configWatch struct {
	// Path is the file; it may be a symbolic link, as in a ConfigMap
	// volume, where the kubelet swaps a ..data link to a new directory.
	Path string
	// Loaded is the content the options were read from.
	Loaded []byte
	// Debounce is how long the directory must stay quiet after an event
	// before the file is read again, so a swap in several steps is read
	// once it is done. If zero, 100ms.
	Debounce time.Duration
	// Resync is how often the file is read without an event, for
	// filesystems that deliver none. If zero, 1 minute.
	Resync time.Duration
}

// run waits until the file's content differs from Loaded (or the file is
// gone) and returns an error wrapping errConfigChanged that says how; or
// nil when ctx is done. Edits that leave the content as it was (a touch,
// a ConfigMap update of another key) are no change.
func (w *configWatch) run(ctx context.Context) error {
	debounce := w.Debounce
	if debounce == 0 {
		debounce = 100 * time.Millisecond
	}
	resync := w.Resync
	if resync == 0 {
		resync = time.Minute
	}
	fw, err := fsnotify.NewWatcher()
	if err != nil {
		klog.ErrorS(err, "Cannot watch the --config file for changes; it is read again every minute", "config", w.Path)
	} else {
		defer fw.Close()
		// The file's directory sees it replaced (an editor's rename, a
		// ConfigMap's ..data swap); where it is a link, the directory of
		// what it points at sees it written in place.
		dirs := []string{filepath.Dir(w.Path)}
		if real, err := filepath.EvalSymlinks(w.Path); err == nil && filepath.Dir(real) != dirs[0] {
			dirs = append(dirs, filepath.Dir(real))
		}
		for _, d := range dirs {
			if err := fw.Add(d); err != nil {
				klog.ErrorS(err, "Cannot watch the --config file's directory; the file is read again every minute", "dir", d)
			}
		}
	}
	var events <-chan fsnotify.Event
	var errs <-chan error
	if fw != nil {
		events, errs = fw.Events, fw.Errors
	}
	tick := time.NewTicker(resync)
	defer tick.Stop()
	quiet := time.NewTimer(0) // read once at start: it may have changed since it was loaded
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-events:
			quiet.Reset(debounce)
			continue
		case err := <-errs:
			klog.ErrorS(err, "Watching the --config file", "config", w.Path)
			continue
		case <-tick.C:
		case <-quiet.C:
		}
		if how := w.changed(); how != "" {
			return fmt.Errorf("%w (%s): exiting so that it is read again, as kube-proxy does (a DaemonSet restarts the proxy)", errConfigChanged, how)
		}
	}
}

// changed says how the file differs from Loaded, or "".
func (w *configWatch) changed() string {
	data, err := os.ReadFile(w.Path)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return w.Path + " is gone"
	case err != nil:
		return fmt.Sprintf("%s cannot be read: %v", w.Path, err)
	case !bytes.Equal(data, w.Loaded):
		return w.Path + " has new content"
	}
	return ""
}
