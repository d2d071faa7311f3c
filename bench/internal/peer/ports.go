package peer

import (
	"errors"
	"math/rand/v2"
	"net"
	"strconv"
	"sync"
)

// Listening ports come from the default NodePort range, below the kernel's
// ephemeral range (32768-60999), so that no outgoing connection of the
// benchmark can be holding one, and so that our proxy accepts them as
// NodePorts.
const (
	portMin   = 30000
	portMax   = 32767
	portTries = 200
)

// Ports hands out listening ports on 127.0.0.1 that are free for both TCP and
// UDP when handed out and never handed out twice in one run.
type Ports struct {
	mu   sync.Mutex // guards used
	used map[int]bool
}

// NewPorts returns an empty allocator.
func NewPorts() *Ports { return &Ports{used: make(map[int]bool)} }

// Next returns a free port.
func (p *Ports) Next() (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for range portTries {
		port := portMin + rand.IntN(portMax-portMin+1)
		if p.used[port] || !portFree(port) {
			continue
		}
		p.used[port] = true
		return port, nil
	}
	return 0, errors.New("peer: no free port on 127.0.0.1")
}

// Addr returns "127.0.0.1:<free port>".
func (p *Ports) Addr() (string, error) {
	port, err := p.Next()
	if err != nil {
		return "", err
	}
	return loopback(port), nil
}

func loopback(port int) string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(port)) }

func portFree(port int) bool {
	addr := loopback(port)
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return false
	}
	l.Close()
	u, err := net.ListenPacket("udp", addr)
	if err != nil {
		return false
	}
	u.Close()
	return true
}

// frontends hands out a TCP echo, a TCP bulk and, when udp is set, a UDP
// echo frontend address.
func frontends(ports *Ports, udp bool) (Addrs, error) {
	var a Addrs
	var err error
	if a.Echo, err = ports.Addr(); err != nil {
		return Addrs{}, err
	}
	if a.Bulk, err = ports.Addr(); err != nil {
		return Addrs{}, err
	}
	if udp {
		if a.UDP, err = ports.Addr(); err != nil {
			return Addrs{}, err
		}
	}
	return a, nil
}
