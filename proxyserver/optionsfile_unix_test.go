//go:build unix

package proxyserver

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spf13/pflag"
	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"
)

// goodConfig is a --config file that loads; oversized is one as good but
// one byte longer than maxOptionsFileBytes (a comment fills it).
const goodConfig = "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmode: userspace\n"

func oversized() string {
	pad := maxOptionsFileBytes + 1 - len(goodConfig) - len("#\n")
	return goodConfig + "#" + strings.Repeat("x", pad) + "\n"
}

// mkfifo makes a named pipe at path and, at the end of the test, opens it
// for writing and closes it, so that a reader left waiting on it (as one
// was before readOptionsFile) is let go.
func mkfifo(t *testing.T, path string) {
	t.Helper()
	if err := unix.Mkfifo(path, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if f, err := os.OpenFile(path, os.O_WRONLY|unix.O_NONBLOCK, 0); err == nil {
			f.Close()
		}
	})
}

// within runs f and returns its error, failing the test if f has not
// returned after 5 s (as a read of a named pipe would not).
func within(t *testing.T, what string, f func() error) error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- f() }()
	select {
	case err := <-done:
		return err
	case <-time.After(5 * time.Second):
		t.Fatalf("%s has not returned after 5s", what)
		return nil
	}
}

// unusableFiles makes, in dir, the files that readOptionsFile refuses and
// says what each error must say, after the file's path.
func unusableFiles(t *testing.T, dir string) []struct{ name, path, want string } {
	t.Helper()
	fifo := filepath.Join(dir, "fifo")
	mkfifo(t, fifo)
	link := filepath.Join(dir, "link-to-fifo")
	if err := os.Symlink(fifo, link); err != nil {
		t.Fatal(err)
	}
	big := filepath.Join(dir, "big.yaml")
	if err := os.WriteFile(big, []byte(oversized()), 0o644); err != nil {
		t.Fatal(err)
	}
	sub := filepath.Join(dir, "dir")
	if err := os.Mkdir(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	return []struct{ name, path, want string }{
		{"named pipe", fifo, ": not a regular file (a named pipe)"},
		{"link to a named pipe", link, ": not a regular file (a named pipe)"},
		{"zero device", "/dev/zero", ": not a regular file (a character device)"},
		{"directory", sub, ": not a regular file (a directory)"},
		{"over 4 MiB", big, ": larger than 4 MiB, the most a --config file or kubeconfig may hold"},
	}
}

// TestReadOptionsFile: a regular file of up to maxOptionsFileBytes is
// read whole; a named pipe (which a plain read waits on for ever), a
// device (/dev/zero, which a plain read takes until memory runs out), a
// directory or a larger file is refused at once, naming the file and why.
func TestReadOptionsFile(t *testing.T) {
	dir := t.TempDir()
	full := filepath.Join(dir, "full.yaml")
	content := bytes.Repeat([]byte("#\n"), maxOptionsFileBytes/2)
	if err := os.WriteFile(full, content, 0o644); err != nil {
		t.Fatal(err)
	}
	data, err := readOptionsFile(full)
	if err != nil || !bytes.Equal(data, content) {
		t.Errorf("a file of exactly %d bytes: read %d bytes, error %v; want it whole", len(content), len(data), err)
	}
	if _, err := readOptionsFile(filepath.Join(dir, "missing")); !errors.Is(err, os.ErrNotExist) || isRefusedFile(err) {
		t.Errorf("a missing file: error %v, want one that it does not exist", err)
	}
	for _, tc := range unusableFiles(t, dir) {
		t.Run(tc.name, func(t *testing.T) {
			var data []byte
			err := within(t, "readOptionsFile", func() (err error) {
				data, err = readOptionsFile(tc.path)
				return err
			})
			if err == nil || err.Error() != tc.path+tc.want || !isRefusedFile(err) || data != nil {
				t.Errorf("read %d bytes, error %v; want %q", len(data), err, tc.path+tc.want)
			}
		})
	}
}

// TestLoadConfigFileRefusesUnusableFile: --config naming a named pipe
// waited for a writer for ever, /dev/zero was read until Go ran out of
// memory, and a file of any size was read whole (xa59); now each is
// refused at once with an error that names the file and why.
func TestLoadConfigFileRefusesUnusableFile(t *testing.T) {
	for _, tc := range unusableFiles(t, t.TempDir()) {
		t.Run(tc.name, func(t *testing.T) {
			c := NewConfig()
			fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
			c.AddFlags(fs)
			if err := fs.Parse([]string{"--config", tc.path}); err != nil {
				t.Fatal(err)
			}
			err := within(t, "LoadConfigFile", func() error { return c.LoadConfigFile(fs) })
			if want := "--config: " + tc.path + tc.want; err == nil || err.Error() != want {
				t.Errorf("error %v, want %q", err, want)
			}
		})
	}
}

// TestLoadKubeconfigRefusesUnusableFile: so with the kubeconfig.
func TestLoadKubeconfigRefusesUnusableFile(t *testing.T) {
	for _, tc := range unusableFiles(t, t.TempDir()) {
		t.Run(tc.name, func(t *testing.T) {
			c := NewConfig()
			c.Kubeconfig = tc.path
			err := within(t, "LoadKubeconfig", c.LoadKubeconfig)
			if want := "--kubeconfig: " + tc.path + tc.want; err == nil || err.Error() != want {
				t.Errorf("error %v, want %q", err, want)
			}
		})
	}
}

// logLines is a klog output that tests may read, and wait on, while the
// code under test logs.
type logLines struct {
	mu     sync.Mutex // guards the fields below
	buf    strings.Builder
	notify chan struct{} // closed and replaced on every write
}

func newLogLines() *logLines { return &logLines{notify: make(chan struct{})} }

func (l *logLines) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	close(l.notify)
	l.notify = make(chan struct{})
	return l.buf.Write(p)
}

func (l *logLines) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// count is how many lines have s, and a channel closed on the next write.
func (l *logLines) count(s string) (int, <-chan struct{}) {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for line := range strings.Lines(l.buf.String()) {
		if strings.Contains(line, s) {
			n++
		}
	}
	return n, l.notify
}

// TestConfigWatchRefusedFile: the watched file replaced by a named pipe
// (on which the watch's read once waited for ever, deaf to a later new
// file and to the end of ctx), by a link to /dev/zero or by a file over
// the size limit is said once, with why, and is no change: the watch goes
// on, so a usable file with new content later is a change, and ends at
// once when ctx is done.
func TestConfigWatchRefusedFile(t *testing.T) {
	for _, tc := range []struct {
		name, why string
		swap      func(t *testing.T, tmp string) // makes the file at tmp
	}{
		{"named pipe", "not a regular file (a named pipe)", func(t *testing.T, tmp string) { mkfifo(t, tmp) }},
		{"link to the zero device", "not a regular file (a character device)", func(t *testing.T, tmp string) {
			if err := os.Symlink("/dev/zero", tmp); err != nil {
				t.Fatal(err)
			}
		}},
		{"over 4 MiB", "larger than 4 MiB", func(t *testing.T, tmp string) {
			if err := os.WriteFile(tmp, []byte(oversized()), 0o644); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		for _, then := range []string{"new content", "cancelled"} {
			t.Run(tc.name+", then "+then, func(t *testing.T) {
				logs := newLogLines()
				klog.LogToStderr(false)
				klog.SetOutput(logs)
				// An error line goes to the INFO and WARNING logs too.
				klog.SetOutputBySeverity("WARNING", io.Discard)
				klog.SetOutputBySeverity("ERROR", io.Discard)
				t.Cleanup(func() { klog.Flush(); klog.LogToStderr(true) })

				dir := t.TempDir()
				path := filepath.Join(dir, "config.conf")
				if err := os.WriteFile(path, []byte(goodConfig), 0o644); err != nil {
					t.Fatal(err)
				}
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				done := make(chan error, 1)
				go func() {
					w := &configWatch{Path: path, Loaded: []byte(goodConfig), Same: sameYAML, Debounce: 10 * time.Millisecond, Resync: 10 * time.Millisecond}
					done <- w.run(ctx)
				}()
				tmp := filepath.Join(dir, "tmp")
				tc.swap(t, tmp)
				if err := os.Rename(tmp, path); err != nil {
					t.Fatal(err)
				}
				said := path + ": " + tc.why
				deadline := time.After(5 * time.Second)
				for n, more := logs.count(said); n == 0; n, more = logs.count(said) {
					select {
					case <-more:
					case err := <-done:
						t.Fatalf("run = %v after the file was replaced by one it cannot use; want it to go on", err)
					case <-deadline:
						t.Fatalf("nothing logged with %q within 5s:\n%s", said, logs)
					}
				}
				// Read again every 10ms: a window to see it not said again
				// and still no change.
				select {
				case err := <-done:
					t.Fatalf("run = %v while the file is one it cannot use; want it to go on", err)
				case <-time.After(300 * time.Millisecond):
				}
				if n, _ := logs.count(said); n != 1 {
					t.Errorf("logged %d times that it cannot use the file, want once", n)
				}
				if then == "cancelled" {
					cancel()
					if err := within(t, "run, after ctx was done,", func() error { return <-done }); err != nil {
						t.Errorf("run = %v after ctx was done, want nil", err)
					}
					return
				}
				if err := os.WriteFile(tmp, []byte(goodConfig+"portRange: 40000-40100\n"), 0o644); err != nil {
					t.Fatal(err)
				}
				if err := os.Rename(tmp, path); err != nil {
					t.Fatal(err)
				}
				err := within(t, "run, after a usable file with new content,", func() error { return <-done })
				if !errors.Is(err, errConfigChanged) || !strings.Contains(err.Error(), "has new content") {
					t.Errorf("run = %v, want a change with %q", err, "has new content")
				}
			})
		}
	}
}
