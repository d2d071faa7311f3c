package userspace

import (
	"errors"
	"fmt"
	"hash/fnv"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode"
)

// PortRange is an inclusive range of proxy ports. The zero value means "let
// the kernel choose".
type PortRange struct {
	Base uint16 // first port
	Size int    // number of ports; 0 means kernel-chosen
}

// ParsePortRange parses the --proxy-port-range syntax of kube-proxy's
// userspace mode: "begin-end", "begin+offset" (begin to begin+offset
// inclusive), or a single "port". "", "0" and "0-0" mean kernel-chosen.
// Spaces around the value are taken off, and any within it are refused,
// as kube-proxy refuses them.
func ParsePortRange(s string) (PortRange, error) {
	s = strings.TrimSpace(s)
	if s == "" || s == "0" || s == "0-0" {
		return PortRange{}, nil
	}
	bad := func(why string) (PortRange, error) {
		return PortRange{}, fmt.Errorf("invalid port range %q: %s (want begin-end, begin+offset or port)", s, why)
	}
	// As kube-proxy's (utilnet.PortRange.Set): the value is trimmed,
	// its parts are not, so "30000 - 30100" is refused there as here.
	num := func(t string) (int, bool) {
		n, err := strconv.Atoi(t)
		return n, err == nil && n >= 0 && n <= 65535
	}
	if strings.ContainsFunc(s, unicode.IsSpace) {
		return bad("no spaces are allowed within it, around '-' or '+' or elsewhere (kube-proxy refuses them)")
	}
	if strings.Contains(s, "-") && strings.Contains(s, "+") {
		// Not one form or the other: as kube-proxy, refuse it rather
		// than read the sign of "1-+5" as part of a number.
		return bad("it has both '-' and '+'")
	}
	var begin, end int
	var ok bool
	switch {
	case strings.Contains(s, "-"):
		a, b, _ := strings.Cut(s, "-")
		if begin, ok = num(a); !ok {
			return bad("begin is not a port number")
		}
		if end, ok = num(b); !ok {
			return bad("end is not a port number")
		}
	case strings.Contains(s, "+"):
		a, b, _ := strings.Cut(s, "+")
		if begin, ok = num(a); !ok {
			return bad("begin is not a port number")
		}
		off, ok := num(b)
		if !ok {
			return bad("offset is not a number from 0 to 65535")
		}
		end = begin + off
		if end > 65535 {
			return bad("begin+offset is past 65535")
		}
	default:
		if begin, ok = num(s); !ok {
			return bad("not a port number")
		}
		end = begin
	}
	if begin == 0 {
		return bad("port 0 cannot start a range")
	}
	if end < begin {
		return bad("end is before begin")
	}
	return PortRange{Base: uint16(begin), Size: end - begin + 1}, nil
}

// String returns the range in "begin-end" form, or "" when kernel-chosen.
func (r PortRange) String() string {
	if r.Size == 0 {
		return ""
	}
	return fmt.Sprintf("%d-%d", r.Base, int(r.Base)+r.Size-1)
}

// Contains reports whether port lies in the range.
func (r PortRange) Contains(port uint16) bool {
	return r.Size > 0 && port >= r.Base && int(port) < int(r.Base)+r.Size
}

// ErrPortRangeExhausted is returned when every port of the range is taken.
var ErrPortRangeExhausted = errors.New("proxy port range exhausted")

// portAllocator hands out proxy ports from a PortRange. With a zero range it
// returns 0, which asks the kernel for an ephemeral port.
type portAllocator struct {
	r   PortRange
	now func() time.Time

	mu       sync.Mutex // guards the fields below
	used     []bool     // indexed by port - r.Base
	free     int
	reserved map[uint16]bool // never handed out: node ports this host serves itself
	// retired are the ports service ports gave up in the last reuseDelay,
	// with whose and when (see retire).
	retired map[uint16]retiredPort
}

// retiredPort is who gave up a port, and when.
type retiredPort struct {
	owner string
	at    time.Time
}

// reuseDelay is how long a port a service port gave up goes to another
// only when no other port is free.
const reuseDelay = 5 * time.Minute

// newPortAllocator returns an allocator of r's ports; now tells the time
// (see retire).
func newPortAllocator(r PortRange, now func() time.Time) *portAllocator {
	return &portAllocator{r: r, now: now, used: make([]bool, r.Size), free: r.Size}
}

// reserve sets the ports that are never handed out or claimed, in place of
// those set before: the node ports this host serves itself, which a range
// that overlaps the node-port range would otherwise hand out as proxy
// ports.
func (a *portAllocator) reserve(ports map[uint16]bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.reserved = ports
}

// isReserved reports whether port is reserved.
func (a *portAllocator) isReserved(port uint16) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.reserved[port]
}

// allocate returns a free port for owner: the first free one from an
// offset that key decides, scanning with wrap-around, passing over the
// ports other owners gave up in the last reuseDelay while another is free.
// The key is the service port's name and role, so a restarted proxy given
// the same Services gives each the port it had: with --portal=none clients
// use proxy ports directly, and no rules keep them (see
// Config.PreferredProxyPort for the iptables portal).
func (a *portAllocator) allocate(key, owner string) (uint16, error) {
	if a.r.Size == 0 {
		return 0, nil
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.free > 0 {
		h := fnv.New32a()
		h.Write([]byte(key))
		start := int(h.Sum32() % uint32(a.r.Size))
		now := a.now()
		for c, r := range a.retired {
			if now.Sub(r.at) >= reuseDelay {
				delete(a.retired, c)
			}
		}
		for _, fresh := range []bool{true, false} {
			if fresh && len(a.retired) == 0 {
				continue
			}
			for i := range a.r.Size {
				off := (start + i) % a.r.Size
				port := a.r.Base + uint16(off)
				if a.used[off] || a.reserved[port] {
					continue
				}
				if r, ok := a.retired[port]; fresh && ok && r.owner != owner {
					continue
				}
				a.used[off] = true
				a.free--
				delete(a.retired, port)
				return port, nil
			}
		}
	}
	return 0, fmt.Errorf("%w: all %d ports of %s are in use (as proxy ports or node ports)", ErrPortRangeExhausted, a.r.Size, a.r)
}

// claim marks a specific port as used, e.g. one the kernel chose or one we
// keep from before; it reports false if the port is outside the range,
// already used or reserved.
func (a *portAllocator) claim(port uint16) bool {
	if !a.r.Contains(port) {
		return false
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	off := int(port - a.r.Base)
	if a.used[off] || a.reserved[port] {
		return false
	}
	a.used[off] = true
	a.free--
	return true
}

// retire returns a port that owner gave up to the range. For reuseDelay
// it goes to another owner only when no other port is free: with
// --portal=none clients address proxy ports themselves, and one that
// still uses a deleted Service's port must not reach the next Service's
// endpoints at once. The owner itself (a Service deleted and added again)
// takes it back as before.
func (a *portAllocator) retire(port uint16, owner string) {
	a.release(port)
	if !a.r.Contains(port) {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.retired == nil {
		a.retired = make(map[uint16]retiredPort)
	}
	a.retired[port] = retiredPort{owner: owner, at: a.now()}
}

// release returns a port to the range. Ports outside the range (including
// kernel-chosen ones) are ignored.
func (a *portAllocator) release(port uint16) {
	if !a.r.Contains(port) {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	off := int(port - a.r.Base)
	if a.used[off] {
		a.used[off] = false
		a.free++
	}
}
