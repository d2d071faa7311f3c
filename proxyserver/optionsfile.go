package proxyserver

import (
	"errors"
	"fmt"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/internal/regularfile"
)

// maxOptionsFileBytes bounds how much of the --config file and of the
// kubeconfig is read: either is a few KiB (a kubeconfig with its
// certificates inline some tens), so pointing --config at the wrong file
// (/dev/zero, a disk image) cannot exhaust memory.
const maxOptionsFileBytes = 4 << 20

// readOptionsFile reads the --config file or a kubeconfig, which must be
// a regular file of at most maxOptionsFileBytes; else the error wraps a
// *regularfile.RefusedError that says why (see regularfile.Read).
func readOptionsFile(path string) ([]byte, error) {
	data, err := regularfile.Read(path, maxOptionsFileBytes)
	if r := (*regularfile.RefusedError)(nil); errors.As(err, &r) && r.Kind == "" {
		return nil, fmt.Errorf("%w, the most a --config file or kubeconfig may hold", err)
	}
	return data, err
}

// isRefusedFile reports whether err is readOptionsFile's refusal of a
// file, rather than a failure to read it.
func isRefusedFile(err error) bool { return regularfile.IsRefused(err) }
