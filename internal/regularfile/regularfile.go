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
	"slices"
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
	data, over, err := readUpTo(f, fi.Size(), limit)
	if err != nil {
		return nil, err // "read PATH: ..."
	}
	if over {
		return nil, &RefusedError{Path: path, Limit: limit}
	}
	return data, nil
}

// minRead is the buffer readUpTo starts with for a file that says it is
// smaller, as os.ReadFile's.
const minRead = 512

// readUpTo reads r to its end into a buffer of size bytes and one more,
// to see the end: size is what the file says it holds, so the buffer does
// not grow as it is read (io.ReadAll reads into chunks, growing from 512
// bytes, and copies them into one at the end: twice the file's size at
// that moment). A file may say less (those of /proc say 0) or grow while read: the
// buffer then grows, but at most one byte more than limit is read, to
// tell, and over reports that r holds more. A file that shrank while read
// to less than half its size is copied out of the buffer, which is then
// let go.
func readUpTo(r io.Reader, size int64, limit int) (data []byte, over bool, err error) {
	n := int(min(max(size, 0), int64(limit))) + 1
	data = make([]byte, 0, min(max(n, minRead), limit+1))
	for {
		if len(data) == cap(data) { // it grew: by a quarter, to no more than limit+1
			grown := make([]byte, len(data), len(data)+min(max(len(data)/4, minRead), limit+1-len(data)))
			copy(grown, data)
			data = grown
		}
		m, rerr := r.Read(data[len(data):min(cap(data), limit+1)])
		data = data[:len(data)+m]
		switch {
		case len(data) > limit:
			return nil, true, nil
		case rerr == io.EOF:
			if len(data) < n/2 {
				data = slices.Clone(data)
			}
			return data, false, nil
		case rerr != nil:
			return nil, false, rerr
		}
	}
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
