package proxyserver

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
)

// maxOptionsFileBytes bounds how much of the --config file and of the
// kubeconfig is read: either is a few KiB (a kubeconfig with its
// certificates inline some tens), so pointing --config at the wrong file
// (/dev/zero, a disk image) cannot exhaust memory.
const maxOptionsFileBytes = 4 << 20

// refusedFileError is why readOptionsFile will not read a file: it is not
// a regular file, or is larger than maxOptionsFileBytes.
type refusedFileError struct {
	Path string
	Why  string // "not a regular file (a named pipe)"
}

func (e *refusedFileError) Error() string { return e.Path + ": " + e.Why }

// readOptionsFile reads the --config file or a kubeconfig, which must be
// a regular file of at most maxOptionsFileBytes; else the error is a
// *refusedFileError that says why. A named pipe is refused without
// waiting for a writer (even SIGTERM could not end that wait): the file
// is looked at before it is opened, so that a device is not opened at
// all, and opened without blocking (where the system has named pipes),
// then looked at again, for a file swapped in between. Errors name the
// file.
func readOptionsFile(path string) ([]byte, error) {
	if fi, err := os.Stat(path); err == nil {
		if err := checkOptionsFile(path, fi); err != nil {
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
	if err := checkOptionsFile(path, fi); err != nil {
		return nil, err
	}
	// A file may say it is smaller than what it holds (those of /proc
	// say 0) or grow while read: at most one byte more than allowed is
	// read, to tell.
	data, err := io.ReadAll(io.LimitReader(f, maxOptionsFileBytes+1))
	if err != nil {
		return nil, err // "read PATH: ..."
	}
	if len(data) > maxOptionsFileBytes {
		return nil, tooLarge(path)
	}
	return data, nil
}

// checkOptionsFile refuses what fi says is not a regular file, or is
// larger than maxOptionsFileBytes.
func checkOptionsFile(path string, fi fs.FileInfo) error {
	switch m := fi.Mode(); {
	case !m.IsRegular():
		return &refusedFileError{Path: path, Why: "not a regular file (" + fileKind(m) + ")"}
	case fi.Size() > maxOptionsFileBytes:
		return tooLarge(path)
	}
	return nil
}

func tooLarge(path string) error {
	return &refusedFileError{Path: path, Why: fmt.Sprintf("larger than %d MiB, the most a --config file or kubeconfig may hold", maxOptionsFileBytes>>20)}
}

// isRefusedFile reports whether err is readOptionsFile's refusal of a
// file, rather than a failure to read it.
func isRefusedFile(err error) bool {
	var r *refusedFileError
	return errors.As(err, &r)
}

// fileKind names the type of a file that is not a regular one.
func fileKind(m fs.FileMode) string {
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
