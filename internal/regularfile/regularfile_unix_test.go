//go:build unix

package regularfile

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestRead: a regular file of up to the limit is read whole; anything
// else is refused at once, named, without opening a device or waiting on
// a named pipe for a writer.
func TestRead(t *testing.T) {
	dir := t.TempDir()
	write := func(name string, n int) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, bytes.Repeat([]byte("x"), n), 0o644); err != nil {
			t.Fatal(err)
		}
		return path
	}
	full := write("full", 1<<20)
	data, err := Read(full, 1<<20)
	if err != nil || len(data) != 1<<20 {
		t.Fatalf("a file of exactly the limit: %d bytes, %v", len(data), err)
	}
	fifo := filepath.Join(dir, "fifo")
	if err := unix.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ path, want string }{
		{write("big", 1<<20+1), "big: larger than 1 MiB"},
		{fifo, "fifo: not a regular file (a named pipe)"},
		{dir, dir + ": not a regular file (a directory)"},
		{"/dev/zero", "/dev/zero: not a regular file (a character device)"},
	} {
		done := make(chan error, 1)
		go func() {
			_, err := Read(tc.path, 1<<20)
			done <- err
		}()
		select {
		case err := <-done:
			if err == nil || !IsRefused(err) || !bytes.HasSuffix([]byte(err.Error()), []byte(tc.want)) {
				t.Errorf("%s: %v, want a refusal ending %q", tc.path, err, tc.want)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: still reading after 10 s", tc.path) // a named pipe's open waits for a writer
		}
	}
	if _, err := Read(filepath.Join(dir, "missing"), 1<<20); !errors.Is(err, os.ErrNotExist) || IsRefused(err) {
		t.Errorf("a missing file: %v, want not-exist, not a refusal", err)
	}
}
