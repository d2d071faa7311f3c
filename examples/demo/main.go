// Command demo runs the backends of the bundled example (examples/demo.yaml)
// and, for the scripted tour, a small UDP client.
//
//	demo backends                 # HTTP on 127.0.0.1:18081-18083, UDP echo on :18091-18092
//	demo udp 127.0.0.1:30053 10   # send 10 datagrams, print each reply
package main

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"sync"
	"syscall"
	"time"
)

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	switch os.Args[1] {
	case "backends":
		if err := backends(); err != nil {
			fmt.Fprintln(os.Stderr, "demo backends:", err)
			os.Exit(1)
		}
	case "udp":
		if len(os.Args) != 4 {
			usage()
		}
		n, err := strconv.Atoi(os.Args[3])
		if err != nil || n < 1 || n > 10000 {
			fmt.Fprintln(os.Stderr, "demo udp: count must be 1-10000")
			os.Exit(2)
		}
		if err := udpClient(os.Args[2], n); err != nil {
			fmt.Fprintln(os.Stderr, "demo udp:", err)
			os.Exit(1)
		}
	default:
		usage()
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: demo backends | demo udp ADDR COUNT")
	os.Exit(2)
}

// backends serves three HTTP backends and two UDP echo backends on
// loopback until SIGINT or SIGTERM.
func backends() error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var wg sync.WaitGroup
	var servers []*http.Server
	for i, port := range []int{18081, 18082, 18083} {
		name := fmt.Sprintf("web-%d", i+1)
		addr := fmt.Sprintf("127.0.0.1:%d", port)
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		srv := &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			fmt.Fprintf(w, "hello from %s (%s), reached from %s (the proxy)\n", name, addr, r.RemoteAddr)
		})}
		servers = append(servers, srv)
		wg.Add(1)
		go func() { defer wg.Done(); srv.Serve(ln) }()
	}
	var conns []*net.UDPConn
	for i, port := range []int{18091, 18092} {
		name := fmt.Sprintf("udp-%d", i+1)
		c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: port})
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		conns = append(conns, c)
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, 65535)
			for {
				n, from, err := c.ReadFromUDPAddrPort(buf)
				if err != nil {
					return
				}
				c.WriteToUDPAddrPort(fmt.Appendf(nil, "%s: %s", name, buf[:n]), from)
			}
		}()
	}
	fmt.Println("demo backends: HTTP web-1..3 on 127.0.0.1:18081-18083, UDP udp-1..2 on 127.0.0.1:18091-18092")
	<-ctx.Done()
	for _, s := range servers {
		s.Close()
	}
	for _, c := range conns {
		c.Close()
	}
	wg.Wait()
	return nil
}

// udpClient sends n datagrams, each from a new socket (a new client, so a
// new session), and prints each reply.
func udpClient(addr string, n int) error {
	for i := range n {
		c, err := net.Dial("udp", addr)
		if err != nil {
			return err
		}
		fmt.Fprintf(c, "ping %d", i+1)
		c.SetReadDeadline(time.Now().Add(2 * time.Second))
		buf := make([]byte, 2048)
		m, err := c.Read(buf)
		c.Close()
		if err != nil {
			return fmt.Errorf("datagram %d: %w", i+1, err)
		}
		fmt.Println(string(buf[:m]))
	}
	return nil
}
