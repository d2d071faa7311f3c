package proxyserver

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestConfigWatch: the watch reports a new content of the file, written in
// place, renamed over it, swapped in as a ConfigMap volume does (a ..data
// link to a new directory), or the file removed; a write of the same
// content, or of content that says the same in another form (a comment
// added, JSON for YAML), or a change of another key of the ConfigMap, is
// none (xa50: a comment added to the ConfigMap restarted every node's
// proxy, cutting every connection it carried).
func TestConfigWatch(t *testing.T) {
	const old, updated = "mode: userspace\n", "mode: userspace\nportRange: 40000-40100\n"
	// configMap lays out a ConfigMap volume in dir, as the kubelet does:
	// config.conf -> ..data/config.conf, ..data -> ..<version>.
	configMap := func(t *testing.T, dir, version, content, other string) {
		t.Helper()
		v := filepath.Join(dir, ".."+version)
		if err := os.Mkdir(v, 0o755); err != nil {
			t.Fatal(err)
		}
		for name, c := range map[string]string{"config.conf": content, "kubeconfig.conf": other} {
			if err := os.WriteFile(filepath.Join(v, name), []byte(c), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		tmp := filepath.Join(dir, "..data_tmp")
		if err := os.Symlink(".."+version, tmp); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, filepath.Join(dir, "..data")); err != nil {
			t.Fatal(err)
		}
		for _, name := range []string{"config.conf", "kubeconfig.conf"} {
			_ = os.Symlink(filepath.Join("..data", name), filepath.Join(dir, name))
		}
	}
	write := func(t *testing.T, path, content string) {
		t.Helper()
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// inConfDir sets the file up in a directory of its own, conf.
	inConfDir := func(t *testing.T, dir string) string {
		d := filepath.Join(dir, "conf")
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
		write(t, filepath.Join(d, "config.conf"), old)
		return filepath.Join(d, "config.conf")
	}
	tests := []struct {
		name   string
		setup  func(t *testing.T, dir string) string // returns the path
		change func(t *testing.T, dir, path string)
		want   string // in the error; "" for no change reported
	}{
		{"written in place", func(t *testing.T, dir string) string {
			p := filepath.Join(dir, "config.conf")
			write(t, p, old)
			return p
		}, func(t *testing.T, _, path string) { write(t, path, updated) }, "has new content"},
		{"same content written", func(t *testing.T, dir string) string {
			p := filepath.Join(dir, "config.conf")
			write(t, p, old)
			return p
		}, func(t *testing.T, _, path string) { write(t, path, old) }, ""},
		{"a comment added", func(t *testing.T, dir string) string {
			p := filepath.Join(dir, "config.conf")
			write(t, p, old)
			return p
		}, func(t *testing.T, _, path string) { write(t, path, "# kube-userspace-proxy\n"+old) }, ""},
		{"the layout changed", func(t *testing.T, dir string) string {
			p := filepath.Join(dir, "config.conf")
			write(t, p, old)
			return p
		}, func(t *testing.T, _, path string) { write(t, path, "{\"mode\": \"userspace\"}\n") }, ""},
		{"ConfigMap update with a comment", func(t *testing.T, dir string) string {
			configMap(t, dir, "v1", old, "a")
			return filepath.Join(dir, "config.conf")
		}, func(t *testing.T, dir, _ string) { configMap(t, dir, "v2", old+"# set by the operator\n", "a") }, ""},
		{"renamed over", func(t *testing.T, dir string) string {
			p := filepath.Join(dir, "config.conf")
			write(t, p, old)
			return p
		}, func(t *testing.T, dir, path string) {
			write(t, filepath.Join(dir, "new"), updated)
			if err := os.Rename(filepath.Join(dir, "new"), path); err != nil {
				t.Fatal(err)
			}
		}, "has new content"},
		{"removed", func(t *testing.T, dir string) string {
			p := filepath.Join(dir, "config.conf")
			write(t, p, old)
			return p
		}, func(t *testing.T, _, path string) { os.Remove(path) }, "is gone"},
		{"ConfigMap update", func(t *testing.T, dir string) string {
			configMap(t, dir, "v1", old, "a")
			return filepath.Join(dir, "config.conf")
		}, func(t *testing.T, dir, _ string) { configMap(t, dir, "v2", updated, "a") }, "has new content"},
		{"ConfigMap update of another key", func(t *testing.T, dir string) string {
			configMap(t, dir, "v1", old, "a")
			return filepath.Join(dir, "config.conf")
		}, func(t *testing.T, dir, _ string) { configMap(t, dir, "v2", old, "b") }, ""},
		{"slow rewrite of the same content", func(t *testing.T, dir string) string {
			p := filepath.Join(dir, "config.conf")
			write(t, p, old)
			return p
		}, func(t *testing.T, _, path string) {
			// Truncated, then written well after the debounce: the empty
			// file between is a write under way, not new content.
			f, err := os.OpenFile(path, os.O_WRONLY|os.O_TRUNC, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			time.Sleep(300 * time.Millisecond)
			if _, err := f.WriteString(old); err != nil {
				t.Fatal(err)
			}
		}, ""},
		{"directory replaced, then written in place", inConfDir, func(t *testing.T, dir, path string) {
			// mv conf conf.old; mv conf.new conf: the watch set on conf
			// follows conf.old unless it is set again.
			d := filepath.Join(dir, "conf")
			if err := os.Mkdir(d+".new", 0o755); err != nil {
				t.Fatal(err)
			}
			write(t, filepath.Join(d+".new", "config.conf"), old)
			if err := os.Rename(d, d+".old"); err != nil {
				t.Fatal(err)
			}
			if err := os.Rename(d+".new", d); err != nil {
				t.Fatal(err)
			}
			time.Sleep(200 * time.Millisecond) // the debounced read after the moves
			write(t, path, updated)
		}, "has new content"},
		{"directory deleted and made again, then written in place", inConfDir, func(t *testing.T, dir, path string) {
			// rm -r conf; mkdir conf: the new directory often has the
			// old one's inode number, but not its watch. First let the
			// watch be set on the old one (were it not yet, it would be
			// set on the new one, and the case would pass for nothing).
			time.Sleep(100 * time.Millisecond)
			d := filepath.Join(dir, "conf")
			if err := os.RemoveAll(d); err != nil {
				t.Fatal(err)
			}
			if err := os.Mkdir(d, 0o755); err != nil {
				t.Fatal(err)
			}
			write(t, path, old)
			time.Sleep(200 * time.Millisecond) // the debounced read after the remake
			write(t, path, updated)
		}, "has new content"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			path := tc.setup(t, dir)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			done := make(chan error, 1)
			// No wait for the watch to be set: a change made before it is
			// found by the read it makes once its watches are set.
			go func() {
				w := &configWatch{Path: path, Loaded: []byte(old), Same: sameYAML, Debounce: 20 * time.Millisecond, Resync: time.Hour}
				done <- w.run(ctx)
			}()
			tc.change(t, dir, path)
			select {
			case err := <-done:
				if tc.want == "" || !errors.Is(err, errConfigChanged) || !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("run = %v, want a change with %q", err, tc.want)
				}
			case <-time.After(time.Second):
				if tc.want != "" {
					t.Fatalf("no change reported, want one with %q", tc.want)
				}
			}
		})
	}
}

// TestConfigWatchSwapReadBetweenItsMoves: a directory swapped in two
// steps (mv conf conf.old, then mv conf.new conf) whose file a read finds
// gone between them is no change when the file is back at the next read,
// a debounce later: only a file gone at two reads in a row is gone. Here
// the second move comes 300 ms after the first, between the read a
// debounce (250 ms) after it and the next; then an edit in place is still
// seen.
func TestConfigWatchSwapReadBetweenItsMoves(t *testing.T) {
	const old, updated = "mode: userspace\n", "mode: userspace\nportRange: 40000-40100\n"
	dir := filepath.Join(t.TempDir(), "conf")
	path := filepath.Join(dir, "config.conf")
	for _, d := range []string{dir, dir + ".new"} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(d, "config.conf"), []byte(old), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		w := &configWatch{Path: path, Loaded: []byte(old), Same: sameYAML, Debounce: 250 * time.Millisecond, Resync: time.Hour}
		done <- w.run(ctx)
	}()
	time.Sleep(100 * time.Millisecond) // the watch set on conf, and its first read made
	if err := os.Rename(dir, dir+".old"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	if err := os.Rename(dir+".new", dir); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		t.Fatalf("run = %v during the swap, want no change", err)
	case <-time.After(time.Second):
	}
	if err := os.WriteFile(path, []byte(updated), 0o644); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if !errors.Is(err, errConfigChanged) || !strings.Contains(err.Error(), "has new content") {
			t.Fatalf("run = %v, want a change with %q", err, "has new content")
		}
	case <-time.After(3 * time.Second):
		t.Fatal("no change reported for the edit after the swap")
	}
}
