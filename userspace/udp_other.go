//go:build !unix

package userspace

import "errors"

// listenUDP is not built yet off Unix: UDP service ports are reported by
// Apply and skipped, and TCP keeps working.
func listenUDP(*servicePort, sockKey) (socket, error) {
	return nil, errors.New("UDP service ports are not supported on this OS yet")
}
