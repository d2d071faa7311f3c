// Package regularfile reads the files the proxy is pointed at (its
// manifests, its --config file, its kubeconfig) so that pointing it at the
// wrong thing cannot hang or exhaust it: only a regular file is read, and
// only up to a limit.
package regularfile

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
)

// RefusedError is why Read will not read a file: it is not a regular
// file, or it holds more than the limit.
type RefusedError struct {
	Path string
	// Kind names what the file is when it is not a regular file ("a
	// named pipe"); empty when it is one, larger than Limit.
	Kind  string
	Limit int
}

func (e *RefusedError) Error() string {
	if e.Kind != "" {
		return e.Path + ": not a regular file (" + e.Kind + ")"
	}
	return fmt.Sprintf("%s: larger than %d MiB", e.Path, e.Limit>>20)
}

// IsRefused reports whether err is (or wraps) Read's refusal of a file,
// rather than a failure to read it.
func IsRefused(err error) bool {
	var r *RefusedError
	return errors.As(err, &r)
}

// Read reads path, which must be a regular file of at most limit bytes;
// else the error is a *RefusedError. A named pipe is refused without
// waiting for a writer (not even SIGTERM could end that wait): the file
// is looked at before it is opened, so that a device is not opened at
// all, then opened without blocking (where the system has named pipes),
// and looked at again, for a file swapped in between. Errors name the
// file.
func Read(path string, limit int) ([]byte, error) {
	if fi, err := os.Stat(path); err == nil {
		if err := check(path, fi, limit); err != nil {
			return nil, err
		}
	}
	f, err := os.OpenFile(path, os.O_RDONLY|openNonblock, 0)
	if err != nil {
		return nil, err // "open PATH: ..."
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if err := check(path, fi, limit); err != nil {
		return nil, err
	}
	// A file may say it is smaller than what it holds (those of /proc
	// say 0) or grow while read: at most one byte more than allowed is
	// read, to tell.
	data, err := io.ReadAll(io.LimitReader(f, int64(limit)+1))
	if err != nil {
		return nil, err // "read PATH: ..."
	}
	if len(data) > limit {
		return nil, &RefusedError{Path: path, Limit: limit}
	}
	return data, nil
}

// check refuses what fi says is not a regular file, or is larger than
// limit.
func check(path string, fi fs.FileInfo, limit int) error {
	switch m := fi.Mode(); {
	case !m.IsRegular():
		return &RefusedError{Path: path, Kind: Kind(m), Limit: limit}
	case fi.Size() > int64(limit):
		return &RefusedError{Path: path, Limit: limit}
	}
	return nil
}

// Kind names the type of a file that is not a regular one.
func Kind(m fs.FileMode) string {
	switch {
	case m.IsDir():
		return "a directory"
	case m&fs.ModeNamedPipe != 0:
		return "a named pipe"
	case m&fs.ModeSocket != 0:
		return "a socket"
	case m&fs.ModeCharDevice != 0:
		return "a character device"
	case m&fs.ModeDevice != 0:
		return "a device"
	}
	return m.Type().String()
}
