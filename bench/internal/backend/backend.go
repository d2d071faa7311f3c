package backend

import (
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"
)

// The first byte a client writes on a bulk connection picks the direction.
const (
	// BulkSource makes the server write until the client goes away: the
	// client measures download (backend to client) throughput.
	BulkSource byte = 'S'
	// BulkSink makes the server read and discard until EOF: the client
	// measures upload (client to backend) throughput.
	BulkSink byte = 'K'
)

const (
	// echoBufSize is small on purpose: the idle test holds thousands of
	// echo connections and each one keeps its buffer.
	echoBufSize = 4 << 10
	bulkBufSize = 256 << 10
	udpBufSize  = 64 << 10

	acceptRetryDelay = 5 * time.Millisecond
)

// Config names the listen addresses. An empty address disables that server.
type Config struct {
	Echo string // TCP echo
	Bulk string // TCP bulk source/sink
	UDP  string // UDP echo
}

// Server is a set of running backends. Close stops them all.
type Server struct {
	echo net.Listener
	bulk net.Listener
	udp  *net.UDPConn

	wg sync.WaitGroup // accept loops, connection handlers, the UDP loop

	mu     sync.Mutex // guards the fields below
	conns  map[net.Conn]struct{}
	closed bool
}

// Listen opens the listeners named in cfg; Serve starts answering on them.
func Listen(cfg Config) (*Server, error) {
	s := &Server{conns: make(map[net.Conn]struct{})}
	var err error
	if cfg.Echo != "" {
		if s.echo, err = net.Listen("tcp", cfg.Echo); err != nil {
			s.closeListeners()
			return nil, fmt.Errorf("backend: listen echo: %w", err)
		}
	}
	if cfg.Bulk != "" {
		if s.bulk, err = net.Listen("tcp", cfg.Bulk); err != nil {
			s.closeListeners()
			return nil, fmt.Errorf("backend: listen bulk: %w", err)
		}
	}
	if cfg.UDP != "" {
		addr, rerr := net.ResolveUDPAddr("udp", cfg.UDP)
		if rerr != nil {
			s.closeListeners()
			return nil, fmt.Errorf("backend: udp address: %w", rerr)
		}
		if s.udp, err = net.ListenUDP("udp", addr); err != nil {
			s.closeListeners()
			return nil, fmt.Errorf("backend: listen udp: %w", err)
		}
	}
	return s, nil
}

// EchoAddr returns the TCP echo address, or "" when disabled.
func (s *Server) EchoAddr() string { return listenerAddr(s.echo) }

// BulkAddr returns the TCP bulk address, or "" when disabled.
func (s *Server) BulkAddr() string { return listenerAddr(s.bulk) }

// UDPAddr returns the UDP echo address, or "" when disabled.
func (s *Server) UDPAddr() string {
	if s.udp == nil {
		return ""
	}
	return s.udp.LocalAddr().String()
}

func listenerAddr(l net.Listener) string {
	if l == nil {
		return ""
	}
	return l.Addr().String()
}

// Serve starts the accept and read loops and returns at once. Close stops them.
func (s *Server) Serve() {
	if s.echo != nil {
		s.wg.Add(1)
		go s.acceptLoop(s.echo, serveEcho)
	}
	if s.bulk != nil {
		s.wg.Add(1)
		go s.acceptLoop(s.bulk, serveBulk)
	}
	if s.udp != nil {
		s.wg.Add(1)
		go s.udpEchoLoop()
	}
}

// Close closes the listeners and every open connection, then waits for all
// goroutines to return. It is safe to call more than once.
func (s *Server) Close() error {
	s.mu.Lock()
	s.closed = true
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	s.closeListeners()
	s.wg.Wait()
	return nil
}

func (s *Server) closeListeners() {
	for _, l := range []net.Listener{s.echo, s.bulk} {
		if l != nil {
			l.Close()
		}
	}
	if s.udp != nil {
		s.udp.Close()
	}
}

func (s *Server) acceptLoop(l net.Listener, handle func(net.Conn)) {
	defer s.wg.Done()
	for {
		c, err := l.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			// EMFILE and friends: the client times out, we go on
			// after a pause instead of spinning.
			time.Sleep(acceptRetryDelay)
			continue
		}
		if !s.track(c) {
			c.Close()
			return
		}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			defer s.untrack(c)
			handle(c)
		}()
	}
}

func (s *Server) track(c net.Conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	s.conns[c] = struct{}{}
	return true
}

func (s *Server) untrack(c net.Conn) {
	s.mu.Lock()
	delete(s.conns, c)
	s.mu.Unlock()
	c.Close()
}

// serveEcho writes back whatever it reads. It copies by hand: io.Copy from a
// TCP connection to itself would splice and hold a pipe (two more fds) per
// idle connection, which the idle test cannot afford.
func serveEcho(c net.Conn) {
	buf := make([]byte, echoBufSize)
	for {
		n, err := c.Read(buf)
		if n > 0 {
			if _, werr := c.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// sourceData is written, never modified, by every source connection.
var sourceData = make([]byte, bulkBufSize)

func serveBulk(c net.Conn) {
	var mode [1]byte
	if _, err := io.ReadFull(c, mode[:]); err != nil {
		return
	}
	switch mode[0] {
	case BulkSource:
		for {
			if _, err := c.Write(sourceData); err != nil {
				return
			}
		}
	case BulkSink:
		buf := make([]byte, bulkBufSize)
		for {
			if _, err := c.Read(buf); err != nil {
				return
			}
		}
	}
}

func (s *Server) udpEchoLoop() {
	defer s.wg.Done()
	buf := make([]byte, udpBufSize)
	for {
		n, from, err := s.udp.ReadFromUDPAddrPort(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		// A lost reply is the client's to count.
		s.udp.WriteToUDPAddrPort(buf[:n], from)
	}
}
