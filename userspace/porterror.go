package userspace

import (
	"fmt"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/state"
)

// PortError is the failure of one service port at an Apply, found in
// Apply's error with errors.As: Name says which port failed, whatever the
// message says. Its message is Err's, "userspace: service NAME: ...".
type PortError struct {
	Name state.ServicePortName
	Err  error
}

func (e *PortError) Error() string { return e.Err.Error() }
func (e *PortError) Unwrap() error { return e.Err }

// portErrorf returns a *PortError about service port name, its message
// "userspace: service NAME: " and format with args (%w wraps, as with
// fmt.Errorf).
func portErrorf(name state.ServicePortName, format string, args ...any) error {
	return &PortError{Name: name, Err: fmt.Errorf("userspace: service %s: "+format, append([]any{name}, args...)...)}
}
