//go:build !unix

package source

import "errors"

// mkfifo makes a named pipe at path, where the system has them.
func mkfifo(path string) error { return errors.ErrUnsupported }
