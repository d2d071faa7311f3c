package userspace

import "sync/atomic"

// Stats counts what the data plane did since the Proxier started. All
// fields are safe for concurrent use; read them with Stats.Snapshot.
type Stats struct {
	TCPAccepted       atomic.Uint64 // client connections taken from listening sockets, the shed and refused ones too
	TCPActive         atomic.Int64  // proxied connections open now
	TCPNoEndpoints    atomic.Uint64 // connections reset because the port had no endpoints
	TCPDialFailures   atomic.Uint64 // failed dials to endpoints (each attempt)
	TCPDialGiveUps    atomic.Uint64 // connections reset after every dial attempt failed
	Shed              atomic.Uint64 // connections or sessions refused for lack of file descriptors or buffers
	AcceptErrors      atomic.Uint64 // other accept errors
	HalfCloseTimeouts atomic.Uint64 // connections ended because a half-closed side stayed silent too long, or a reader took nothing for finDrainStall after the other side failed past its FIN
	BytesToBackend    atomic.Uint64 // TCP bytes sent to endpoints
	BytesToClient     atomic.Uint64 // TCP bytes sent to clients

	SCTPAccepted     atomic.Uint64 // client associations taken from listening sockets, the shed and refused ones too
	SCTPActive       atomic.Int64  // proxied association pairs open now
	SCTPNoEndpoints  atomic.Uint64 // associations aborted because the port had no endpoints
	SCTPDialFailures atomic.Uint64 // failed associations to endpoints (each attempt)
	SCTPDialGiveUps  atomic.Uint64 // associations aborted after every attempt failed
	SCTPBytesIn      atomic.Uint64 // SCTP message bytes sent to endpoints
	SCTPBytesOut     atomic.Uint64 // SCTP message bytes sent to clients

	UDPSessionsOpened   atomic.Uint64 // UDP sessions created
	UDPSessionsActive   atomic.Int64  // UDP sessions open now
	UDPSessionsRejected atomic.Uint64 // datagrams dropped because the session cap was reached
	UDPNoEndpoints      atomic.Uint64 // datagrams dropped because the port had no endpoints
	UDPDatagramsIn      atomic.Uint64 // client datagrams sent to endpoints, each time: one sent again to another endpoint after a refusal counts twice
	UDPDatagramsOut     atomic.Uint64 // endpoint datagrams sent back to clients
	UDPDropped          atomic.Uint64 // datagrams dropped on a full socket buffer or send error
	UDPRefused          atomic.Uint64 // endpoint refusals (ICMP port unreachable): the session moved (no reply yet) or ended
	UDPBytesIn          atomic.Uint64 // bytes of the datagrams in UDPDatagramsIn, resends too
	UDPBytesOut         atomic.Uint64 // bytes of the datagrams in UDPDatagramsOut

	SourceRefused atomic.Uint64 // connections reset and datagrams dropped: their source is outside loadBalancerSourceRanges (the kernel's drops by a socket filter are not seen)
}

// StatsSnapshot is a copy of Stats at one moment.
type StatsSnapshot struct {
	TCPAccepted, TCPNoEndpoints, TCPDialFailures, TCPDialGiveUps     uint64
	TCPActive                                                        int64
	Shed, AcceptErrors, HalfCloseTimeouts                            uint64
	BytesToBackend, BytesToClient                                    uint64
	SCTPAccepted, SCTPNoEndpoints, SCTPDialFailures, SCTPDialGiveUps uint64
	SCTPActive                                                       int64
	SCTPBytesIn, SCTPBytesOut, UDPBytesIn, UDPBytesOut               uint64
	UDPSessionsOpened, UDPSessionsRejected, UDPNoEndpoints           uint64
	UDPSessionsActive                                                int64
	UDPDatagramsIn, UDPDatagramsOut, UDPDropped, UDPRefused          uint64
	SourceRefused                                                    uint64
}

// Snapshot copies the counters.
func (s *Stats) Snapshot() StatsSnapshot {
	return StatsSnapshot{
		TCPAccepted:         s.TCPAccepted.Load(),
		TCPActive:           s.TCPActive.Load(),
		TCPNoEndpoints:      s.TCPNoEndpoints.Load(),
		TCPDialFailures:     s.TCPDialFailures.Load(),
		TCPDialGiveUps:      s.TCPDialGiveUps.Load(),
		Shed:                s.Shed.Load(),
		AcceptErrors:        s.AcceptErrors.Load(),
		HalfCloseTimeouts:   s.HalfCloseTimeouts.Load(),
		BytesToBackend:      s.BytesToBackend.Load(),
		BytesToClient:       s.BytesToClient.Load(),
		SCTPAccepted:        s.SCTPAccepted.Load(),
		SCTPActive:          s.SCTPActive.Load(),
		SCTPNoEndpoints:     s.SCTPNoEndpoints.Load(),
		SCTPDialFailures:    s.SCTPDialFailures.Load(),
		SCTPDialGiveUps:     s.SCTPDialGiveUps.Load(),
		SCTPBytesIn:         s.SCTPBytesIn.Load(),
		SCTPBytesOut:        s.SCTPBytesOut.Load(),
		UDPBytesIn:          s.UDPBytesIn.Load(),
		UDPBytesOut:         s.UDPBytesOut.Load(),
		UDPSessionsOpened:   s.UDPSessionsOpened.Load(),
		UDPSessionsActive:   s.UDPSessionsActive.Load(),
		UDPSessionsRejected: s.UDPSessionsRejected.Load(),
		UDPNoEndpoints:      s.UDPNoEndpoints.Load(),
		UDPDatagramsIn:      s.UDPDatagramsIn.Load(),
		UDPDatagramsOut:     s.UDPDatagramsOut.Load(),
		UDPDropped:          s.UDPDropped.Load(),
		UDPRefused:          s.UDPRefused.Load(),
		SourceRefused:       s.SourceRefused.Load(),
	}
}
