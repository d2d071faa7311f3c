package iocopy

import (
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"
)

const (
	dialTimeout      = 5 * time.Second
	acceptRetryDelay = 5 * time.Millisecond
)

// Proxy forwards every connection accepted on one address to one target.
type Proxy struct {
	ln     net.Listener
	target string

	wg sync.WaitGroup // the accept loop and every connection

	mu     sync.Mutex // guards the fields below
	conns  map[net.Conn]struct{}
	closed bool
}

// Listen opens the listening socket; Serve starts forwarding to target.
func Listen(listen, target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return nil, fmt.Errorf("iocopy: listen %s: %w", listen, err)
	}
	return &Proxy{ln: ln, target: target, conns: make(map[net.Conn]struct{})}, nil
}

// Addr returns the listening address.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Serve starts the accept loop and returns at once.
func (p *Proxy) Serve() {
	p.wg.Add(1)
	go p.acceptLoop()
}

// Close stops accepting, closes every connection and waits for the copy
// loops to return. It is safe to call more than once.
func (p *Proxy) Close() error {
	p.mu.Lock()
	p.closed = true
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.ln.Close()
	p.wg.Wait()
	return nil
}

func (p *Proxy) acceptLoop() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			time.Sleep(acceptRetryDelay) // EMFILE: let the client time out
			continue
		}
		p.wg.Add(1)
		go p.forward(c)
	}
}

func (p *Proxy) forward(client net.Conn) {
	defer p.wg.Done()
	if !p.track(client) {
		client.Close()
		return
	}
	defer p.untrack(client)
	server, err := net.DialTimeout("tcp", p.target, dialTimeout)
	if err != nil {
		return
	}
	if !p.track(server) {
		server.Close()
		return
	}
	defer p.untrack(server)

	done := make(chan struct{})
	go func() {
		defer close(done)
		copyHalf(server, client)
	}()
	copyHalf(client, server)
	<-done
}

// copyHalf copies src to dst until EOF, then half-closes dst so the other
// direction can still drain.
func copyHalf(dst, src net.Conn) {
	io.Copy(dst, src)
	if tc, ok := dst.(*net.TCPConn); ok {
		tc.CloseWrite()
	}
}

func (p *Proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *Proxy) untrack(c net.Conn) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
	c.Close()
}
