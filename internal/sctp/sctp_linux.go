package sctp

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The constants x/sys/unix lacks, from <linux/sctp.h> (checked against
// linux-libc-dev 6.1).
const (
	ipprotoSCTP = 132 // IPPROTO_SCTP, also the socket option level SOL_SCTP

	optInitMsg     = 2  // SCTP_INITMSG: struct sctp_initmsg
	optNoDelay     = 3  // SCTP_NODELAY
	optStatus      = 14 // SCTP_STATUS: struct sctp_status
	optRecvRcvInfo = 32 // SCTP_RECVRCVINFO

	cmsgSndInfo = 2 // SCTP_SNDINFO: struct sctp_sndinfo, 16 bytes
	cmsgRcvInfo = 3 // SCTP_RCVINFO: struct sctp_rcvinfo, 28 bytes

	flagUnordered = 1 // SCTP_UNORDERED in snd_flags and rcv_flags

	sizeSndInfo = 16
	sizeRcvInfo = 28
	sizeStatus  = 176

	msgNotification = 0x8000 // MSG_NOTIFICATION
)

// ErrUnsupported is returned where the kernel has no SCTP.
var ErrUnsupported = errors.New("sctp: not supported by this kernel")

// ErrMessageTooLong is returned by ReadMsg when a message does not fit the
// buffer; the rest of it is lost.
var ErrMessageTooLong = errors.New("sctp: message longer than the buffer")

var available = sync.OnceValue(func() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, ipprotoSCTP)
	if err != nil {
		if errors.Is(err, unix.EPROTONOSUPPORT) || errors.Is(err, unix.ESOCKTNOSUPPORT) || errors.Is(err, unix.EAFNOSUPPORT) {
			return fmt.Errorf("%w (socket: %v)", ErrUnsupported, err)
		}
		return fmt.Errorf("sctp: open a probe socket: %w", err)
	}
	unix.Close(fd)
	return nil
})

// Available reports whether this kernel can open SCTP sockets: nil if it
// can, else an error wrapping ErrUnsupported (or why the probe failed). The
// answer is computed once.
func Available() error { return available() }

// Options are set on a socket before its association starts.
type Options struct {
	// OutStreams is the number of outbound streams asked for (the peer may
	// grant fewer). If zero, the kernel's default (10 on Linux).
	OutStreams uint16
	// SendBuffer sets SO_SNDBUF, which also bounds the longest message
	// the socket can send (longer ones fail with EMSGSIZE). With
	// CAP_NET_ADMIN it may exceed net.core.wmem_max (SO_SNDBUFFORCE);
	// without, the kernel caps it there. If zero, the kernel's default.
	// Accepted sockets inherit their listener's.
	SendBuffer int
}

// Info is what SCTP carries beside a message's bytes.
type Info struct {
	Stream    uint16 // stream id
	PPID      uint32 // payload protocol identifier, as sent (network order by convention)
	Unordered bool   // sent for unordered delivery
}

// Listener is a listening one-to-one SCTP socket.
type Listener struct {
	ln   *net.TCPListener // Go's view of it: a TCP listener on the poller
	addr netip.AddrPort
}

// Listen opens a one-to-one SCTP socket listening on addr. An IPv6
// address listens on IPv6 only, as Go's tcp6 listeners do.
func Listen(addr netip.AddrPort, opts Options) (*Listener, error) {
	if err := Available(); err != nil {
		return nil, err
	}
	fd, err := socket(addr.Addr())
	if err != nil {
		return nil, err
	}
	f, err := func() (*os.File, error) {
		if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEADDR, 1); err != nil {
			return nil, fmt.Errorf("SO_REUSEADDR: %w", err)
		}
		if addr.Addr().Is6() && !addr.Addr().Is4In6() {
			if err := unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_V6ONLY, 1); err != nil {
				return nil, fmt.Errorf("IPV6_V6ONLY: %w", err)
			}
		}
		if err := setOptions(fd, opts); err != nil {
			return nil, err
		}
		if err := unix.Bind(fd, sockaddr(addr)); err != nil {
			return nil, os.NewSyscallError("bind", err)
		}
		// The kernel caps the backlog at net.core.somaxconn.
		if err := unix.Listen(fd, 4096); err != nil {
			return nil, os.NewSyscallError("listen", err)
		}
		return os.NewFile(uintptr(fd), "sctp-listener"), nil
	}()
	if err != nil {
		unix.Close(fd)
		return nil, &net.OpError{Op: "listen", Net: "sctp", Addr: net.TCPAddrFromAddrPort(addr), Err: err}
	}
	defer f.Close() // FileListener holds its own duplicate
	nl, err := net.FileListener(f)
	if err != nil {
		return nil, fmt.Errorf("sctp: listen on %s: %w", addr, err)
	}
	ln := nl.(*net.TCPListener)
	return &Listener{ln: ln, addr: addrPort(ln.Addr())}, nil
}

// Accept waits for the next association. Close unblocks it with an error
// wrapping net.ErrClosed.
func (l *Listener) Accept() (*Conn, error) {
	c, err := l.ln.AcceptTCP()
	if err != nil {
		return nil, err
	}
	return Accepted(c)
}

// Accepted makes an association of c, a socket accepted on a Listener's
// descriptor (see SyscallConn), as Accept does; it closes c if it cannot.
// Its options are set again: not every kernel copies them from the
// listener. Dial sets them before connecting.
func Accepted(c *net.TCPConn) (*Conn, error) {
	var serr error
	err := withFD(c, func(fd int) { serr = setOptions(fd, Options{}) })
	if err == nil {
		err = serr
	}
	var sc *Conn
	if err == nil {
		sc, err = newConn(c)
	}
	if err != nil {
		c.Close()
		return nil, err
	}
	return sc, nil
}

// withFD runs f with c's descriptor.
func withFD(c *net.TCPConn, f func(fd int)) error {
	rc, err := c.SyscallConn()
	if err != nil {
		return err
	}
	return rc.Control(func(fd uintptr) { f(int(fd)) })
}

// SyscallConn returns the listening socket's raw connection; only its
// Control works, as for a net.TCPListener.
func (l *Listener) SyscallConn() (syscall.RawConn, error) { return l.ln.SyscallConn() }

// Addr returns the address the listener is bound to.
func (l *Listener) Addr() netip.AddrPort { return l.addr }

// Close stops listening.
func (l *Listener) Close() error { return l.ln.Close() }

// Conn is one SCTP association on a one-to-one socket. Read and Write see
// it as a byte stream (each Write is one message on stream 0); ReadMsg and
// WriteMsg keep message boundaries, stream ids and PPIDs.
type Conn struct {
	c  *net.TCPConn // Go's view of it; never used for CloseWrite or splice
	rc syscall.RawConn

	rmu   sync.Mutex // guards roob; serialises ReadMsg
	roob  [64]byte
	laddr netip.AddrPort
	raddr netip.AddrPort
}

func newConn(c *net.TCPConn) (*Conn, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return nil, err
	}
	return &Conn{c: c, rc: rc, laddr: addrPort(c.LocalAddr()), raddr: addrPort(c.RemoteAddr())}, nil
}

// Dial opens an association to raddr. It returns when the association is
// up, when it fails, or when ctx ends (its deadline bounds the handshake).
func Dial(ctx context.Context, raddr netip.AddrPort, opts Options) (*Conn, error) {
	if err := Available(); err != nil {
		return nil, err
	}
	opErr := func(err error) error {
		return &net.OpError{Op: "dial", Net: "sctp", Addr: net.TCPAddrFromAddrPort(raddr), Err: err}
	}
	fd, err := socket(raddr.Addr())
	if err != nil {
		return nil, opErr(err)
	}
	if err := setOptions(fd, opts); err != nil {
		unix.Close(fd)
		return nil, opErr(err)
	}
	if err := unix.Connect(fd, sockaddr(raddr)); err != nil && err != unix.EINPROGRESS {
		unix.Close(fd)
		return nil, opErr(os.NewSyscallError("connect", err))
	}
	f := os.NewFile(uintptr(fd), "sctp")
	nc, err := net.FileConn(f)
	f.Close()
	if err != nil {
		return nil, opErr(err)
	}
	tc := nc.(*net.TCPConn)
	if err := waitConnected(ctx, tc); err != nil {
		tc.Close()
		return nil, opErr(err)
	}
	c, err := newConn(tc)
	if err != nil {
		tc.Close()
		return nil, opErr(err)
	}
	return c, nil
}

// waitConnected waits for a non-blocking connect to end. An SCTP socket
// polls writable only once its association is up, and reports a failed one
// through SO_ERROR.
func waitConnected(ctx context.Context, c *net.TCPConn) error {
	if d, ok := ctx.Deadline(); ok {
		_ = c.SetWriteDeadline(d)
	}
	stop := context.AfterFunc(ctx, func() { _ = c.SetWriteDeadline(time.Unix(1, 0)) })
	defer stop()
	rc, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var cerr error
	err = rc.Write(func(fd uintptr) bool {
		v, err := unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_ERROR)
		switch {
		case err != nil:
			cerr = os.NewSyscallError("getsockopt", err)
		case v != 0:
			cerr = os.NewSyscallError("connect", syscall.Errno(v))
		default:
			if _, err := unix.Getpeername(int(fd)); err != nil {
				return false // still in progress
			}
		}
		return true
	})
	if err != nil {
		if ctx.Err() != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
			return ctx.Err()
		}
		return err
	}
	if cerr != nil {
		return cerr
	}
	return c.SetWriteDeadline(time.Time{})
}

// ReadMsg reads one whole message into b. It returns io.EOF when the peer
// has shut the association down, and ErrMessageTooLong, with b full, when
// the message does not fit.
func (c *Conn) ReadMsg(b []byte) (int, Info, error) {
	c.rmu.Lock()
	defer c.rmu.Unlock()
	n := 0
	for {
		var (
			m   int
			eor bool
			rcv Info
			rer error
		)
		err := c.rc.Read(func(fd uintptr) bool {
			m, rcv, eor, rer = Recv(int(fd), b[n:], c.roob[:])
			return rer != unix.EAGAIN
		})
		if err == nil {
			err = rer
		}
		if err != nil {
			return n, rcv, c.wrap("read", err)
		}
		if m == 0 && !eor {
			if n == 0 {
				return 0, rcv, io.EOF
			}
			return n, rcv, io.ErrUnexpectedEOF
		}
		n += m
		if eor {
			return n, rcv, nil
		}
		if n == len(b) {
			return n, rcv, ErrMessageTooLong
		}
	}
}

// RawRead runs f with the socket's descriptor until f returns true,
// waiting for readability while it returns false; f should return false
// only when Recv failed with EAGAIN. It honours the read deadline and
// Close, like ReadMsg, and lets a caller choose its buffer only once data
// is there.
func (c *Conn) RawRead(f func(fd int) bool) error {
	return c.wrap("read", c.rc.Read(func(fd uintptr) bool { return f(int(fd)) }))
}

// Recv is one recvmsg(2) on an SCTP socket that has SCTP_RECVRCVINFO on
// (every Conn has): it returns the bytes read, the message's info, and
// whether they end the message. Notifications are skipped (none are
// subscribed). n 0 with eor false and no error is the peer's shutdown. oob needs room for one SCTP_RCVINFO
// (64 bytes is plenty).
func Recv(fd int, b, oob []byte) (n int, info Info, eor bool, err error) {
	for {
		n, oobn, flags, _, err := unix.Recvmsg(fd, b, oob, 0)
		if err != nil {
			return 0, Info{}, false, err
		}
		if flags&msgNotification != 0 {
			continue // none are subscribed; never relay one
		}
		return n, parseRcvInfo(oob[:oobn]), flags&unix.MSG_EOR != 0, nil
	}
}

func parseRcvInfo(oob []byte) Info {
	for len(oob) >= unix.SizeofCmsghdr {
		h := (*unix.Cmsghdr)(unsafe.Pointer(&oob[0]))
		if h.Len < unix.SizeofCmsghdr || int(h.Len) > len(oob) {
			break
		}
		data := oob[unix.CmsgLen(0):h.Len]
		if h.Level == ipprotoSCTP && h.Type == cmsgRcvInfo && len(data) >= sizeRcvInfo {
			return Info{
				Stream:    binary.NativeEndian.Uint16(data[0:]),
				Unordered: binary.NativeEndian.Uint16(data[4:])&flagUnordered != 0,
				PPID:      binary.NativeEndian.Uint32(data[8:]),
			}
		}
		oob = oob[min(unix.CmsgSpace(int(h.Len)-unix.CmsgLen(0)), len(oob)):]
	}
	return Info{}
}

// WriteMsg sends b as one message with info's stream id, PPID and
// ordering. The whole message is accepted or none of it; a full send
// buffer waits (within the write deadline).
func (c *Conn) WriteMsg(b []byte, info Info) (int, error) {
	var oob [unix.SizeofCmsghdr + sizeSndInfo]byte
	h := (*unix.Cmsghdr)(unsafe.Pointer(&oob[0]))
	h.Level, h.Type = ipprotoSCTP, cmsgSndInfo
	h.SetLen(unix.CmsgLen(sizeSndInfo))
	data := oob[unix.CmsgLen(0):]
	binary.NativeEndian.PutUint16(data[0:], info.Stream)
	if info.Unordered {
		binary.NativeEndian.PutUint16(data[2:], flagUnordered)
	}
	binary.NativeEndian.PutUint32(data[4:], info.PPID)
	var (
		n   int
		wer error
	)
	err := c.rc.Write(func(fd uintptr) bool {
		n, wer = unix.SendmsgN(int(fd), b, oob[:], nil, unix.MSG_NOSIGNAL)
		return wer != unix.EAGAIN
	})
	if err == nil {
		err = wer
	}
	if err != nil {
		return 0, c.wrap("write", err)
	}
	return n, nil
}

// Read reads message bytes as a stream, across message boundaries.
func (c *Conn) Read(b []byte) (int, error) { return c.c.Read(b) }

// Write sends b as one message on stream 0 with PPID 0.
func (c *Conn) Write(b []byte) (int, error) { return c.WriteMsg(b, Info{}) }

// Streams returns the association's negotiated inbound and outbound stream
// counts.
func (c *Conn) Streams() (in, out uint16, err error) {
	var st [sizeStatus]byte
	var serr error
	err = c.rc.Control(func(fd uintptr) {
		l := uint32(len(st))
		_, _, e := unix.Syscall6(unix.SYS_GETSOCKOPT, fd, ipprotoSCTP, optStatus, uintptr(unsafe.Pointer(&st[0])), uintptr(unsafe.Pointer(&l)), 0)
		if e != 0 {
			serr = os.NewSyscallError("getsockopt SCTP_STATUS", e)
		}
	})
	if err == nil {
		err = serr
	}
	if err != nil {
		return 0, 0, err
	}
	return binary.NativeEndian.Uint16(st[16:]), binary.NativeEndian.Uint16(st[18:]), nil
}

// Close ends the association gracefully: data already written is
// delivered, then SHUTDOWN.
func (c *Conn) Close() error { return c.c.Close() }

// SyscallConn returns the association's socket, for its descriptor.
func (c *Conn) SyscallConn() (syscall.RawConn, error) { return c.rc, nil }

// Abort ends the association at once with an ABORT chunk (SO_LINGER 0),
// so the peer learns of a failure and nothing lingers.
func (c *Conn) Abort() error {
	_ = c.c.SetLinger(0)
	return c.c.Close()
}

// LocalAddr and RemoteAddr are the association's primary addresses.
func (c *Conn) LocalAddr() netip.AddrPort  { return c.laddr }
func (c *Conn) RemoteAddr() netip.AddrPort { return c.raddr }

// SetDeadline, SetReadDeadline and SetWriteDeadline work as on net.Conn.
func (c *Conn) SetDeadline(t time.Time) error      { return c.c.SetDeadline(t) }
func (c *Conn) SetReadDeadline(t time.Time) error  { return c.c.SetReadDeadline(t) }
func (c *Conn) SetWriteDeadline(t time.Time) error { return c.c.SetWriteDeadline(t) }

func (c *Conn) wrap(op string, err error) error {
	if err == nil {
		return nil
	}
	if errno, ok := err.(syscall.Errno); ok {
		err = os.NewSyscallError(op, errno)
	}
	return &net.OpError{Op: op, Net: "sctp", Source: net.TCPAddrFromAddrPort(c.laddr), Addr: net.TCPAddrFromAddrPort(c.raddr), Err: err}
}

func socket(a netip.Addr) (int, error) {
	family := unix.AF_INET
	if a.Is6() && !a.Is4In6() {
		family = unix.AF_INET6
	}
	fd, err := unix.Socket(family, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, ipprotoSCTP)
	if err != nil {
		return -1, os.NewSyscallError("socket", err)
	}
	return fd, nil
}

func setOptions(fd int, opts Options) error {
	if err := unix.SetsockoptInt(fd, ipprotoSCTP, optRecvRcvInfo, 1); err != nil {
		return os.NewSyscallError("setsockopt SCTP_RECVRCVINFO", err)
	}
	if err := unix.SetsockoptInt(fd, ipprotoSCTP, optNoDelay, 1); err != nil {
		return os.NewSyscallError("setsockopt SCTP_NODELAY", err)
	}
	if opts.SendBuffer > 0 {
		if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, opts.SendBuffer); err != nil {
			if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUF, opts.SendBuffer); err != nil {
				return os.NewSyscallError("setsockopt SO_SNDBUF", err)
			}
		}
	}
	if opts.OutStreams > 0 {
		// struct sctp_initmsg: num_ostreams, max_instreams, max_attempts,
		// max_init_timeo, all u16; zero keeps the kernel's value.
		var init [8]byte
		binary.NativeEndian.PutUint16(init[0:], opts.OutStreams)
		_, _, e := unix.Syscall6(unix.SYS_SETSOCKOPT, uintptr(fd), ipprotoSCTP, optInitMsg, uintptr(unsafe.Pointer(&init[0])), uintptr(len(init)), 0)
		if e != 0 {
			return os.NewSyscallError("setsockopt SCTP_INITMSG", e)
		}
	}
	return nil
}

func sockaddr(ap netip.AddrPort) unix.Sockaddr {
	a := ap.Addr()
	if a.Is4() || a.Is4In6() {
		return &unix.SockaddrInet4{Port: int(ap.Port()), Addr: a.Unmap().As4()}
	}
	sa := &unix.SockaddrInet6{Port: int(ap.Port()), Addr: a.As16()}
	if z := a.Zone(); z != "" {
		if ifi, err := net.InterfaceByName(z); err == nil {
			sa.ZoneId = uint32(ifi.Index)
		}
	}
	return sa
}

func addrPort(a net.Addr) netip.AddrPort {
	if ta, ok := a.(*net.TCPAddr); ok {
		ap := ta.AddrPort()
		return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
	}
	return netip.AddrPort{}
}
